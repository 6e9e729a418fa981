// The OpenAI-compatible request and response bodies of `sluice serve`: a request's JSON
// checked field by field (wrong types, values out of range, unsupported features: a 400 with a
// message that names the field), and the JSON of responses, stream chunks and errors.
#pragma once

#include <cstdint>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/batch_engine.h"
#include "engine/sampler.h"
#include "tool_calls.h"

namespace sluice::server {

// An error a client sees: the HTTP status and OpenAI's error object.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // or "authentication_error", "server_error", ...
  std::string code;                            // empty: null
  nlohmann::json to_json() const;              // {"error": {"message", "type", "param": null, "code"}}
};

// One chat message (role and text content; content parts of type "text" are joined). An
// assistant message may carry tool calls, a "tool" message answers one.
struct ChatMessage {
  std::string role, content;
  nlohmann::json tool_calls;  // null, or [{id, type: "function", function: {name, arguments}}] as sent
  std::string tool_call_id;   // role "tool": the call it answers (may be empty)
};

enum class Endpoint { completions, chat };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::completions;
  std::string model;                        // as sent (any name is accepted)
  std::optional<std::string> prompt_text;   // completions: the prompt as text, or
  std::vector<int32_t> prompt_ids;          // completions: the prompt as token ids
  std::vector<ChatMessage> messages;        // chat
  nlohmann::json tools;                     // chat: null, or [{type: "function", function: {name, ...}}] as sent
  bool tool_choice_none = false;            // tool_choice "none": tools are neither shown nor parsed
  bool tool_choice_required = false;        // tool_choice "required": the reply is calls (grammar)
  std::optional<std::string> tool_choice_name;  // tool_choice naming a function: one call of it (grammar)
  bool parallel_tool_calls = true;
  nlohmann::json response_format;           // null (text), or {"type": "json_object" | "json_schema", ...} as sent
  bool reasoning_inline = false;            // reasoning_format "none": reasoning stays in the content
  std::optional<int64_t> max_tokens;        // none: the endpoint's default
  SamplingParams sampling;
  std::vector<std::string> stop;            // at most 4
  bool stream = false;
  bool include_usage = false;               // stream_options.include_usage
};

// What a request may ask of the server before its prompt is rendered and tokenized.
struct RequestLimits {
  size_t max_messages = SIZE_MAX;    // chat: the context's tokens (a message renders at least one)
  size_t max_prompt_ids = SIZE_MAX;  // completions: token ids of a prompt given as ids (the context)
};

// Whether a request's object v has a string "type" equal to `type` (a part, a block, a tool):
// never json's value("type", ""), which throws when the client sends a type of another kind.
template <class Json>
bool has_type(const Json& v, std::string_view type) {
  if (!v.is_object()) return false;
  auto it = v.find("type");
  return it != v.end() && it->is_string() && it->template get_ref<const std::string&>() == type;
}

// Parses and checks a request body (already valid JSON); sampling values the body leaves out
// come from `defaults` (the server's command line; OpenAI's are temperature 1, top_p 1).
// Throws ApiError.
ParsedRequest parse_request(const nlohmann::json& body, Endpoint endpoint, const SamplingParams& defaults,
                            const RequestLimits& limits = {});

// OpenAI's finish_reason for how a request ended.
const char* finish_reason_text(FinishReason r);

struct ResponseIds {
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
};

nlohmann::json usage_json(const CompletionResult& r);
// The whole response of a request that did not stream; chat replies with tool calls carry
// them (content null when empty, finish_reason "tool_calls"), and the reasoning of a model
// that thinks as message.reasoning_content.
nlohmann::json completion_response(const ResponseIds& ids, Endpoint endpoint, const std::string& text,
                                   const CompletionResult& r, const std::vector<ToolCall>& calls = {},
                                   const std::string& reasoning = {});
// The streamed chunk of a reply's tool calls (delta.tool_calls with index, id, type, function);
// first_index: the index of calls[0] in the reply.
nlohmann::json stream_tool_calls_chunk(const ResponseIds& ids, const std::vector<ToolCall>& calls, size_t first_index = 0);
// A streamed chunk of reasoning (delta.reasoning_content).
nlohmann::json stream_reasoning_chunk(const ResponseIds& ids, const std::string& reasoning);
// The last chunk of a reply that ended in tool calls: an empty delta, finish_reason "tool_calls".
nlohmann::json stream_tool_calls_end(const ResponseIds& ids);
// One streamed chunk: text (chat: the delta's content; first: also the role), and the
// finish_reason on the last one.
nlohmann::json stream_chunk(const ResponseIds& ids, Endpoint endpoint, const std::string& text, bool first,
                            const std::optional<FinishReason>& finish);
// The usage chunk of stream_options.include_usage: no choices, the usage.
nlohmann::json stream_usage_chunk(const ResponseIds& ids, Endpoint endpoint, const CompletionResult& r);

}  // namespace sluice::server
