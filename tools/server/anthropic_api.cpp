// Anthropic's Messages API (anthropic_api.h): the request to an OpenAI-shaped chat, the reply
// to content blocks and events.
#include "anthropic_api.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <set>

#include "core/error.h"
#include "request_body.h"

namespace sluice::server {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

[[noreturn]] void bad(std::string message) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  throw e;
}

std::string message_id() {
  static std::atomic<uint64_t> counter{0};
  const uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[64];
  std::snprintf(buf, sizeof buf, "msg_%012llx%06llx", static_cast<unsigned long long>(t & 0xffffffffffffULL),
                static_cast<unsigned long long>((counter.fetch_add(1) + 1) & 0xffffff));
  return buf;
}

// The text of a string or a list of text blocks (system prompts, tool results).
std::string block_text(const ojson& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad(where + " must be a string or a list of text blocks");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const ojson& b = v[i];
    if (!has_type(b, "text") || !b.contains("text") || !b["text"].is_string())
      bad(str(where, "[", i, "] must be a text block {type: \"text\", text}"));
    if (!out.empty()) out += "\n";
    out += b["text"].get<std::string>();
  }
  return out;
}

const std::string& string_field(const ojson& o, const char* key, const std::string& where) {
  if (!o.contains(key) || !o[key].is_string()) bad(str(where, ".", key, " must be a string"));
  return o[key].get_ref<const std::string&>();
}

// One Anthropic message to OpenAI messages (a user turn's tool results become tool messages).
void convert_message(const ojson& m, size_t i, ojson& out) {
  const std::string where = str("messages[", i, "]");
  if (!m.is_object()) bad(where + " must be an object {role, content}");
  for (auto it = m.begin(); it != m.end(); ++it)
    if (it.key() != "role" && it.key() != "content") bad(str(where, ": unknown field '", it.key(), "'"));
  const std::string role = string_field(m, "role", where);
  if (role != "user" && role != "assistant") bad(str(where, ".role is '", role, "'; expected user or assistant"));
  if (!m.contains("content")) bad(where + ".content is required");
  const ojson& content = m["content"];
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content}});
    return;
  }
  if (!content.is_array()) bad(where + ".content must be a string or a list of content blocks");
  std::string text, thinking;
  ojson calls = ojson::array();
  std::vector<ojson> results;
  for (size_t k = 0; k < content.size(); ++k) {
    const ojson& b = content[k];
    const std::string bw = str(where, ".content[", k, "]");
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) bad(bw + " must be a block with a 'type'");
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      text += string_field(b, "text", bw);
    } else if (type == "tool_use") {
      if (role != "assistant") bad(bw + ": tool_use blocks belong to assistant messages");
      const std::string& id = string_field(b, "id", bw);
      const std::string& name = string_field(b, "name", bw);
      if (!b.contains("input") || !b["input"].is_object()) bad(bw + ".input must be an object");
      calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", b["input"].dump()}}}});
    } else if (type == "tool_result") {
      if (role != "user") bad(bw + ": tool_result blocks belong to user messages");
      const std::string& id = string_field(b, "tool_use_id", bw);
      std::string result;
      if (b.contains("content") && !b["content"].is_null()) result = block_text(b["content"], bw + ".content");
      if (b.contains("is_error") && !b["is_error"].is_boolean()) bad(bw + ".is_error must be true or false");
      if (b.value("is_error", false)) result = "Error: " + result;
      results.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
    } else if (type == "thinking") {
      thinking += string_field(b, "thinking", bw);
    } else if (type == "redacted_thinking") {
      // Nothing a template can show.
    } else {
      bad(str(bw, ": blocks of type '", type, "' are not supported (text, tool_use, tool_result, thinking)"));
    }
  }
  for (ojson& r : results) out.push_back(std::move(r));
  if (role == "user" && !results.empty() && text.empty()) return;
  ojson msg = {{"role", role}, {"content", text}};
  if (!thinking.empty()) msg["reasoning_content"] = thinking;
  if (!calls.empty()) msg["tool_calls"] = calls;
  out.push_back(std::move(msg));
}

const std::set<std::string>& known_fields() {
  static const std::set<std::string> s = {"model", "messages", "system", "max_tokens", "stop_sequences", "stream",
                                          "temperature", "top_p", "top_k", "tools", "tool_choice", "metadata",
                                          "thinking", "service_tier"};
  return s;
}

}  // namespace

bool is_anthropic_route(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

const char* anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: case 405: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json anthropic_error_json(const std::string& type, const std::string& message) {
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

AnthropicRequest parse_anthropic_request(const ojson& body, const SamplingParams& defaults, bool count_only,
                                         const RequestLimits& limits) {
  if (!body.is_object()) bad("the request body must be a JSON object");
  for (auto it = body.begin(); it != body.end(); ++it)
    if (!known_fields().count(it.key())) bad(str("unknown field '", it.key(), "'"));
  ojson oa = ojson::object();
  if (body.contains("model")) {
    if (!body["model"].is_string()) bad("model must be a string");
    oa["model"] = body["model"];
  }
  ojson messages = ojson::array();
  if (body.contains("system") && !body["system"].is_null())
    messages.push_back({{"role", "system"}, {"content", block_text(body["system"], "system")}});
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    bad("messages must be a non-empty list");
  for (size_t i = 0; i < body["messages"].size(); ++i) convert_message(body["messages"][i], i, messages);
  oa["messages"] = messages;
  if (!count_only && !body.contains("max_tokens")) bad("max_tokens is required");
  if (body.contains("max_tokens")) {
    const ojson& mt = body["max_tokens"];
    if (!mt.is_number_integer() || mt.get<int64_t>() < 1) bad("max_tokens must be an integer of at least 1");
    oa["max_tokens"] = mt;
  }
  if (body.contains("stop_sequences")) {
    const ojson& ss = body["stop_sequences"];
    if (!ss.is_array()) bad("stop_sequences must be a list of strings");
    if (ss.size() > 4) bad("stop_sequences holds more than 4 strings (sluice takes 4)");
    for (const ojson& s : ss)
      if (!s.is_string() || s.get<std::string>().empty()) bad("stop_sequences must be a list of non-empty strings");
    if (!ss.empty()) oa["stop"] = ss;
  }
  if (body.contains("temperature")) {
    const ojson& t = body["temperature"];
    if (!t.is_number() || t.get<double>() < 0 || t.get<double>() > 1) bad("temperature must be a number from 0 to 1");
    oa["temperature"] = t;
  }
  for (const char* k : {"top_p", "top_k", "stream"})
    if (body.contains(k)) oa[k] = body[k];
  if (body.contains("metadata") && !body["metadata"].is_object() && !body["metadata"].is_null()) bad("metadata must be an object");
  if (body.contains("thinking")) {
    const ojson& th = body["thinking"];
    if (!th.is_object() || !th.contains("type") || !th["type"].is_string()) bad("thinking must be {type: \"enabled\" | \"disabled\", ...}");
  }
  if (body.contains("tools")) {
    const ojson& tools = body["tools"];
    if (!tools.is_array()) bad("tools must be a list");
    ojson oa_tools = ojson::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      const ojson& t = tools[i];
      const std::string where = str("tools[", i, "]");
      if (!t.is_object()) bad(where + " must be an object {name, description, input_schema}");
      if (t.contains("type") && !t["type"].is_null() && t["type"] != "custom")
        bad(str(where, ": server tools ('", t["type"].is_string() ? t["type"].get<std::string>() : t["type"].dump(),
                "') are not supported; give {name, description, input_schema}"));
      const std::string& name = string_field(t, "name", where);
      if (name.empty()) bad(where + ".name is empty");
      if (!t.contains("input_schema") || !t["input_schema"].is_object()) bad(where + ".input_schema must be a JSON schema object");
      ojson fn = {{"name", name}};
      if (t.contains("description")) {
        if (!t["description"].is_string()) bad(where + ".description must be a string");
        fn["description"] = t["description"];
      }
      fn["parameters"] = t["input_schema"];
      oa_tools.push_back({{"type", "function"}, {"function", fn}});
    }
    if (!oa_tools.empty()) oa["tools"] = oa_tools;
  }
  if (body.contains("tool_choice")) {
    const ojson& tc = body["tool_choice"];
    if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string())
      bad("tool_choice must be {type: \"auto\" | \"any\" | \"tool\" | \"none\"}");
    const std::string type = tc["type"].get<std::string>();
    if (type == "auto") oa["tool_choice"] = "auto";
    else if (type == "any") oa["tool_choice"] = "required";
    else if (type == "none") oa["tool_choice"] = "none";
    else if (type == "tool") oa["tool_choice"] = {{"type", "function"}, {"function", {{"name", string_field(tc, "name", "tool_choice")}}}};
    else bad(str("tool_choice.type is '", type, "'; expected auto, any, tool or none"));
    if (tc.contains("disable_parallel_tool_use")) {
      if (!tc["disable_parallel_tool_use"].is_boolean()) bad("tool_choice.disable_parallel_tool_use must be true or false");
      oa["parallel_tool_calls"] = !tc["disable_parallel_tool_use"].get<bool>();
    }
    if (type != "none" && type != "auto" && !oa.contains("tools")) bad("tool_choice asks for a tool but tools is empty");
  }
  AnthropicRequest r;
  r.parsed = parse_request(json(oa), Endpoint::chat, defaults, limits);
  r.sent = std::move(oa);
  return r;
}

std::string anthropic_stop_reason(const CompletionResult& r, bool tool_calls, bool stop_sequence) {
  if (tool_calls) return "tool_use";
  if (r.reason == FinishReason::length) return "max_tokens";
  if (stop_sequence) return "stop_sequence";
  return "end_turn";
}

namespace {

// The stop sequence that ended a reply, when it is one the client sent (a format's own stop,
// such as harmony's <|call|>, is not).
std::string user_stop(const std::vector<std::string>& stops, const std::string& matched) {
  return std::find(stops.begin(), stops.end(), matched) != stops.end() ? matched : std::string();
}

json tool_use_block(const ToolCall& c, const std::string& id) {
  json input = json::parse(c.arguments, nullptr, false);
  if (!input.is_object()) input = json::object();
  return {{"type", "tool_use"}, {"id", id}, {"name", c.name}, {"input", input}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string event(const char* type, const json& data) { return str("event: ", type, "\ndata: ", dump(data), "\n\n"); }

// The streamed content blocks of one reply: a block opens when its kind of text starts and
// closes when another kind comes.
struct BlockWriter {
  std::string msg_id;
  int index = -1;
  std::string open;  // "", "thinking", "text"
  size_t calls = 0;

  void close(std::string& out) {
    if (open.empty()) return;
    if (open == "thinking")
      out += event("content_block_delta", {{"type", "content_block_delta"}, {"index", index},
                                           {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
    out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
    open.clear();
  }
  void text(std::string& out, const std::string& kind, const std::string& s) {
    if (s.empty()) return;
    if (open != kind) {
      close(out);
      open = kind;
      ++index;
      const json block = kind == "thinking" ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                            : json{{"type", "text"}, {"text", ""}};
      out += event("content_block_start", {{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
    }
    const json delta = kind == "thinking" ? json{{"type", "thinking_delta"}, {"thinking", s}} : json{{"type", "text_delta"}, {"text", s}};
    out += event("content_block_delta", {{"type", "content_block_delta"}, {"index", index}, {"delta", delta}});
  }
  void call(std::string& out, const ToolCall& c) {
    close(out);
    ++index;
    json block = tool_use_block(c, str("toolu_", msg_id.substr(4), "_", calls++));
    const json input = block["input"];
    block["input"] = json::object();
    out += event("content_block_start", {{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
    out += event("content_block_delta", {{"type", "content_block_delta"}, {"index", index},
                                         {"delta", {{"type", "input_json_delta"}, {"partial_json", input.dump()}}}});
    out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
  }
};

// Anthropic's answer to a message: its events (message_start and a ping, the content blocks
// as they come, message_delta with the stop reason, message_stop) or the message.
class AnthropicReply : public ReplyWriter {
 public:
  AnthropicReply(const ParsedRequest& request, std::string model, const Generation& gen)
      : stops_(request.stop), model_(std::move(model)), gen_(gen) {
    blocks_.msg_id = message_id();
    if (gen_.parse_reply) reply_.emplace(gen_.format, gen_.reply_options);
  }

  std::string stream_begin() override {
    return event("message_start",
                 {{"type", "message_start"},
                  {"message", {{"id", blocks_.msg_id}, {"type", "message"}, {"role", "assistant"}, {"model", model_},
                               {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                               {"usage", {{"input_tokens", gen_.prompt_tokens}, {"output_tokens", 0}}}}}}) +
           event("ping", {{"type", "ping"}});
  }

  std::string stream_text(const std::string& text) override {
    std::string out;
    if (reply_) emit(out, reply_->push(text));
    else blocks_.text(out, "text", text);
    return out;
  }

  std::string stream_end(const CompletionResult& r, const std::string& stop) override {
    std::string out;
    if (reply_) emit(out, reply_->finish());
    blocks_.close(out);
    if (r.reason == FinishReason::error) return out + event("error", anthropic_error_json("api_error", r.error));
    const std::string matched = user_stop(stops_, stop);
    out += event("message_delta",
                 {{"type", "message_delta"},
                  {"delta", {{"stop_reason", anthropic_stop_reason(r, blocks_.calls > 0, !matched.empty())},
                             {"stop_sequence", matched.empty() ? json(nullptr) : json(matched)}}},
                  {"usage", {{"output_tokens", r.completion_tokens}}}});
    return out + event("message_stop", {{"type", "message_stop"}});
  }

  std::pair<int, std::string> whole(const CompletionResult& r, const std::string& text, const std::string& stop) override {
    if (r.reason == FinishReason::error) return {500, dump(anthropic_error_json("api_error", r.error))};
    ParsedReply reply{text, {}, {}};
    if (gen_.parse_reply) reply = parse_reply(gen_.format, text, gen_.reply_options);
    const std::string& id = blocks_.msg_id;
    json content = json::array();
    if (!reply.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", reply.reasoning}, {"signature", ""}});
    if (!reply.content.empty()) content.push_back({{"type", "text"}, {"text", reply.content}});
    for (size_t i = 0; i < reply.calls.size(); ++i)
      content.push_back(tool_use_block(reply.calls[i], str("toolu_", id.substr(4), "_", i)));
    const std::string matched = user_stop(stops_, stop);
    return {200, dump({{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", model_}, {"content", content},
                       {"stop_reason", anthropic_stop_reason(r, !reply.calls.empty(), !matched.empty())},
                       {"stop_sequence", matched.empty() ? json(nullptr) : json(matched)},
                       {"usage", {{"input_tokens", r.prompt_tokens}, {"output_tokens", r.completion_tokens}}}})};
  }

 private:
  void emit(std::string& out, const ReplyStream::Delta& d) {
    blocks_.text(out, "thinking", d.reasoning);
    blocks_.text(out, "text", d.content);
    for (const ToolCall& c : d.calls) blocks_.call(out, c);
  }

  const std::vector<std::string> stops_;  // the client's stop_sequences
  const std::string model_;
  const Generation gen_;
  BlockWriter blocks_;
  std::optional<ReplyStream> reply_;  // gen_.parse_reply
};

}  // namespace

// Anthropic's default temperature is 1; a server's --temperature still applies when given.
void anthropic_messages(const ServeContext& ctx) {
  const AnthropicRequest ar = parse_anthropic_request(parse_body_json(ctx.body), ctx.default_sampling, false, ctx.limits);
  const std::string model = ar.parsed.model.empty() ? ctx.model_name : ar.parsed.model;
  const ParsedRequest& pr = ar.parsed;
  ctx.start(pr, ar.sent, [&pr, &model](const Generation& gen) { return std::make_unique<AnthropicReply>(pr, model, gen); });
}

void anthropic_count_tokens(const ServeContext& ctx) {
  const AnthropicRequest ar = parse_anthropic_request(parse_body_json(ctx.body), ctx.default_sampling, true, ctx.limits);
  ctx.respond(200, {{"input_tokens", ctx.prompt(ar.parsed, ar.sent).size()}});
}

}  // namespace sluice::server
