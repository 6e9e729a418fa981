// RequestStream: the hand-over between the engine thread, which produces a request's text
// (tokens decoded, cut at stop strings), and the HTTP thread that answers the client. The
// engine thread pushes pieces and the end; the HTTP thread waits for them with a timeout (so
// it can probe a streaming client while a request waits) and may close the stream when the
// client went away, which makes the engine's token callback end the request.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "engine/batch_engine.h"
#include "format/tokenizer.h"
#include "stop_strings.h"

namespace sluice::server {

class RequestStream {
 public:
  // skip_special: special tokens print nothing (reply formats whose markers are special
  // tokens keep them: reply_formats.h).
  RequestStream(const Tokenizer& tokenizer, std::vector<std::string> stops, bool skip_special = true)
      : decoder_(tokenizer, skip_special), stops_(std::move(stops)) {}

  // Engine thread: a generated token; false ends the request (a stop string was reached, or
  // the client went away).
  bool on_token(int32_t id);
  // Engine thread: the request ended (any reason); the held-back text goes out first.
  void on_done(const CompletionResult& result);

  struct Event {
    std::string text;                       // text to send (may be empty)
    std::optional<CompletionResult> done;   // set on the last event
  };
  // HTTP thread: the text that arrived since the last call (joined) and the end when it came;
  // nullopt after `wait` with nothing new.
  std::optional<Event> next(std::chrono::milliseconds wait);
  // HTTP thread: the client is gone; the next token ends the request.
  void close();
  bool closed() const;
  // The stop string that ended the request, or "" (read after the last event).
  std::string stop_matched() const;

 private:
  StreamDecoder decoder_;
  StopStrings stops_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;                       // under mu_: produced, not yet taken
  std::optional<CompletionResult> done_;   // under mu_
  bool closed_ = false;                    // under mu_
};

}  // namespace sluice::server
