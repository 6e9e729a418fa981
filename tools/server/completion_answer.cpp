// CompletionAnswer and OpenAiReply (completion_answer.h).
#include "completion_answer.h"

namespace sluice::server {

using nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

ApiError server_error(const std::string& message) {
  ApiError e;
  e.status = 500;
  e.message = message;
  e.type = "server_error";
  return e;
}

}  // namespace

// ---- OpenAiReply ----

OpenAiReply::OpenAiReply(const ParsedRequest& request, ResponseIds ids, const Generation& gen)
    : ids_(std::move(ids)), endpoint_(request.endpoint), include_usage_(request.include_usage), gen_(gen) {
  if (gen_.parse_reply) reply_.emplace(gen_.format, gen_.reply_options);
}

std::string OpenAiReply::stream_begin() {
  // The role comes first, as OpenAI sends it.
  return endpoint_ == Endpoint::chat ? sse(stream_chunk(ids_, endpoint_, "", true, std::nullopt)) : std::string();
}

std::string OpenAiReply::events(const ReplyStream::Delta& d) {
  std::string out;
  if (!d.reasoning.empty()) out += sse(stream_reasoning_chunk(ids_, d.reasoning));
  if (!d.content.empty()) out += sse(stream_chunk(ids_, endpoint_, d.content, false, std::nullopt));
  if (!d.calls.empty()) out += sse(stream_tool_calls_chunk(ids_, d.calls, reply_->calls_emitted() - d.calls.size()));
  return out;
}

std::string OpenAiReply::stream_text(const std::string& text) {
  if (reply_) return events(reply_->push(text));
  return text.empty() ? std::string() : sse(stream_chunk(ids_, endpoint_, text, false, std::nullopt));
}

std::string OpenAiReply::stream_end(const CompletionResult& r, const std::string&) {
  std::string out;
  if (reply_) out += events(reply_->finish());
  if (r.reason == FinishReason::error) out += sse(server_error(r.error).to_json());
  else if (reply_ && reply_->calls_emitted() > 0) out += sse(stream_tool_calls_end(ids_));
  else out += sse(stream_chunk(ids_, endpoint_, "", false, r.reason));
  if (include_usage_) out += sse(stream_usage_chunk(ids_, endpoint_, r));
  return out + "data: [DONE]\n\n";
}

std::pair<int, std::string> OpenAiReply::whole(const CompletionResult& r, const std::string& text, const std::string&) {
  if (r.reason == FinishReason::error) return {500, dump(server_error(r.error).to_json())};
  if (gen_.parse_reply) {
    const ParsedReply reply = parse_reply(gen_.format, text, gen_.reply_options);
    return {200, dump(completion_response(ids_, endpoint_, reply.content, r, reply.calls, reply.reasoning))};
  }
  return {200, dump(completion_response(ids_, endpoint_, text, r))};
}

// ---- CompletionAnswer ----

CompletionAnswer::CompletionAnswer(std::shared_ptr<Exchange> exchange, const Tokenizer& tokenizer,
                                   std::vector<std::string> stops, bool skip_special, bool stream,
                                   std::unique_ptr<ReplyWriter> writer, std::function<void(int)> count, HeaderList headers)
    : ex_(std::move(exchange)),
      text_(tokenizer, std::move(stops), skip_special),
      stream_(stream),
      writer_(std::move(writer)),
      count_(std::move(count)),
      headers_(std::move(headers)) {
  if (stream_) first_events_ = writer_->stream_begin();
}

void CompletionAnswer::write(const std::string& bytes) {
  if (bytes.empty()) return;
  if (begun_) ex_->write(bytes);
  else before_begin_ += bytes;
}

bool CompletionAnswer::on_token(int32_t id) {
  const std::string piece = text_.push(id);
  if (!stream_) {
    reply_ += piece;
  } else if (const std::string events = writer_->stream_text(piece); !events.empty()) {
    std::lock_guard<std::mutex> lk(mu_);
    write(events);
  }
  return !text_.stopped() && !ex_->gone();
}

void CompletionAnswer::on_done(const CompletionResult& r) {
  const std::string held = text_.finish();
  const std::string stop = text_.stop_matched();
  if (stream_) {
    const std::string tail = writer_->stream_text(held) + writer_->stream_end(r, stop);
    std::lock_guard<std::mutex> lk(mu_);
    write(tail);
    ended_ = true;
    if (begun_) ex_->end_stream();
    return;
  }
  const auto [status, body] = writer_->whole(r, reply_ + held, stop);
  count_(status);
  ex_->respond(status, "application/json", body, headers_);
}

void CompletionAnswer::begin() {
  if (!stream_) return;
  std::lock_guard<std::mutex> lk(mu_);
  begun_ = true;
  count_(200);
  // The connection closes after the stream (its chunked end first): the openai npm client's
  // default transport (node-fetch 2 with a keep-alive agent) on Node 18 reports every chunked
  // answer on a connection kept for reuse as "Premature close", whatever its framing; a stream
  // on a connection that then closes it reads whole. A stream is seconds of decoding: a new
  // connection for the next request costs nothing beside it.
  HeaderList h = {{"Cache-Control", "no-cache"}};
  h.insert(h.end(), headers_.begin(), headers_.end());
  ex_->begin_stream(200, "text/event-stream", h, false);
  ex_->write(first_events_ + before_begin_);
  before_begin_.clear();
  if (ended_) ex_->end_stream();
}

}  // namespace sluice::server
