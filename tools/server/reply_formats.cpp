// Reasoning and tool calls per family (reply_formats.h).
#include "reply_formats.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <string_view>

#include "core/error.h"
#include "engine/json_schema.h"

namespace sluice::server {

using nlohmann::json;

namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
// Harmony.
constexpr std::string_view kStart = "<|start|>", kChannel = "<|channel|>", kMessage = "<|message|>", kEnd = "<|end|>",
                           kCall = "<|call|>", kReturn = "<|return|>", kConstrain = "<|constrain|>";
// DeepSeek-V3.
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>", kDsCallsEnd = "<｜tool▁calls▁end｜>",
                           kDsCallBegin = "<｜tool▁call▁begin｜>", kDsCallEnd = "<｜tool▁call▁end｜>",
                           kDsSep = "<｜tool▁sep｜>";
// GLM-4.5 (and Hermes' tags).
constexpr std::string_view kToolCall = "<tool_call>", kToolCallEnd = "</tool_call>", kArgKey = "<arg_key>",
                           kArgKeyEnd = "</arg_key>", kArgValue = "<arg_value>", kArgValueEnd = "</arg_value>";
// MiniMax-M2.
constexpr std::string_view kMmCall = "<minimax:tool_call>", kMmCallEnd = "</minimax:tool_call>",
                           kMmInvoke = "<invoke name=\"", kMmInvokeEnd = "</invoke>", kMmParam = "<parameter name=\"",
                           kMmParamEnd = "</parameter>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && is_space(s[a])) ++a;
  while (b > a && is_space(s[b - 1])) --b;
  return std::string(s.substr(a, b - a));
}

std::string trim_right(std::string s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
  return s;
}

bool starts_with(std::string_view s, size_t at, std::string_view m) { return s.compare(at, m.size(), m) == 0; }

// The length of the longest suffix of text that is a proper prefix of a marker: text a
// streaming client must not see yet.
size_t marker_tail(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (std::string_view m : markers)
    for (size_t n = std::min(m.size() - 1, text.size()); n > best; --n)
      if (text.compare(text.size() - n, n, m, 0, n) == 0) {
        best = n;
        break;
      }
  return best;
}

std::string held(std::string_view text, bool final, std::initializer_list<std::string_view> markers) {
  if (final) return std::string(text);
  return std::string(text.substr(0, text.size() - marker_tail(text, markers)));
}

// {"name": ..., "arguments" or "parameters": {...} or "{...}"}.
bool json_call(const json& j, ToolCall& out) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty()) return false;
  out.name = j["name"].get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end() || args->is_null()) {
    out.arguments = "{}";
  } else if (args->is_object()) {
    out.arguments = args->dump();
  } else if (args->is_string()) {
    const json inner = json::parse(args->get<std::string>(), nullptr, false);
    if (!inner.is_object()) return false;
    out.arguments = inner.dump();
  } else {
    return false;
  }
  return true;
}

// Arguments written as text (a JSON object), kept as the model wrote them when they are not JSON.
std::string json_args(std::string_view body) {
  const std::string t = trim(body);
  const json j = json::parse(t, nullptr, false);
  return j.is_object() ? j.dump() : t;
}

// The JSON-schema type of a tool's parameter, "" when unknown.
std::string param_type(const json& tools, const std::string& fn, const std::string& param) {
  if (!tools.is_array()) return "";
  for (const json& t : tools) {
    const json* f = t.contains("function") ? &t["function"] : nullptr;
    if (!f || !f->is_object() || f->value("name", "") != fn) continue;
    const json p = f->value("parameters", json::object());
    if (!p.is_object() || !p.contains("properties") || !p["properties"].contains(param)) return "";
    const json& s = p["properties"][param];
    if (s.is_object() && s.contains("type") && s["type"].is_string()) return s["type"].get<std::string>();
    return "";
  }
  return "";
}

// A key/value argument's value: text for string parameters, else JSON when it parses.
json kv_value(const std::string& raw, const std::string& type) {
  if (type == "string") return raw;
  const json j = json::parse(trim(raw), nullptr, false);
  return j.is_discarded() ? json(raw) : j;
}

// ---- reasoning ----

struct ThinkSplit {
  std::string reasoning;
  size_t rest = 0;      // where the text after the reasoning starts
  bool found = false;   // a reasoning block was opened (by the reply or the prompt)
  bool decided = true;  // false: the text so far could still open <think> (hold everything)
  bool closed = true;   // the reasoning has ended (or there is none)
  size_t raw_end = 0;   // the end of the reasoning as written, markers included (inline mode)
};

ThinkSplit split_think(const std::string& text, bool open, bool final) {
  ThinkSplit s;
  size_t at = 0;
  if (!open) {
    while (at < text.size() && is_space(text[at])) ++at;
    if (starts_with(text, at, kThinkOpen)) {
      open = true;
      at += kThinkOpen.size();
    } else if (!final && text.size() - at < kThinkOpen.size() && kThinkOpen.substr(0, text.size() - at) == std::string_view(text).substr(at)) {
      s.decided = false;
      return s;
    } else {
      return s;  // no reasoning: rest at 0
    }
  }
  s.found = true;
  const size_t close = text.find(kThinkClose, at);
  if (close == std::string::npos) {
    s.reasoning = held(std::string_view(text).substr(at), final, {kThinkClose});
    s.rest = text.size();
    s.closed = false;
    s.raw_end = at + s.reasoning.size();
    return s;
  }
  s.reasoning = text.substr(at, close - at);
  s.raw_end = close + kThinkClose.size();
  s.rest = s.raw_end;
  return s;
}

// ---- calls in blocks between markers ----

struct BlockFormat {
  std::string_view section_open;  // where calls begin (content before it)
  std::string_view call_open, call_close;
  std::string_view section_close; // "" when calls are not wrapped in a section
  // A block's body to calls; false when it does not parse.
  std::function<bool(std::string_view body, std::vector<ToolCall>& out)> parse;
};

// content + calls of rest; final: a reply whose calls do not all parse (or text after them)
// is content whole; partial: the content so far and the calls complete so far.
ParsedReply block_calls(std::string_view rest, const BlockFormat& f, bool final) {
  ParsedReply out;
  const size_t first = rest.find(f.section_open);
  if (first == std::string::npos) {
    out.content = held(rest, final, {f.section_open});
    return out;
  }
  out.content = trim_right(std::string(rest.substr(0, first)));
  if (!final) out.content = std::string(rest.substr(0, first));  // its whitespace is trimmed at the end
  size_t at = first + (f.section_open == f.call_open ? 0 : f.section_open.size());
  bool ok = true;
  for (;;) {
    while (at < rest.size() && is_space(rest[at])) ++at;
    if (at >= rest.size()) break;
    if (!f.section_close.empty() && starts_with(rest, at, f.section_close)) {
      at += f.section_close.size();
      while (at < rest.size() && is_space(rest[at])) ++at;
      ok = at == rest.size();
      break;
    }
    if (!starts_with(rest, at, f.call_open)) {
      ok = !final && (f.call_open.substr(0, rest.size() - at) == rest.substr(at) ||
                      (!f.section_close.empty() && f.section_close.substr(0, rest.size() - at) == rest.substr(at)));
      break;
    }
    const size_t body = at + f.call_open.size(), end = rest.find(f.call_close, body);
    if (end == std::string::npos) {
      ok = !final;  // a call still coming; cut off at the end
      break;
    }
    if (!f.parse(rest.substr(body, end - body), out.calls)) {
      ok = false;
      break;
    }
    at = end + f.call_close.size();
  }
  if (final && (!ok || out.calls.empty())) return {std::string(rest), {}, {}};
  return out;
}

bool hermes_body(std::string_view body, std::vector<ToolCall>& out) {
  ToolCall c;
  if (!json_call(json::parse(body, nullptr, false), c)) return false;
  out.push_back(std::move(c));
  return true;
}

bool deepseek_body(std::string_view body, std::vector<ToolCall>& out) {
  // function<｜tool▁sep｜>NAME\n```json\n{...}\n```   or   NAME<｜tool▁sep｜>{...}
  const size_t sep = body.find(kDsSep);
  if (sep == std::string::npos) return false;
  ToolCall c;
  std::string_view head = body.substr(0, sep), tail = body.substr(sep + kDsSep.size());
  if (trim(head) == "function") {
    const size_t nl = tail.find('\n');
    if (nl == std::string::npos) return false;
    c.name = trim(tail.substr(0, nl));
    std::string args = trim(tail.substr(nl + 1));
    if (args.rfind("```json", 0) == 0) args = args.substr(7);
    else if (args.rfind("```", 0) == 0) args = args.substr(3);
    if (args.size() >= 3 && args.compare(args.size() - 3, 3, "```") == 0) args.resize(args.size() - 3);
    c.arguments = json_args(args);
  } else {
    c.name = trim(head);
    c.arguments = json_args(tail);
  }
  if (c.name.empty()) return false;
  out.push_back(std::move(c));
  return true;
}

bool glm_body(std::string_view body, std::vector<ToolCall>& out, const json& tools) {
  ToolCall c;
  size_t at = body.find(kArgKey);
  c.name = trim(body.substr(0, at == std::string::npos ? body.size() : at));
  if (c.name.empty()) return false;
  json args = json::object();
  while (at != std::string::npos) {
    const size_t ke = body.find(kArgKeyEnd, at);
    if (ke == std::string::npos) return false;
    const std::string key = trim(body.substr(at + kArgKey.size(), ke - at - kArgKey.size()));
    const size_t vs = body.find(kArgValue, ke);
    if (vs == std::string::npos) return false;
    const size_t ve = body.find(kArgValueEnd, vs);
    if (ve == std::string::npos) return false;
    const std::string raw(body.substr(vs + kArgValue.size(), ve - vs - kArgValue.size()));
    args[key] = kv_value(raw, param_type(tools, c.name, key));
    at = body.find(kArgKey, ve);
  }
  c.arguments = args.dump();
  out.push_back(std::move(c));
  return true;
}

bool minimax_body(std::string_view body, std::vector<ToolCall>& out, const json& tools) {
  size_t at = body.find(kMmInvoke);
  if (at == std::string::npos) return false;
  std::vector<ToolCall> calls;
  while (at != std::string::npos) {
    const size_t ne = body.find("\">", at);
    const size_t ie = body.find(kMmInvokeEnd, at);
    if (ne == std::string::npos || ie == std::string::npos || ne > ie) return false;
    ToolCall c;
    c.name = std::string(body.substr(at + kMmInvoke.size(), ne - at - kMmInvoke.size()));
    json args = json::object();
    for (size_t p = body.find(kMmParam, ne); p != std::string::npos && p < ie; p = body.find(kMmParam, p + 1)) {
      const size_t pe = body.find("\">", p), ve = body.find(kMmParamEnd, p);
      if (pe == std::string::npos || ve == std::string::npos || ve > ie) return false;
      const std::string key(body.substr(p + kMmParam.size(), pe - p - kMmParam.size()));
      std::string raw(body.substr(pe + 2, ve - pe - 2));
      // The format puts the value on its own lines: one newline each side is layout.
      if (!raw.empty() && raw.front() == '\n') raw.erase(0, 1);
      if (!raw.empty() && raw.back() == '\n') raw.pop_back();
      args[key] = kv_value(raw, param_type(tools, c.name, key));
    }
    if (c.name.empty()) return false;
    c.arguments = args.dump();
    calls.push_back(std::move(c));
    at = body.find(kMmInvoke, ie);
  }
  for (ToolCall& c : calls) out.push_back(std::move(c));
  return true;
}

ParsedReply llama3_calls(std::string_view rest, bool final) {
  std::string t = trim(rest);
  const bool tagged = t.rfind(kPythonTag, 0) == 0;
  if (tagged) t = trim(std::string_view(t).substr(kPythonTag.size()));
  const bool maybe_call = tagged || (!t.empty() && t[0] == '{') ||
                          (t.size() < kPythonTag.size() && kPythonTag.substr(0, t.size()) == t);
  if (!maybe_call) return {held(rest, final, {kPythonTag}), {}, {}};
  if (!final) return {};  // a call is parsed whole at the end
  std::vector<ToolCall> calls;
  auto parse_one = [&](std::string_view s) {
    ToolCall c;
    if (!json_call(json::parse(s, nullptr, false), c)) return false;
    calls.push_back(std::move(c));
    return true;
  };
  bool ok = parse_one(t);
  if (!ok) {  // several calls joined by ';'
    calls.clear();
    ok = true;
    size_t from = 0;
    while (ok && from <= t.size()) {
      const size_t semi = t.find(';', from);
      const std::string part = trim(std::string_view(t).substr(from, semi == std::string::npos ? std::string::npos : semi - from));
      if (!part.empty()) ok = parse_one(part);
      if (semi == std::string::npos) break;
      from = semi + 1;
    }
  }
  if (!ok || calls.empty()) return {std::string(rest), {}, {}};
  return {"", std::move(calls), {}};
}

// Harmony: a sequence of messages, each a header up to <|message|> and a body up to <|end|>,
// <|call|>, <|return|> or the next <|start|>.
ParsedReply harmony(const std::string& text, const ReplyOptions& o, bool final) {
  ParsedReply out;
  const auto all_markers = {kStart, kChannel, kMessage, kEnd, kCall, kReturn, kConstrain};
  if (text.find(kMessage) == std::string::npos && text.find(kChannel) == std::string::npos &&
      text.find(kStart) == std::string::npos) {
    // No message structure (JSON forced from the first token, say): all content.
    out.content = held(text, final, all_markers);
    return out;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t m = text.find(kMessage, pos);
    if (m == std::string::npos) break;  // a header still coming
    const std::string_view header = std::string_view(text).substr(pos, m - pos);
    const size_t body = m + kMessage.size();
    size_t end = std::string::npos;
    std::string_view end_marker;
    for (std::string_view mk : {kEnd, kCall, kReturn, kStart}) {
      const size_t e = text.find(mk, body);
      if (e < end) end = e, end_marker = mk;
    }
    const bool terminated = end != std::string::npos;
    const std::string_view b = std::string_view(text).substr(body, (terminated ? end : text.size()) - body);
    std::string channel;
    if (const size_t c = header.find(kChannel); c != std::string::npos)
      for (size_t i = c + kChannel.size(); i < header.size() && (std::isalnum(static_cast<unsigned char>(header[i])) || header[i] == '_'); ++i)
        channel += header[i];
    std::string recipient;
    if (const size_t t = header.find("to="); t != std::string::npos)
      for (size_t i = t + 3; i < header.size() && !is_space(header[i]) && header[i] != '<'; ++i) recipient += header[i];
    if (recipient.rfind("functions.", 0) == 0) {
      if (!terminated && !final) break;  // the call's arguments are still coming
      if (o.parse_calls) out.calls.push_back({recipient.substr(10), json_args(b)});
    } else if (channel == "analysis" && !o.reasoning_inline) {
      out.reasoning += held(b, final || terminated, all_markers);
    } else {
      out.content += held(b, final || terminated, all_markers);
    }
    if (!terminated) break;
    pos = end + (end_marker == kStart ? 0 : end_marker.size());
    if (end_marker == kStart) pos += kStart.size();
  }
  return out;
}

ParsedReply parse(ReplyFormat f, const std::string& text, const ReplyOptions& o, bool final) {
  if (f == ReplyFormat::harmony) return harmony(text, o, final);
  ParsedReply out;
  size_t rest_at = 0;
  std::string inline_prefix;
  if (f != ReplyFormat::llama3) {
    const ThinkSplit t = split_think(text, o.reasoning_open, final);
    if (!t.decided) return out;
    if (o.reasoning_inline) inline_prefix = text.substr(0, t.raw_end);
    else out.reasoning = t.reasoning;
    if (!t.closed) {
      out.content = inline_prefix;
      return out;
    }
    rest_at = t.rest;
    if (!o.reasoning_inline && t.found)
      while (rest_at < text.size() && is_space(text[rest_at])) ++rest_at;  // the newlines after </think>
  }
  const std::string_view rest = std::string_view(text).substr(rest_at);
  ParsedReply calls;
  if (!o.parse_calls) {
    calls.content = held(rest, final, {});
  } else {
    const json& tools = o.tools;
    switch (f) {
      case ReplyFormat::hermes:
        calls = block_calls(rest, {kToolCall, kToolCall, kToolCallEnd, "", hermes_body}, final);
        break;
      case ReplyFormat::deepseek:
        calls = block_calls(rest, {kDsCallsBegin, kDsCallBegin, kDsCallEnd, kDsCallsEnd, deepseek_body}, final);
        break;
      case ReplyFormat::glm45:
        calls = block_calls(rest, {kToolCall, kToolCall, kToolCallEnd, "",
                                   [&](std::string_view b, std::vector<ToolCall>& c) { return glm_body(b, c, tools); }},
                            final);
        break;
      case ReplyFormat::minimax:
        calls = block_calls(rest, {kMmCall, kMmCall, kMmCallEnd, "",
                                   [&](std::string_view b, std::vector<ToolCall>& c) { return minimax_body(b, c, tools); }},
                            final);
        break;
      case ReplyFormat::llama3: calls = llama3_calls(rest, final); break;
      case ReplyFormat::harmony: break;
    }
  }
  out.content = inline_prefix + calls.content;
  out.calls = std::move(calls.calls);
  if (final && !out.calls.empty()) out.content = trim_right(out.content);
  return out;
}

}  // namespace

std::optional<ReplyFormat> reply_format_for(const std::string& model_type, const std::string& src) {
  if (model_type == "gpt_oss" || src.find("<|channel|>") != std::string::npos) return ReplyFormat::harmony;
  if (model_type.rfind("deepseek", 0) == 0 || src.find("tool▁calls▁begin") != std::string::npos) return ReplyFormat::deepseek;
  if (model_type.rfind("glm4", 0) == 0 || src.find("<arg_key>") != std::string::npos) return ReplyFormat::glm45;
  if (model_type.rfind("minimax", 0) == 0 || src.find("<minimax:tool_call>") != std::string::npos) return ReplyFormat::minimax;
  if (src.find("<tool_call>") != std::string::npos) return ReplyFormat::hermes;
  if (model_type.rfind("llama", 0) == 0 || src.find("<|python_tag|>") != std::string::npos ||
      src.find("ipython") != std::string::npos)
    return ReplyFormat::llama3;
  if (model_type.rfind("qwen", 0) == 0) return ReplyFormat::hermes;
  return std::nullopt;
}

const char* reply_format_name(ReplyFormat f) {
  switch (f) {
    case ReplyFormat::hermes: return "hermes";
    case ReplyFormat::harmony: return "harmony";
    case ReplyFormat::llama3: return "llama3";
    case ReplyFormat::deepseek: return "deepseek";
    case ReplyFormat::glm45: return "glm45";
    case ReplyFormat::minimax: return "minimax";
  }
  return "?";
}

bool reply_format_keeps_special(ReplyFormat f) { return f == ReplyFormat::harmony || f == ReplyFormat::deepseek; }

bool prompt_opens_reasoning(const std::string& prompt) {
  const std::string t = trim_right(prompt);
  return t.size() >= kThinkOpen.size() && t.compare(t.size() - kThinkOpen.size(), kThinkOpen.size(), kThinkOpen) == 0;
}

ParsedReply parse_reply(ReplyFormat f, const std::string& reply, const ReplyOptions& options) {
  return parse(f, reply, options, true);
}

ReplyStream::Delta ReplyStream::diff(const ParsedReply& p) {
  Delta d;
  if (p.reasoning.size() > reasoning_emitted_) {
    d.reasoning = p.reasoning.substr(reasoning_emitted_);
    reasoning_emitted_ = p.reasoning.size();
  }
  if (p.content.size() > content_emitted_) {
    d.content = p.content.substr(content_emitted_);
    content_emitted_ = p.content.size();
  }
  for (size_t i = calls_emitted_; i < p.calls.size(); ++i) d.calls.push_back(p.calls[i]);
  calls_emitted_ = std::max(calls_emitted_, p.calls.size());
  return d;
}

ReplyStream::Delta ReplyStream::push(const std::string& text) {
  text_ += text;
  ParsedReply p = parse(format_, text_, options_, false);
  // Whitespace before a call is trimmed at the end: hold it back meanwhile.
  if (!p.calls.empty() || options_.parse_calls) {
    size_t keep = p.content.size();
    while (keep > content_emitted_ && is_space(p.content[keep - 1])) --keep;
    p.content.resize(keep);
  }
  return diff(p);
}

ReplyStream::Delta ReplyStream::finish() {
  ParsedReply p = parse(format_, text_, options_, true);
  if (calls_emitted_ > 0 && p.calls.size() < calls_emitted_) {
    // The calls already sent did not hold up at the end (text after them): what they were
    // stays sent; nothing of the raw text follows.
    return {};
  }
  return diff(p);
}

// ---- forced calls ----

namespace {

// Arguments as key/value pairs (GLM-4.5, MiniMax-M2): the parameters in the schema's order,
// string values as raw text (no '<'), others as JSON of their schema.
GExpr kv_args(const json& params, JsonGrammar& j, const std::string& key_open, const std::string& key_close,
              const std::string& value_close) {
  if (!params.is_object() || !params.contains("properties") || !params["properties"].is_object()) return g_empty();
  std::vector<std::string> required;
  if (params.contains("required") && params["required"].is_array())
    for (const json& r : params["required"])
      if (r.is_string()) required.push_back(r.get<std::string>());
  // One character of a text value: printable ASCII but '<', newline, tab, or any other code point.
  ByteSet ascii = byte_range(0x20, 0x7E);
  ascii['<' >> 6] &= ~(uint64_t{1} << ('<' & 63));
  ascii['\n' >> 6] |= uint64_t{1} << '\n';
  ascii['\t' >> 6] |= uint64_t{1} << '\t';
  const GExpr text_char = g_alt({g_bytes(ascii), json_string_pattern(".")});  // "." adds the non-ASCII code points
  std::vector<GExpr> items;
  for (auto it = params["properties"].begin(); it != params["properties"].end(); ++it) {
    const json& s = it.value();
    GExpr value;
    if (s.is_object() && s.value("type", json()) == "string") {
      // A string parameter is written as its text: its enum / const values, or characters
      // within minLength / maxLength.
      if (s.contains("pattern") || s.contains("format"))
        fail(Status::invalid_argument, "json_schema: 'pattern' and 'format' on a string parameter are not supported in ",
             "this family's call format (at #/properties/", it.key(), ")");
      if (s.contains("enum") || s.contains("const")) {
        std::vector<GExpr> alts;
        for (const json& v : s.contains("const") ? json::array({s["const"]}) : s["enum"])
          if (v.is_string()) alts.push_back(g_lit(v.get<std::string>()));
        if (alts.empty()) fail(Status::invalid_argument, "json_schema: no string in 'enum' (at #/properties/", it.key(), ")");
        value = g_alt(std::move(alts));
      } else {
        const int lo = s.contains("minLength") && s["minLength"].is_number_integer() ? s["minLength"].get<int>() : 0;
        const int hi = s.contains("maxLength") && s["maxLength"].is_number_integer() ? s["maxLength"].get<int>() : -1;
        if (lo < 0 || lo > 10000 || hi > 10000 || (hi >= 0 && hi < lo))
          fail(Status::invalid_argument, "json_schema: 'minLength' / 'maxLength' out of range (at #/properties/", it.key(), ")");
        value = g_repeat(text_char, lo, hi);
      }
    } else {
      value = j.schema(s);
    }
    const GExpr kv = g_seq({g_lit(key_open + it.key() + key_close), value, g_lit(value_close)});
    const bool req = std::find(required.begin(), required.end(), it.key()) != required.end();
    items.push_back(req ? kv : g_opt(kv));
  }
  return g_seq(std::move(items));
}

}  // namespace

ForcedCalls forced_call_grammar(ReplyFormat f, const json& tools, const std::optional<std::string>& name, bool parallel) {
  GrammarBuilder b;
  JsonGrammar j(b, /*compact=*/true);
  std::vector<GExpr> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& fn = tools[i]["function"];
    const std::string n = fn["name"].get<std::string>();
    if (name && n != *name) continue;
    const json params = fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"] : json{{"type", "object"}};
    try {
      const std::string quoted = json(n).dump();
      switch (f) {
        case ReplyFormat::hermes:
          calls.push_back(g_seq({g_lit("<tool_call>\n{\"name\": " + quoted + ", \"arguments\": "), j.schema(params), g_lit("}\n</tool_call>")}));
          break;
        case ReplyFormat::llama3:
          calls.push_back(g_seq({g_lit("{\"name\": " + quoted + ", \"parameters\": "), j.schema(params), g_lit("}")}));
          break;
        case ReplyFormat::harmony:
          calls.push_back(g_seq({g_lit(std::string(kChannel) + "commentary to=functions." + n + " " + std::string(kConstrain) + "json" +
                                       std::string(kMessage)),
                                 j.schema(params), g_lit(std::string(kCall))}));
          break;
        case ReplyFormat::deepseek:
          calls.push_back(g_seq({g_lit(std::string(kDsCallBegin) + "function" + std::string(kDsSep) + n + "\n```json\n"), j.schema(params),
                                 g_lit("\n```" + std::string(kDsCallEnd))}));
          break;
        case ReplyFormat::glm45:
          calls.push_back(g_seq({g_lit("<tool_call>" + n + "\n"), kv_args(params, j, "<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>\n"),
                                 g_lit("</tool_call>")}));
          break;
        case ReplyFormat::minimax:
          calls.push_back(g_seq({g_lit(std::string(kMmInvoke) + n + "\">\n"), kv_args(params, j, "<parameter name=\"", "\">", "</parameter>\n"),
                                 g_lit(std::string(kMmInvokeEnd) + "\n")}));
          break;
      }
    } catch (const Error& e) {
      fail(Status::invalid_argument, "tools[", i, "] (", n, ") parameters: ", e.what());
    }
  }
  if (calls.empty()) fail(Status::invalid_argument, "'tool_choice' names the function '", name.value_or(""), "', which is not in 'tools'");
  const GExpr one = g_alt(std::move(calls));
  const bool many = parallel && !name && f != ReplyFormat::harmony && f != ReplyFormat::llama3;
  GExpr reply;
  switch (f) {
    case ReplyFormat::deepseek:
      reply = g_seq({g_lit(std::string(kDsCallsBegin)), g_repeat(one, 1, many ? 8 : 1), g_lit(std::string(kDsCallsEnd))});
      break;
    case ReplyFormat::minimax:
      reply = g_seq({g_lit(std::string(kMmCall) + "\n"), g_repeat(one, 1, many ? 8 : 1), g_lit(std::string(kMmCallEnd))});
      break;
    default: reply = many ? g_seq({one, g_repeat(g_seq({g_lit("\n"), one}), 0, 7)}) : one;
  }
  ForcedCalls out;
  out.grammar = b.build(b.rule("root", reply));
  switch (f) {
    case ReplyFormat::harmony: out.specials = {std::string(kChannel), std::string(kConstrain), std::string(kMessage), std::string(kCall)}; break;
    case ReplyFormat::deepseek:
      out.specials = {std::string(kDsCallsBegin), std::string(kDsCallsEnd), std::string(kDsCallBegin), std::string(kDsCallEnd), std::string(kDsSep)};
      break;
    case ReplyFormat::glm45: out.specials = {std::string(kToolCall), std::string(kToolCallEnd), std::string(kArgKey), std::string(kArgKeyEnd),
                                             std::string(kArgValue), std::string(kArgValueEnd)}; break;
    case ReplyFormat::minimax: out.specials = {std::string(kMmCall), std::string(kMmCallEnd)}; break;
    case ReplyFormat::hermes: out.specials = {std::string(kToolCall), std::string(kToolCallEnd)}; break;
    case ReplyFormat::llama3: break;
  }
  return out;
}

}  // namespace sluice::server
