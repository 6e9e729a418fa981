// CompletionAnswer: one generation's answer, written as the engine thread produces it: a
// whole response when the request ends, or a stream of server-sent events. What the answer
// says is its API's (a ReplyWriter: OpenAI's chunks and responses, OpenAiReply below, or
// Anthropic's events and messages, anthropic_api.h); how it reaches the client is the same
// for both. No thread waits on a request: the engine's callbacks write to the request's
// Exchange, and a client that goes away ends its request at the engine's next step (the
// Exchange's on_gone, or a token callback that finds it gone). Every stream ends with its
// closing events, also when the server stops (the engine ends every request) or the request
// fails.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/batch_engine.h"
#include "http_transport.h"
#include "openai_api.h"
#include "reply_formats.h"
#include "request_stream.h"

namespace sluice::server {

// What a reply's writer knows of its generation: how the reply is read (a chat of a model
// with a reply format: reasoning and tool calls split from the content) and the prompt's size.
struct Generation {
  int64_t prompt_tokens = 0;
  bool parse_reply = false;
  ReplyFormat format = ReplyFormat::hermes;
  ReplyOptions reply_options;
};

// How an API writes a generation's answer. Called on one thread at a time: stream_begin
// before the request is queued, the rest on the engine thread.
class ReplyWriter {
 public:
  virtual ~ReplyWriter() = default;
  // A stream's first events (OpenAI chat: the role; Anthropic: message_start and a ping).
  virtual std::string stream_begin() = 0;
  // The events of text the reply adds (may be none).
  virtual std::string stream_text(const std::string& text) = 0;
  // A stream's closing events: the end (the finish reason, tool calls, or the error), the
  // usage. stop: the stop string that ended the reply, or "".
  virtual std::string stream_end(const CompletionResult& r, const std::string& stop) = 0;
  // The answer of a request that does not stream: its status and JSON body.
  virtual std::pair<int, std::string> whole(const CompletionResult& r, const std::string& text,
                                            const std::string& stop) = 0;
};

// Makes a request's writer once its generation is known (ServeContext::start).
using WriterFactory = std::function<std::unique_ptr<ReplyWriter>(const Generation&)>;

// OpenAI's answer to a completion or a chat: server-sent chunks (reasoning as
// delta.reasoning_content, content as it comes, each tool call once complete, the last chunk
// with its finish_reason, the usage when asked for, then `data: [DONE]`) or the response.
class OpenAiReply : public ReplyWriter {
 public:
  OpenAiReply(const ParsedRequest& request, ResponseIds ids, const Generation& gen);

  std::string stream_begin() override;
  std::string stream_text(const std::string& text) override;
  std::string stream_end(const CompletionResult& r, const std::string& stop) override;
  std::pair<int, std::string> whole(const CompletionResult& r, const std::string& text, const std::string& stop) override;

 private:
  std::string events(const ReplyStream::Delta& d);

  ResponseIds ids_;
  const Endpoint endpoint_;
  const bool include_usage_;
  const Generation gen_;
  std::optional<ReplyStream> reply_;  // gen_.parse_reply
};

class CompletionAnswer {
 public:
  // stops, skip_special: the RequestStream's (request_stream.h); count(status): the answer's
  // status, once, for the metrics; headers: added to the answer's (CORS).
  CompletionAnswer(std::shared_ptr<Exchange> exchange, const Tokenizer& tokenizer, std::vector<std::string> stops,
                   bool skip_special, bool stream, std::unique_ptr<ReplyWriter> writer, std::function<void(int)> count,
                   HeaderList headers = {});

  // Engine thread: a generated token; false ends the request (a stop string, or the client left).
  bool on_token(int32_t id);
  // Engine thread: the request ended.
  void on_done(const CompletionResult& result);
  // The request is queued (after BatchEngine::submit): a stream's head and first events go
  // out, with whatever the engine produced meanwhile.
  void begin();

 private:
  void write(const std::string& sse_bytes);  // under mu_

  std::shared_ptr<Exchange> ex_;
  RequestStream text_;
  const bool stream_;
  std::unique_ptr<ReplyWriter> writer_;
  std::function<void(int)> count_;
  HeaderList headers_;
  std::string first_events_;  // the writer's stream_begin, made before the request is queued

  std::mutex mu_;
  bool begun_ = false;        // under mu_: the stream's head is out
  bool ended_ = false;        // under mu_: the stream's end is out (or waits for begin)
  std::string before_begin_;  // under mu_: events produced before begin()
  std::string reply_;         // engine thread: a non-streamed answer's text so far
};

}  // namespace sluice::server
