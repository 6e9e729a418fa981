// Tool calls in a generated reply, in the format of the Qwen and Hermes chat templates (the
// families sluice serves): each call is `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
// after any text. parse_tool_calls splits a whole reply; ToolCallStream does it while the
// reply streams, emitting the text before the first call as it comes and holding back a
// partial `<tool_call>` so a client never sees a piece of one.
#pragma once

#include <string>
#include <vector>

namespace sluice::server {

constexpr const char* kToolCallOpen = "<tool_call>";
constexpr const char* kToolCallClose = "</tool_call>";

// Whether a chat template writes tool calls in this format (it names the tag).
bool template_has_tool_calls(const std::string& template_source);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object's text (OpenAI sends arguments as a string)
};

struct ParsedReply {
  std::string content;          // the text before the first call (trailing whitespace dropped when there are calls)
  std::vector<ToolCall> calls;  // empty: the reply is all content
  std::string reasoning;        // the reasoning of models that think (reply_formats.h)
};

// A reply whose calls do not all parse (not JSON, no string "name", arguments neither an
// object nor a string holding one) is left whole as content: the client sees what the model
// wrote rather than a call it did not make. A last call cut off by max_tokens is content too.
ParsedReply parse_tool_calls(const std::string& reply);

class ToolCallStream {
 public:
  // Appends generated text; returns the content that is now safe to emit.
  std::string push(const std::string& text);
  // At the end of the reply: the content still held back and the calls (parse_tool_calls of
  // the whole reply; when the calls do not parse, the held text comes back as content).
  ParsedReply finish();

 private:
  std::string reply_;    // everything pushed
  size_t emitted_ = 0;   // bytes of reply_ returned as content
  bool in_call_ = false; // the first `<tool_call>` has appeared
};

}  // namespace sluice::server
