// Tool calls in a reply (tool_calls.h).
#include "tool_calls.h"

#include <cstring>

#include <nlohmann/json.hpp>

namespace sluice::server {

namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string trim_right(std::string s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
  return s;
}

// One call's body (between the tags): {"name": "...", "arguments": {...} or "{...}"}.
bool parse_call(const std::string& body, ToolCall& out) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty())
    return false;
  out.name = j["name"].get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");  // Llama-style calls name them so
  if (args == j.end() || args->is_null()) {
    out.arguments = "{}";
  } else if (args->is_object()) {
    out.arguments = args->dump();
  } else if (args->is_string()) {
    const nlohmann::json inner = nlohmann::json::parse(args->get<std::string>(), nullptr, false);
    if (!inner.is_object()) return false;
    out.arguments = inner.dump();
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool template_has_tool_calls(const std::string& template_source) {
  return template_source.find(kToolCallOpen) != std::string::npos;
}

ParsedReply parse_tool_calls(const std::string& reply) {
  ParsedReply whole{reply, {}, {}};
  const size_t first = reply.find(kToolCallOpen);
  if (first == std::string::npos) return whole;
  ParsedReply out{trim_right(reply.substr(0, first)), {}, {}};
  const size_t open_len = std::strlen(kToolCallOpen), close_len = std::strlen(kToolCallClose);
  size_t at = first;
  while (at != std::string::npos) {
    const size_t body = at + open_len, end = reply.find(kToolCallClose, body);
    if (end == std::string::npos) return whole;  // cut off
    ToolCall c;
    if (!parse_call(reply.substr(body, end - body), c)) return whole;
    out.calls.push_back(std::move(c));
    at = end + close_len;
    while (at < reply.size() && is_space(reply[at])) ++at;
    if (at == reply.size()) break;
    if (reply.compare(at, open_len, kToolCallOpen) != 0) return whole;  // text after a call: not a call reply
  }
  return out;
}

std::string ToolCallStream::push(const std::string& text) {
  reply_ += text;
  if (in_call_) return {};
  const std::string open = kToolCallOpen;
  const size_t at = reply_.find(open, emitted_ > open.size() ? emitted_ - open.size() : 0);
  size_t safe = reply_.size();
  if (at != std::string::npos) {
    in_call_ = true;
    safe = at;
  } else {
    // Hold back the longest tail that could begin the tag.
    for (size_t n = std::min(open.size() - 1, reply_.size()); n > 0; --n)
      if (reply_.compare(reply_.size() - n, n, open, 0, n) == 0) {
        safe = reply_.size() - n;
        break;
      }
  }
  if (safe <= emitted_) return {};
  std::string out = reply_.substr(emitted_, safe - emitted_);
  emitted_ = safe;
  return out;
}

ParsedReply ToolCallStream::finish() {
  ParsedReply p = parse_tool_calls(reply_);
  if (p.calls.empty()) return {reply_.substr(emitted_), {}};  // the rest is content
  // Content already emitted stays emitted; what remains of it before the first call (held-back
  // whitespace is dropped, as parse_tool_calls drops it).
  return {p.content.size() > emitted_ ? p.content.substr(emitted_) : std::string(), std::move(p.calls)};
}

}  // namespace sluice::server
