// ChatTemplate and load_chat_template: where a model directory's template comes from
// (tokenizer_config.json as a string or a named list, chat_template.jinja), the special
// tokens, the variables a render passes, and one-line errors that name the file, the line
// and the problem.
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "format/chat_template.h"
#include "tests/format/format_test_util.h"

namespace {

using namespace sluice;
using sluice::test::expect_error;
using sluice::test::ScratchDir;
using sluice::test::write_bytes;

const char* const kSimple = "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}";

void write_config(const ScratchDir& dir, const nlohmann::json& config) { write_bytes(dir / "tokenizer_config.json", config.dump()); }

std::string render_simple(const ModelChatTemplate& model) {
  ChatRenderOptions options;
  options.bos_token = model.bos_token;
  return model.tmpl.render(std::vector<ChatTurn>{{"user", "hi"}}, options);
}

TEST(ChatTemplateLoad, TemplateAsAString) {
  ScratchDir dir;
  write_config(dir, {{"chat_template", kSimple}, {"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}, {"lstrip", false}}}});
  const auto model = load_chat_template(dir.path());
  ASSERT_TRUE(model);
  EXPECT_EQ(model->bos_token, "<s>");
  EXPECT_EQ(model->eos_token, "</s>");
  EXPECT_EQ(model->tmpl.source(), kSimple);
  EXPECT_EQ(render_simple(*model), "<s>[user:hi]>");
}

TEST(ChatTemplateLoad, NamedTemplatesTakeTheDefault) {
  ScratchDir dir;
  write_config(dir, {{"chat_template", {{{"name", "tool_use"}, {"template", "TOOLS"}}, {{"name", "default"}, {"template", kSimple}}}},
                     {"bos_token", nullptr}});
  const auto model = load_chat_template(dir.path());
  ASSERT_TRUE(model);
  EXPECT_EQ(model->bos_token, "");
  EXPECT_EQ(render_simple(*model), "[user:hi]>");
}

TEST(ChatTemplateLoad, NamedTemplatesWithoutDefault) {
  ScratchDir dir;
  write_config(dir, {{"chat_template", {{{"name", "tool_use"}, {"template", "T"}}, {{"name", "rag"}, {"template", "R"}}}}});
  expect_error([&] { load_chat_template(dir.path()); }, Status::corrupt, {"tokenizer_config.json", "no template named \"default\"", "tool_use, rag"});
}

TEST(ChatTemplateLoad, JinjaFileWhenTheConfigHasNone) {
  ScratchDir dir;
  write_config(dir, {{"bos_token", "<bos>"}});
  write_bytes(dir / "chat_template.jinja", std::string(kSimple) + "\n");
  const auto model = load_chat_template(dir.path());
  ASSERT_TRUE(model);
  EXPECT_EQ(model->bos_token, "<bos>");
  EXPECT_EQ(render_simple(*model), "<bos>[user:hi]>");
}

TEST(ChatTemplateLoad, JinjaFileAlone) {
  ScratchDir dir;
  write_bytes(dir / "chat_template.jinja", kSimple);
  const auto model = load_chat_template(dir.path());
  ASSERT_TRUE(model);
  EXPECT_EQ(model->bos_token, "");
  EXPECT_EQ(render_simple(*model), "[user:hi]>");
}

TEST(ChatTemplateLoad, TheConfigWinsOverTheJinjaFile) {
  ScratchDir dir;
  write_config(dir, {{"chat_template", "config"}});
  write_bytes(dir / "chat_template.jinja", "file");
  const auto model = load_chat_template(dir.path());
  ASSERT_TRUE(model);
  EXPECT_EQ(model->tmpl.render(std::vector<ChatTurn>{}, {}), "config");
}

TEST(ChatTemplateLoad, NoTemplate) {
  ScratchDir dir;
  EXPECT_FALSE(load_chat_template(dir.path()).has_value());
  write_config(dir, {{"eos_token", "</s>"}, {"chat_template", nullptr}});
  EXPECT_FALSE(load_chat_template(dir.path()).has_value());
}

TEST(ChatTemplateLoad, BrokenTemplateInTheConfig) {
  ScratchDir dir;
  write_config(dir, {{"chat_template", "{% for m in messages %}\n{{ m.content }\n{% endfor %}"}});
  const std::string message = expect_error([&] { load_chat_template(dir.path()); }, Status::corrupt,
                                           {"tokenizer_config.json", "chat template: line 2:", "'}}'"});
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(ChatTemplateLoad, BrokenTemplateFile) {
  ScratchDir dir;
  write_bytes(dir / "chat_template.jinja", "ok\n{% if x %}\nnever closed\n");
  const std::string message = expect_error([&] { load_chat_template(dir.path()); }, Status::corrupt,
                                           {"chat_template.jinja", "line 2", "{% if %}", "never closed", "{% endif %}"});
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(ChatTemplateLoad, MalformedConfig) {
  ScratchDir dir;
  write_config(dir, {{"chat_template", 5}});
  expect_error([&] { load_chat_template(dir.path()); }, Status::corrupt, {"chat_template must be a string or a list"});
  write_config(dir, {{"chat_template", "x"}, {"bos_token", 7}});
  expect_error([&] { load_chat_template(dir.path()); }, Status::corrupt, {"bos_token must be a string"});
  write_config(dir, {{"chat_template", {1, 2}}});
  expect_error([&] { load_chat_template(dir.path()); }, Status::corrupt, {"each entry of the list"});
  write_bytes(dir / "tokenizer_config.json", "{\"chat_template\": ");
  expect_error([&] { load_chat_template(dir.path()); }, Status::corrupt, {"tokenizer_config.json", "invalid JSON"});
}

TEST(ChatTemplateRender, TurnsAndJsonAgree) {
  const ChatTemplate t = ChatTemplate::parse("{% for m in messages %}{{ m|tojson }};{% endfor %}{{ add_generation_prompt }}{{ eos_token }}");
  ChatRenderOptions options;
  options.add_generation_prompt = false;
  options.eos_token = "</s>";
  const std::vector<ChatTurn> turns = {{"user", "a\"b"}, {"assistant", "c"}};
  const std::string from_turns = t.render(turns, options);
  EXPECT_EQ(from_turns, R"({"role": "user", "content": "a\"b"};{"role": "assistant", "content": "c"};false</s>)");
  EXPECT_EQ(t.render_json(nlohmann::json::parse(R"([{"role": "user", "content": "a\"b"}, {"role": "assistant", "content": "c"}])"), options),
            // nlohmann::json sorts keys; ordered_json (and the ChatTurn form) keep them
            R"({"content": "a\"b", "role": "user"};{"content": "c", "role": "assistant"};false</s>)");
  EXPECT_EQ(t.render_json(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "a\"b"}, {"role": "assistant", "content": "c"}])"), options),
            from_turns);
}

TEST(ChatTemplateRender, ExtraVariablesAndKeyOrder) {
  const ChatTemplate t = ChatTemplate::parse("{{ tools|tojson }}|{{ enable_thinking }}|{{ schema|tojson }}");
  ChatRenderOptions options;
  options.extra["tools"] = nlohmann::json::parse(R"([{"type": "function", "name": "f"}])");
  options.extra["enable_thinking"] = false;
  options.extra_ordered["schema"] = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {}})");
  EXPECT_EQ(t.render(std::vector<ChatTurn>{}, options), R"([{"name": "f", "type": "function"}]|false|{"type": "object", "properties": {}})");
}

TEST(ChatTemplateRender, ReservedAndGlobalNamesAreRefused) {
  const ChatTemplate t = ChatTemplate::parse("x");
  ChatRenderOptions options;
  options.extra["messages"] = 1;
  expect_error([&] { t.render(std::vector<ChatTurn>{}, options); }, Status::invalid_argument, {"extra", "'messages'", "set by render"});
  options = {};
  options.extra_ordered["range"] = 1;
  expect_error([&] { t.render(std::vector<ChatTurn>{}, options); }, Status::invalid_argument, {"'range'", "already declared"});
  options = {};
  options.extra = 3;
  expect_error([&] { t.render(std::vector<ChatTurn>{}, options); }, Status::invalid_argument, {"extra must be a JSON object"});
  expect_error([&] { t.render_json(nlohmann::json::object(), {}); }, Status::invalid_argument, {"messages must be a JSON array"});
}

TEST(ChatTemplateRender, DateTextFixesStrftimeNow) {
  const ChatTemplate t = ChatTemplate::parse("Today: {{ strftime_now('%d %b %Y') }}");
  ChatRenderOptions options;
  options.date_text = "26 Jul 2024";
  EXPECT_EQ(t.render(std::vector<ChatTurn>{}, options), "Today: 26 Jul 2024");
  // Without it, the local date: "Today: DD Mon YYYY".
  const std::string now = t.render(std::vector<ChatTurn>{}, {});
  ASSERT_EQ(now.size(), std::string("Today: 26 Jul 2024").size()) << now;
  EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(now[7])) && now[9] == ' ' && now[13] == ' ') << now;
}

TEST(ChatTemplateRender, ErrorsNameTheLine) {
  const ChatTemplate t = ChatTemplate::parse("{% for m in messages %}\n{% if m.role == 'robot' %}\n{{ raise_exception('no robots\\nplease') }}\n{% endif %}\n{% endfor %}");
  const std::string message = expect_error([&] { t.render(std::vector<ChatTurn>{{"robot", "beep"}}, {}); }, Status::invalid_argument,
                                           {"chat template: line 3: raise_exception: no robots\\nplease"});
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  expect_error([] { ChatTemplate::parse("a\nb\n{{ x | }}"); }, Status::invalid_argument, {"chat template: line 3:", "filter"});
}

TEST(ChatTemplateRender, InvalidUtf8IsRefused) {
  const ChatTemplate t = ChatTemplate::parse("{{ messages[0].content }}");
  expect_error([&] { t.render(std::vector<ChatTurn>{{"user", "a\xff"}}, {}); }, Status::invalid_argument, {"'messages'", "not valid UTF-8"});
  expect_error([] { ChatTemplate::parse("\xc3("); }, Status::invalid_argument, {"not valid UTF-8"});
}

// A parsed template is immutable: `sluice serve` renders one from many threads at once.
TEST(ChatTemplateRender, ConcurrentRendersAgree) {
  const ChatTemplate t = ChatTemplate::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}{{ m.role }}{% endfor %}={{ ns.n }}");
  std::vector<std::string> outputs(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    threads.emplace_back([&, i] {
      std::vector<ChatTurn> turns(50 + i, ChatTurn{"u", "abc"});
      for (int k = 0; k < 20; ++k) outputs[i] = t.render(turns, {});
    });
  }
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string want;
    for (size_t k = 0; k < 50 + i; ++k) want += "u";
    EXPECT_EQ(outputs[i], want + "=" + std::to_string(3 * (50 + i)));
  }
}

}  // namespace
