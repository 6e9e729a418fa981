// Parsing and checking OpenAI request bodies; building responses, chunks and errors.
#include "openai_api.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace sluice::server {

using nlohmann::json;

json ApiError::to_json() const {
  return {{"error",
           {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

namespace {

[[noreturn]] void bad(std::string message, std::string code = "invalid_value") {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.code = std::move(code);
  throw e;
}

const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t integer_field(const json& v, const char* name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer() && !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
    bad(str("'", name, "' must be an integer"), "invalid_type");
  const double d = v.get<double>();
  if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi)))
    bad(str("'", name, "' is ", v.dump(), "; expected an integer from ", lo, " to ", hi));
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(d);
}

double number_field(const json& v, const char* name, double lo, double hi, bool lo_open = false) {
  if (!v.is_number()) bad(str("'", name, "' must be a number"), "invalid_type");
  const double d = v.get<double>();
  if (!(lo_open ? d > lo : d >= lo) || !(d <= hi))
    bad(str("'", name, "' is ", v.dump(), "; expected a number ", lo_open ? "above " : "from ", lo, lo_open ? " and at most " : " to ", hi));
  return d;
}

bool bool_field(const json& v, const char* name) {
  if (!v.is_boolean()) bad(str("'", name, "' must be true or false"), "invalid_type");
  return v.get<bool>();
}

// Rejects a field the server does not implement when it asks for more than the default.
void unsupported_if(bool cond, const std::string& what) {
  if (cond) bad(what + " is not supported by sluice", "unsupported");
}

// Whether v is an object whose "function" is an object with a string "name" (a tool, or a
// tool call).
bool names_a_function(const json& v) {
  const json* fn = v.is_object() ? field(v, "function") : nullptr;
  return fn && fn->is_object() && fn->contains("name") && (*fn)["name"].is_string();
}

std::string text_content(const json& content, size_t index) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {  // content parts: text only
    std::string out;
    for (const json& part : content) {
      if (!has_type(part, "text") || !part.contains("text") || !part["text"].is_string())
        bad(str("messages[", index, "].content: only text parts are supported"), "unsupported");
      out += part["text"].get<std::string>();
    }
    return out;
  }
  bad(str("messages[", index, "].content must be a string or a list of text parts"), "invalid_type");
}

}  // namespace

ParsedRequest parse_request(const json& body, Endpoint endpoint, const SamplingParams& defaults,
                            const RequestLimits& limits) {
  if (!body.is_object()) bad("the request body must be a JSON object", "invalid_type");
  ParsedRequest r;
  r.endpoint = endpoint;
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) bad("'model' must be a string", "invalid_type");
    r.model = m->get<std::string>();
  }
  if (endpoint == Endpoint::completions) {
    const json* p = field(body, "prompt");
    if (!p) bad("'prompt' is required", "missing_field");
    if (p->is_string()) {
      r.prompt_text = p->get<std::string>();
    } else if (p->is_array() && !p->empty() && (*p)[0].is_number_integer()) {
      if (p->size() > limits.max_prompt_ids)
        bad(str("'prompt' holds ", p->size(), " token ids; the context holds ", limits.max_prompt_ids),
            "context_length_exceeded");
      for (const json& t : *p) r.prompt_ids.push_back(static_cast<int32_t>(integer_field(t, "prompt", 0, (1LL << 31) - 1)));
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
      r.prompt_text = (*p)[0].get<std::string>();
    } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
      bad("'prompt' as token ids must hold integers (found " + (*p)[0].dump() + ")", "invalid_type");
    } else if (p->is_array() && p->size() > 1 && (*p)[0].is_string()) {
      bad("'prompt' holds several prompts; one request takes one (send several requests)", "unsupported");
    } else {
      bad("'prompt' must be a string, a list of one string, or a list of token ids", "invalid_type");
    }
    unsupported_if(field(body, "echo") && bool_field(*field(body, "echo"), "echo"), "'echo'");
    unsupported_if(field(body, "suffix") != nullptr, "'suffix'");
    unsupported_if(field(body, "logprobs") != nullptr, "'logprobs'");
    if (const json* b = field(body, "best_of")) unsupported_if(integer_field(*b, "best_of", 1, 1 << 20) != 1, "'best_of' above 1");
  } else {
    const json* msgs = field(body, "messages");
    if (!msgs) bad("'messages' is required", "missing_field");
    if (!msgs->is_array() || msgs->empty()) bad("'messages' must be a non-empty list", "invalid_type");
    if (msgs->size() > limits.max_messages)
      bad(str("'messages' holds ", msgs->size(), " messages; the context holds ", limits.max_messages,
              " tokens and every message takes at least one"),
          "context_length_exceeded");
    for (size_t i = 0; i < msgs->size(); ++i) {
      const json& m = (*msgs)[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        bad(str("messages[", i, "] must be an object with a 'role' string"), "invalid_type");
      ChatMessage cm;
      cm.role = m["role"].get<std::string>();
      if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "developer" &&
          cm.role != "tool")
        bad(str("messages[", i, "].role '", cm.role, "' is not supported (system, developer, user, assistant, tool)"),
            "unsupported");
      if (m.contains("content") && !m["content"].is_null()) cm.content = text_content(m["content"], i);
      if (const json* tc = field(m, "tool_calls")) {
        if (cm.role != "assistant") bad(str("messages[", i, "].tool_calls: only an assistant message makes tool calls"));
        if (!tc->is_array()) bad(str("messages[", i, "].tool_calls must be a list"), "invalid_type");
        for (size_t c = 0; c < tc->size(); ++c)
          if (!names_a_function((*tc)[c]))
            bad(str("messages[", i, "].tool_calls[", c, "] must be {type: \"function\", function: {name, arguments}}"),
                "invalid_type");
        cm.tool_calls = *tc;
      }
      if (const json* id = field(m, "tool_call_id")) {
        if (!id->is_string()) bad(str("messages[", i, "].tool_call_id must be a string"), "invalid_type");
        cm.tool_call_id = id->get<std::string>();
      }
      r.messages.push_back(std::move(cm));
    }
    if (const json* tools = field(body, "tools")) {
      if (!tools->is_array()) bad("'tools' must be a list", "invalid_type");
      for (size_t t = 0; t < tools->size(); ++t) {
        const json& tool = (*tools)[t];
        if (!names_a_function(tool) || !has_type(tool, "function"))
          bad(str("tools[", t, "] must be {type: \"function\", function: {name, description, parameters}}"),
              "invalid_type");
        const json& fn = tool["function"];
        if (fn["name"].get<std::string>().empty()) bad(str("tools[", t, "].function.name is empty"));
        if (const json* params = field(fn, "parameters"); params && !params->is_object())
          bad(str("tools[", t, "].function.parameters must be a JSON schema object"), "invalid_type");
      }
      if (!tools->empty()) r.tools = *tools;
    }
    if (const json* tc = field(body, "tool_choice")) {
      if (tc->is_object()) {
        const json* fn = field(*tc, "function");
        if (!has_type(*tc, "function") || !fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
          bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {type: \"function\", function: {name}}",
              "invalid_type");
        r.tool_choice_name = (*fn)["name"].get<std::string>();
      } else if (tc->is_string()) {
        const std::string choice = tc->get<std::string>();
        if (choice != "auto" && choice != "none" && choice != "required")
          bad(str("'tool_choice' is '", choice, "'; expected none, auto or required"));
        r.tool_choice_none = choice == "none";
        r.tool_choice_required = choice == "required";
      } else {
        bad("'tool_choice' must be a string or an object", "invalid_type");
      }
      if ((r.tool_choice_required || r.tool_choice_name) && r.tools.is_null())
        bad("'tool_choice' asks for a tool call but 'tools' is empty", "invalid_value");
    }
    if (const json* ptc = field(body, "parallel_tool_calls")) r.parallel_tool_calls = bool_field(*ptc, "parallel_tool_calls");
    unsupported_if(field(body, "functions") != nullptr, "'functions' (use 'tools')");
    if (const json* lp = field(body, "logprobs")) unsupported_if(bool_field(*lp, "logprobs"), "'logprobs'");
    unsupported_if(field(body, "top_logprobs") != nullptr, "'top_logprobs'");
    if (const json* rfmt = field(body, "reasoning_format")) {
      if (!rfmt->is_string()) bad("'reasoning_format' must be a string", "invalid_type");
      const std::string v = rfmt->get<std::string>();
      if (v == "none" || v == "inline") r.reasoning_inline = true;
      else if (v != "auto" && v != "deepseek" && v != "separate" && v != "parsed")
        bad(str("'reasoning_format' is '", v, "'; expected auto (reasoning_content) or none (inline)"));
    }
    if (const json* mc = field(body, "max_completion_tokens"))
      r.max_tokens = integer_field(*mc, "max_completion_tokens", 0, std::numeric_limits<int32_t>::max());
  }
  // Structured output, both endpoints: the reply's text under the format's grammar.
  if (const json* rf = field(body, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      bad("'response_format' must be an object with a 'type' (text, json_object or json_schema)", "invalid_type");
    const std::string type = (*rf)["type"].get<std::string>();
    if (type == "json_schema") {
      const json* js = field(*rf, "json_schema");
      if (!js || !js->is_object()) bad("'response_format.json_schema' must be an object {name, schema}", "invalid_type");
      const json* schema = field(*js, "schema");
      if (schema && !schema->is_object() && !schema->is_boolean())
        bad("'response_format.json_schema.schema' must be a JSON schema (an object)", "invalid_type");
    } else if (type != "text" && type != "json_object") {
      bad(str("'response_format.type' is '", type, "'; expected text, json_object or json_schema"));
    }
    if (type != "text") r.response_format = *rf;
    if (type != "text" && (r.tool_choice_required || r.tool_choice_name))
      unsupported_if(true, "'response_format' together with a 'tool_choice' that forces a call");
  }
  if (const json* n = field(body, "n")) unsupported_if(integer_field(*n, "n", 1, 1 << 20) != 1, "'n' above 1");
  if (const json* mt = field(body, "max_tokens")) r.max_tokens = integer_field(*mt, "max_tokens", 0, std::numeric_limits<int32_t>::max());
  for (const char* pen : {"presence_penalty", "frequency_penalty"})
    if (const json* v = field(body, pen)) unsupported_if(number_field(*v, pen, -2, 2) != 0, str("'", pen, "'"));
  if (const json* lb = field(body, "logit_bias")) unsupported_if(!lb->is_object() || !lb->empty(), "'logit_bias'");
  // Sampling: the server's defaults, top_k as llama-server takes it.
  r.sampling = defaults;
  if (const json* t = field(body, "temperature")) r.sampling.temperature = static_cast<float>(number_field(*t, "temperature", 0, 2));
  if (const json* t = field(body, "top_p")) {
    r.sampling.top_p = static_cast<float>(number_field(*t, "top_p", 0, 1, true));
    // Sampling holds it as a 32-bit float: a positive value that rounds to 0 is out of range.
    if (!(r.sampling.top_p > 0)) bad(str("'top_p' is ", t->dump(), "; expected a number above 0 and at most 1 (it is 0 as a 32-bit float)"));
  }
  if (const json* t = field(body, "top_k")) r.sampling.top_k = static_cast<int32_t>(integer_field(*t, "top_k", 0, std::numeric_limits<int32_t>::max()));
  if (const json* s = field(body, "seed")) {
    if (!s->is_number_integer()) bad("'seed' must be an integer", "invalid_type");
    r.sampling.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  if (const json* s = field(body, "stop")) {
    if (s->is_string()) {
      r.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > 4) bad("'stop' holds more than 4 strings");
      for (const json& x : *s) {
        if (!x.is_string()) bad("'stop' must be a string or a list of strings", "invalid_type");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("'stop' must be a string or a list of strings", "invalid_type");
    }
    for (const std::string& x : r.stop)
      if (x.empty()) bad("'stop' holds an empty string");
  }
  if (const json* s = field(body, "stream")) r.stream = bool_field(*s, "stream");
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("'stream_options' must be an object", "invalid_type");
    if (!r.stream) bad("'stream_options' needs 'stream': true");
    if (const json* iu = field(*so, "include_usage")) r.include_usage = bool_field(*iu, "stream_options.include_usage");
  }
  return r;
}

const char* finish_reason_text(FinishReason r) {
  switch (r) {
    case FinishReason::length: return "length";
    case FinishReason::stop:
    case FinishReason::cancelled:
    case FinishReason::error: return "stop";
  }
  return "stop";
}

json usage_json(const CompletionResult& r) {
  // cached_tokens: prompt tokens the prompt cache resumed instead of prefilling them.
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
}

namespace {

// OpenAI's tool_calls list; with_index: the streamed form (delta.tool_calls[i].index).
json tool_calls_json(const std::string& response_id, const std::vector<ToolCall>& calls, bool with_index,
                    size_t first_index = 0) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", str("call_", response_id, "_", first_index + i)},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = first_index + i;
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

json stream_tool_calls_chunk(const ResponseIds& ids, const std::vector<ToolCall>& calls, size_t first_index) {
  json choice = {{"index", 0},
                 {"delta", {{"tool_calls", tool_calls_json(ids.id, calls, true, first_index)}}},
                 {"logprobs", nullptr},
                 {"finish_reason", nullptr}};
  return {{"id", ids.id}, {"object", "chat.completion.chunk"}, {"created", ids.created}, {"model", ids.model},
          {"choices", json::array({choice})}};
}

json stream_reasoning_chunk(const ResponseIds& ids, const std::string& reasoning) {
  json choice = {{"index", 0}, {"delta", {{"reasoning_content", reasoning}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  return {{"id", ids.id}, {"object", "chat.completion.chunk"}, {"created", ids.created}, {"model", ids.model},
          {"choices", json::array({choice})}};
}

json stream_tool_calls_end(const ResponseIds& ids) {
  json choice = {{"index", 0}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", "tool_calls"}};
  return {{"id", ids.id}, {"object", "chat.completion.chunk"}, {"created", ids.created}, {"model", ids.model},
          {"choices", json::array({choice})}};
}

json completion_response(const ResponseIds& ids, Endpoint endpoint, const std::string& text, const CompletionResult& r,
                         const std::vector<ToolCall>& calls, const std::string& reasoning) {
  json choice;
  if (endpoint == Endpoint::chat && !calls.empty()) {
    choice = {{"index", 0},
              {"message",
               {{"role", "assistant"},
                {"content", text.empty() ? json(nullptr) : json(text)},
                {"tool_calls", tool_calls_json(ids.id, calls, false)}}},
              {"logprobs", nullptr},
              {"finish_reason", "tool_calls"}};
  } else if (endpoint == Endpoint::chat) {
    choice = {{"index", 0}, {"message", {{"role", "assistant"}, {"content", text}}}, {"logprobs", nullptr},
              {"finish_reason", finish_reason_text(r.reason)}};
  } else {
    choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish_reason_text(r.reason)}};
  }
  if (endpoint == Endpoint::chat && !reasoning.empty()) choice["message"]["reasoning_content"] = reasoning;
  return {{"id", ids.id},
          {"object", endpoint == Endpoint::chat ? "chat.completion" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array({choice})},
          {"usage", usage_json(r)}};
}

json stream_chunk(const ResponseIds& ids, Endpoint endpoint, const std::string& text, bool first,
                  const std::optional<FinishReason>& finish) {
  json choice;
  const json reason = finish ? json(finish_reason_text(*finish)) : json(nullptr);
  if (endpoint == Endpoint::chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (!finish && !first)) delta["content"] = text;
    if (first && text.empty() && !finish) delta["content"] = "";
    choice = {{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", reason}};
  } else {
    choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", reason}};
  }
  return {{"id", ids.id},
          {"object", endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array({choice})}};
}

json stream_usage_chunk(const ResponseIds& ids, Endpoint endpoint, const CompletionResult& r) {
  return {{"id", ids.id},
          {"object", endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array()},
          {"usage", usage_json(r)}};
}

}  // namespace sluice::server
