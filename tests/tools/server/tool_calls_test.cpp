// Tool calls in replies (tools/server/tool_calls.h): whole replies with text and calls, calls
// whose JSON does not hold (left as content), a call cut off by max_tokens, and the streamed
// splitter at every chunking of the same reply (the same content and calls as the whole
// reply's parse, no piece of the tag ever emitted).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/tool_calls.h"

using namespace sluice::server;

namespace {

TEST(ToolCalls, TextThenCalls) {
  const ParsedReply p = parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>");
  EXPECT_EQ(p.content, "Let me check.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{\"tz\":\"CET\"}");  // arguments sent as a string holding an object
}

TEST(ToolCalls, NoArgumentsIsAnEmptyObject) {
  const ParsedReply p = parse_tool_calls("<tool_call>{\"name\": \"now\"}</tool_call>");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{}");
}

TEST(ToolCalls, WhatIsNotACallStaysContent) {
  for (const std::string& reply : {
           std::string("Plain text, no call."),
           std::string("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1</tool_call>"),   // not JSON
           std::string("<tool_call>{\"arguments\": {}}</tool_call>"),                        // no name
           std::string("<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>"),        // arguments a number
           std::string("<tool_call>{\"name\": \"f\", \"arguments\": {}}"),                   // cut off
           std::string("<tool_call>{\"name\": \"f\"}</tool_call> and then more text"),       // text after a call
       }) {
    const ParsedReply p = parse_tool_calls(reply);
    EXPECT_TRUE(p.calls.empty()) << reply;
    EXPECT_EQ(p.content, reply);
  }
}

TEST(ToolCalls, TemplateDetection) {
  EXPECT_TRUE(template_has_tool_calls("{{- '<tool_call>\\n' }}"));
  EXPECT_FALSE(template_has_tool_calls("{{ messages }}"));
}

// Every split of the reply into two or three pieces streams the same content (emitted plus
// finish's rest) and the same calls as the whole reply's parse: no byte of a tag or a call
// is ever emitted as content.
TEST(ToolCalls, StreamEqualsWholeAtEveryChunking) {
  const std::vector<std::string> replies = {
      "Checking <tool_cal> is not a tag.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
      "<tool_call>{\"name\": \"g\"}</tool_call>",
      "no calls at all, ending in <tool_ca",
      "broken <tool_call>{\"name\": </tool_call>",
  };
  for (const std::string& reply : replies) {
    const ParsedReply whole = parse_tool_calls(reply);
    for (size_t a = 0; a <= reply.size(); ++a)
      for (size_t b = a; b <= reply.size(); b += 3) {
        ToolCallStream s;
        std::string emitted = s.push(reply.substr(0, a));
        emitted += s.push(reply.substr(a, b - a));
        emitted += s.push(reply.substr(b));
        const ParsedReply end = s.finish();
        const std::string content = emitted + end.content;
        if (whole.calls.empty()) {
          EXPECT_EQ(content, reply) << "split " << a << ", " << b;
        } else {
          // Whitespace before the first call may already have streamed; nothing else differs.
          std::string trimmed = content;
          while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == ' ')) trimmed.pop_back();
          EXPECT_EQ(trimmed, whole.content) << "split " << a << ", " << b;
          ASSERT_EQ(end.calls.size(), whole.calls.size());
          for (size_t i = 0; i < end.calls.size(); ++i) {
            EXPECT_EQ(end.calls[i].name, whole.calls[i].name);
            EXPECT_EQ(end.calls[i].arguments, whole.calls[i].arguments);
          }
        }
      }
  }
}

}  // namespace
