// Chat messages to a prompt with the model's own chat template (tokenizer_config.json's
// `chat_template`, Jinja), rendered by sluice's interpreter of @huggingface/jinja
// (format/jinja/template.h): what `sluice serve` puts before the model. The template sees
// what transformers gives it: messages, add_generation_prompt, bos_token, eos_token and any
// further variables (tools, enable_thinking, ...).
#pragma once

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <nlohmann/json.hpp>

#include "format/jinja/template.h"

namespace sluice {

struct ChatTurn {
  std::string role, content;
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;      // as tokenizer_config.json names them (strings)
  std::optional<std::string> date_text;  // fixes strftime_now's result (tests); else the local time
  nlohmann::json extra = nlohmann::json::object();  // more template variables (tools, enable_thinking, ...)
  // The same in the caller's key order: nlohmann::json sorts object keys, so a tool schema
  // given through `extra` prints (tojson) with sorted keys. Declared after `extra`.
  nlohmann::ordered_json extra_ordered = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Syntax errors: Error(invalid_argument) "chat template: line N: reason".
  static ChatTemplate parse(std::string source);

  // Errors of the template (raise_exception, an undefined method, ...): Error(invalid_argument)
  // "chat template: line N: reason".
  std::string render(std::span<const ChatTurn> messages, const ChatRenderOptions& options) const;
  // Messages as OpenAI JSON (content strings or parts, tool_calls, reasoning_content, ...),
  // passed to the template as they are. The ordered_json form keeps the caller's key order.
  std::string render_json(const nlohmann::json& messages, const ChatRenderOptions& options) const;
  std::string render_json(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const;

  const std::string& source() const { return source_; }

 private:
  std::string render_value(jinja::Value messages, const ChatRenderOptions& options) const;

  std::string source_;
  jinja::Template template_;
};

// The template of a model directory: tokenizer_config.json's chat_template (a string, or a
// list of {name, template} where "default" is taken), else a chat_template.jinja file;
// nullopt when none. Also returns bos/eos token strings from tokenizer_config.json (they may
// be strings or {"content": ...}). A broken template or config is Error(corrupt) naming the
// file and the problem, on one line.
struct ModelChatTemplate {
  ChatTemplate tmpl;
  std::string bos_token, eos_token;
};
std::optional<ModelChatTemplate> load_chat_template(const std::filesystem::path& dir);

}  // namespace sluice
