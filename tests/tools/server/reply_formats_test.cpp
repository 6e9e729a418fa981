// Reasoning and tool calls per family (tools/server/reply_formats.h) on hand-written replies
// in each family's published format: the whole reply's split, and the streamed split at every
// chunking of the same reply (the same reasoning, content and calls; no piece of a marker
// emitted); the format chosen by family and template.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/reply_formats.h"

using namespace sluice::server;
using nlohmann::json;

namespace {

struct Case {
  ReplyFormat format;
  std::string reply;
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  bool reasoning_open = false;
};

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
  "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");

std::vector<Case> cases() {
  return {
      {ReplyFormat::hermes,
       "<think>\nThe user wants weather.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
       "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Rome\"}}\n</tool_call>",
       "\nThe user wants weather.\n", "Checking.", {{"get_weather", R"({"city":"Paris","days":2})"}, {"get_weather", R"({"city":"Rome"})"}}},
      {ReplyFormat::hermes, "I think so.\n</think>\n\nYes: 42.", "I think so.\n", "Yes: 42.", {}, true},
      {ReplyFormat::hermes, "No thinking, no calls <tool_", "", "No thinking, no calls <tool_", {}},
      {ReplyFormat::harmony,
       "<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}",
       "Need the weather tool.", "", {{"get_weather", R"({"city":"Oslo"})"}}},
      {ReplyFormat::harmony,
       "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.",
       "Simple.", "It is 4.", {}},
      {ReplyFormat::llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\", \"days\": 1}}", "", "",
       {{"get_weather", R"({"city":"Lima","days":1})"}}},
      {ReplyFormat::llama3,
       "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"A\"}}; {\"name\": \"get_weather\", "
       "\"parameters\": {\"city\": \"B\"}}",
       "", "", {{"get_weather", R"({"city":"A"})"}, {"get_weather", R"({"city":"B"})"}}},
      {ReplyFormat::llama3, "The capital is {Paris}.", "", "The capital is {Paris}.", {}},
      {ReplyFormat::deepseek,
       "<think>Look it up.</think>Let me check."
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Kyiv\"}\n```"
       "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Baku\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "Look it up.", "Let me check.", {{"get_weather", R"({"city":"Kyiv"})"}, {"get_weather", R"({"city":"Baku"})"}}},
      {ReplyFormat::glm45,
       "<think>Two days.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>New York</arg_value>\n"
       "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
       "Two days.", "", {{"get_weather", R"({"city":"New York","days":2})"}}},
      {ReplyFormat::minimax,
       "<think>Hmm.</think>\nSure.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">123</parameter>\n"
       "<parameter name=\"days\">3</parameter>\n</invoke>\n</minimax:tool_call>",
       "Hmm.", "Sure.", {{"get_weather", R"({"city":"123","days":3})"}}},
  };
}

void expect_case(const Case& c, const ParsedReply& p, const std::string& how) {
  EXPECT_EQ(p.reasoning, c.reasoning) << how << ": " << c.reply;
  EXPECT_EQ(p.content, c.content) << how << ": " << c.reply;
  ASSERT_EQ(p.calls.size(), c.calls.size()) << how << ": " << c.reply;
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(p.calls[i].name, c.calls[i].first) << how;
    EXPECT_EQ(p.calls[i].arguments, c.calls[i].second) << how;
  }
}

}  // namespace

TEST(ReplyFormats, WholeReplies) {
  for (const Case& c : cases()) {
    ReplyOptions o;
    o.tools = kTools;
    o.reasoning_open = c.reasoning_open;
    expect_case(c, parse_reply(c.format, c.reply, o), reply_format_name(c.format));
  }
}

// Every split of each reply into three chunks, and token-sized pieces: what the stream emits
// adds up to the whole reply's parse, and no emitted text holds a piece of a marker.
TEST(ReplyFormats, StreamedAtEveryChunking) {
  for (const Case& c : cases()) {
    ReplyOptions o;
    o.tools = kTools;
    o.reasoning_open = c.reasoning_open;
    const size_t n = c.reply.size();
    const size_t step = std::max<size_t>(1, n / 40);
    for (size_t a = 0; a <= n; a += step)
      for (size_t b = a; b <= n; b += step) {
        ReplyStream s(c.format, o);
        ParsedReply got;
        auto add = [&](const ReplyStream::Delta& d) {
          got.reasoning += d.reasoning;
          got.content += d.content;
          for (const ToolCall& t : d.calls) got.calls.push_back(t);
          if (c.content.find('<') != std::string::npos) return;  // markers in the expected text itself
          for (const std::string& piece : {d.reasoning, d.content})
            for (const char* m : {"<tool_call", "<think", "</think", "<|", "<｜", "<minimax", "<arg_"})
              EXPECT_EQ(piece.find(m), std::string::npos) << reply_format_name(c.format) << " emitted '" << piece << "'";
        };
        add(s.push(c.reply.substr(0, a)));
        add(s.push(c.reply.substr(a, b - a)));
        add(s.push(c.reply.substr(b)));
        add(s.finish());
        expect_case(c, got, std::string(reply_format_name(c.format)) + " chunked at " + std::to_string(a) + "," + std::to_string(b));
      }
  }
}

TEST(ReplyFormats, InlineReasoningAndNoTools) {
  ReplyOptions o;
  o.reasoning_inline = true;
  ParsedReply p = parse_reply(ReplyFormat::hermes, "<think>hm</think>\n\nOK", o);
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "<think>hm</think>\n\nOK");
  o = {};
  o.parse_calls = false;
  p = parse_reply(ReplyFormat::hermes, "<tool_call>{\"name\": \"f\"}</tool_call>", o);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "<tool_call>{\"name\": \"f\"}</tool_call>");
}

TEST(ReplyFormats, ChosenByFamilyAndTemplate) {
  EXPECT_EQ(reply_format_for("gpt_oss", ""), ReplyFormat::harmony);
  EXPECT_EQ(reply_format_for("deepseek_v3", ""), ReplyFormat::deepseek);
  EXPECT_EQ(reply_format_for("glm4_moe", ""), ReplyFormat::glm45);
  EXPECT_EQ(reply_format_for("minimax_m2", ""), ReplyFormat::minimax);
  EXPECT_EQ(reply_format_for("llama4", ""), ReplyFormat::llama3);
  EXPECT_EQ(reply_format_for("qwen3_moe", ""), ReplyFormat::hermes);
  EXPECT_EQ(reply_format_for("mixtral", "{{ '<tool_call>' }}"), ReplyFormat::hermes);
  EXPECT_EQ(reply_format_for("mixtral", "{{ messages }}"), std::nullopt);
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
}
