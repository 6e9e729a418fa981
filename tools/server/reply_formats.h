// How each family writes its reasoning and its tool calls, chosen by the model's family
// (config.json model_type) and its chat template:
//
//   hermes    Qwen, Hermes: <think>R</think>, then <tool_call>{"name": N, "arguments": {...}}</tool_call>
//   harmony   gpt-oss: <|channel|>analysis<|message|>R<|end|>, <|channel|>final<|message|>C,
//             calls <|channel|>commentary to=functions.N <|constrain|>json<|message|>{...}<|call|>
//   llama3    Llama 3.x / 4: the reply is {"name": N, "parameters": {...}} (after an optional
//             <|python_tag|>; several joined by ';')
//   deepseek  DeepSeek-V3 / R1: <think>R</think>, <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>
//             function<｜tool▁sep｜>N\n```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//             (V3.1's N<｜tool▁sep｜>{...} too)
//   glm45     GLM-4.5: <think>R</think>, <tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>
//   minimax   MiniMax-M2: <think>R</think>, <minimax:tool_call>\n<invoke name="N">\n
//             <parameter name="K">V</parameter>...</invoke>\n</minimax:tool_call>
//
// parse_reply splits a whole reply into reasoning, content and calls; ReplyStream does it as
// the reply streams (reasoning and content as they come, each call once it is complete, no
// piece of a marker ever emitted). forced_call_grammar is the grammar of a reply that is one
// or more calls in the family's format (tool_choice "required" or a named function), their
// arguments following the tools' parameter schemas.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grammar.h"
#include "tool_calls.h"

namespace sluice::server {

enum class ReplyFormat { hermes, harmony, llama3, deepseek, glm45, minimax };

// The format of a model: its family first, then the markers its chat template writes;
// nullopt when neither says (such a model's replies are plain content).
std::optional<ReplyFormat> reply_format_for(const std::string& model_type, const std::string& template_source);
const char* reply_format_name(ReplyFormat f);
// Whether the format's markers are special tokens the text must keep (the decoder otherwise
// drops special tokens).
bool reply_format_keeps_special(ReplyFormat f);

struct ReplyOptions {
  // The prompt ended inside <think> (the template opened it): the reply starts in reasoning.
  bool reasoning_open = false;
  // Keep reasoning inline in the content (the request asked so) instead of reasoning_content.
  bool reasoning_inline = false;
  // Look for tool calls (the request offered tools).
  bool parse_calls = true;
  // The tools offered (OpenAI form): the parameter types of formats whose values are text.
  nlohmann::json tools;
};

ParsedReply parse_reply(ReplyFormat f, const std::string& reply, const ReplyOptions& options);

// Whether a rendered prompt leaves the reply inside <think> (it ends with "<think>" and
// optional whitespace).
bool prompt_opens_reasoning(const std::string& prompt);

class ReplyStream {
 public:
  ReplyStream(ReplyFormat f, ReplyOptions options) : format_(f), options_(std::move(options)) {}

  struct Delta {
    std::string reasoning, content;  // new text of each
    std::vector<ToolCall> calls;     // calls completed since the last delta
  };
  Delta push(const std::string& text);
  // The end of the reply: what was held back, and the calls not yet emitted.
  Delta finish();
  size_t calls_emitted() const { return calls_emitted_; }

 private:
  Delta diff(const ParsedReply& p);

  ReplyFormat format_;
  ReplyOptions options_;
  std::string text_;
  size_t reasoning_emitted_ = 0, content_emitted_ = 0, calls_emitted_ = 0;
};

// The grammar of a reply made of tool calls: one call of `name` (when set), else one or more
// calls (one at most unless parallel) of any of the tools. Throws Error(invalid_argument)
// naming the tool when a parameter schema is not supported, or when name is not a tool.
struct ForcedCalls {
  std::shared_ptr<const Grammar> grammar;
  std::vector<std::string> specials;  // special tokens the grammar writes (their content)
};
ForcedCalls forced_call_grammar(ReplyFormat f, const nlohmann::json& tools, const std::optional<std::string>& name,
                                bool parallel);

}  // namespace sluice::server
