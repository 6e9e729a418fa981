// CompletionAnswer (completion_answer.h).
#include "completion_answer.h"

namespace sluice::server {

using nlohmann::json;

namespace {

std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

CompletionAnswer::CompletionAnswer(std::shared_ptr<Exchange> exchange, const Tokenizer& tokenizer,
                                   const ParsedRequest& request, ResponseIds ids, std::function<void(int)> count,
                                   HeaderList headers)
    : ex_(std::move(exchange)),
      text_(tokenizer, request.stop),
      endpoint_(request.endpoint),
      stream_(request.stream),
      include_usage_(request.include_usage),
      ids_(std::move(ids)),
      count_(std::move(count)),
      headers_(std::move(headers)) {
  if (endpoint_ == Endpoint::chat && !request.tools.is_null() && !request.tool_choice_none) calls_.emplace();
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
  } else {
    const std::string content = calls_ ? calls_->push(piece) : piece;
    if (!content.empty()) {
      const std::string event = sse(stream_chunk(ids_, endpoint_, content, false, std::nullopt));
      std::lock_guard<std::mutex> lk(mu_);
      write(event);
    }
  }
  return !text_.stopped() && !ex_->gone();
}

std::string CompletionAnswer::stream_tail(const CompletionResult& r, const std::string& held) {
  std::string tail;
  ParsedReply reply;
  if (calls_) {
    reply.content = calls_->push(held);
    ParsedReply end = calls_->finish();
    reply.content += end.content;
    reply.calls = std::move(end.calls);
  } else {
    reply.content = held;
  }
  if (!reply.content.empty()) tail += sse(stream_chunk(ids_, endpoint_, reply.content, false, std::nullopt));
  if (r.reason == FinishReason::error) {
    ApiError e;
    e.status = 500;
    e.message = r.error;
    e.type = "server_error";
    tail += sse(e.to_json());
  } else if (!reply.calls.empty()) {
    tail += sse(stream_tool_calls_chunk(ids_, reply.calls));
    tail += sse(stream_tool_calls_end(ids_));
  } else {
    tail += sse(stream_chunk(ids_, endpoint_, "", false, r.reason));
  }
  if (include_usage_) tail += sse(stream_usage_chunk(ids_, endpoint_, r));
  return tail + "data: [DONE]\n\n";
}

void CompletionAnswer::on_done(const CompletionResult& r) {
  const std::string held = text_.finish();
  if (stream_) {
    const std::string tail = stream_tail(r, held);
    std::lock_guard<std::mutex> lk(mu_);
    write(tail);
    ended_ = true;
    if (begun_) ex_->end_stream();
    return;
  }
  reply_ += held;
  if (r.reason == FinishReason::error) {
    ApiError e;
    e.status = 500;
    e.message = r.error;
    e.type = "server_error";
    count_(500);
    ex_->respond(500, "application/json", dump(e.to_json()), headers_);
    return;
  }
  json body;
  if (calls_) {
    ParsedReply reply = parse_tool_calls(reply_);
    if (!reply.calls.empty()) body = completion_response(ids_, endpoint_, reply.content, r, reply.calls);
  }
  if (body.is_null()) body = completion_response(ids_, endpoint_, reply_, r);
  count_(200);
  ex_->respond(200, "application/json", dump(body), headers_);
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
  if (endpoint_ == Endpoint::chat)  // the role comes first, as OpenAI sends it
    ex_->write(sse(stream_chunk(ids_, endpoint_, "", true, std::nullopt)));
  ex_->write(before_begin_);
  before_begin_.clear();
  if (ended_) ex_->end_stream();
}

}  // namespace sluice::server
