// Anthropic's Messages API on `sluice serve`:
//
//   POST /v1/messages               a message (system, messages of text / tool_use /
//                                   tool_result / thinking blocks, tools, tool_choice,
//                                   stop_sequences, max_tokens, temperature, top_p, top_k);
//                                   stream: true answers with Anthropic's events (message_start,
//                                   content_block_start / delta / stop, message_delta,
//                                   message_stop; a ping after message_start)
//   POST /v1/messages/count_tokens  {"input_tokens": N}
//
// A request becomes the OpenAI-shaped chat request the rest of the server runs (the model's
// chat template sees the same messages and tools); the reply comes back as content blocks
// (thinking, text, tool_use). Every error is Anthropic's shape: {"type": "error", "error":
// {"type": "invalid_request_error" | "authentication_error" | "permission_error" |
// "not_found_error" | "request_too_large" | "overloaded_error" | "api_error", "message": ...}}.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "openai_api.h"
#include "serve_context.h"

namespace sluice::server {

bool is_anthropic_route(const std::string& path);
// Anthropic's error type for an HTTP status.
const char* anthropic_error_type(int status);
nlohmann::json anthropic_error_json(const std::string& type, const std::string& message);

// A Messages request as the OpenAI chat request the server runs: sent (OpenAI-shaped, key
// order kept) and its parse, within `limits`. count_only: /count_tokens (max_tokens not
// needed). Throws ApiError naming the field (status 400).
struct AnthropicRequest {
  nlohmann::ordered_json sent;
  ParsedRequest parsed;
};
AnthropicRequest parse_anthropic_request(const nlohmann::ordered_json& body, const SamplingParams& defaults,
                                         bool count_only, const RequestLimits& limits = {});

// Anthropic's stop_reason for how a reply ended.
std::string anthropic_stop_reason(const CompletionResult& r, bool tool_calls, bool stop_sequence);

// The routes, on a worker thread: the request's body read (request_body.h) and checked, the
// answer written through ctx. Throw ApiError (answered in Anthropic's shape by the server).
void anthropic_messages(const ServeContext& ctx);
void anthropic_count_tokens(const ServeContext& ctx);

}  // namespace sluice::server
