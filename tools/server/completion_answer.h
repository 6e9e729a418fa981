// CompletionAnswer: one completion request's answer, written as the engine thread produces
// it: a whole JSON response when the request ends, or server-sent events (a chunk per piece
// of text, the last with its finish_reason, the usage when asked for, then `data: [DONE]`).
// No thread waits on a request: the engine's callbacks write to the request's Exchange, and
// a client that goes away ends its request at the engine's next step (the Exchange's on_gone,
// or a token callback that finds it gone). Every stream ends with its final chunk and
// [DONE], also when the server stops (the engine ends every request) or the request fails.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "engine/batch_engine.h"
#include "http_transport.h"
#include "openai_api.h"
#include "request_stream.h"
#include "tool_calls.h"

namespace sluice::server {

class CompletionAnswer {
 public:
  // count(status): the answer's status, once, for the metrics; headers: added to the answer's
  // (CORS).
  CompletionAnswer(std::shared_ptr<Exchange> exchange, const Tokenizer& tokenizer, const ParsedRequest& request,
                   ResponseIds ids, std::function<void(int)> count, HeaderList headers = {});

  // Engine thread: a generated token; false ends the request (a stop string, or the client left).
  bool on_token(int32_t id);
  // Engine thread: the request ended.
  void on_done(const CompletionResult& result);
  // The request is queued (after BatchEngine::submit): a stream's head and first chunk go out,
  // with whatever the engine produced meanwhile.
  void begin();

 private:
  // The stream's closing events: the held-back text, the finish (or tool calls, or an error),
  // the usage, [DONE].
  std::string stream_tail(const CompletionResult& r, const std::string& held);
  void write(const std::string& sse_bytes);  // under mu_

  std::shared_ptr<Exchange> ex_;
  RequestStream text_;
  const Endpoint endpoint_;
  const bool stream_, include_usage_;
  ResponseIds ids_;
  std::function<void(int)> count_;
  HeaderList headers_;
  std::optional<ToolCallStream> calls_;  // a chat offered tools: <tool_call> blocks become tool_calls

  std::mutex mu_;
  bool begun_ = false;       // under mu_: the stream's head is out
  bool ended_ = false;       // under mu_: the stream's end is out (or waits for begin)
  std::string before_begin_; // under mu_: events produced before begin()
  std::string reply_;        // engine thread: a non-streamed answer's text so far
};

}  // namespace sluice::server
