// The Jinja interpreter on what the reference cannot be compared on: hostile templates that
// would exhaust its stack or memory (sluice refuses them with an error naming the line),
// cycles, the line numbers in messages after whitespace control, and the JavaScript number
// printing it mirrors, checked by hand.
#include <gtest/gtest.h>

#include "core/error.h"
#include "format/jinja/js_number.h"
#include "format/jinja/template.h"
#include "format/jinja/value.h"
#include "tests/format/format_test_util.h"

namespace {

using namespace sluice;
using sluice::test::expect_error;

std::string render(const std::string& source) { return jinja::Template::parse(source).render({}); }

TEST(JinjaLimits, DeepNestingIsRefused) {
  const std::string parens = std::string(2000, '(') + "1" + std::string(2000, ')');
  expect_error([&] { render("{{ " + parens + " }}"); }, Status::invalid_argument, {"line 1", "nests too deeply"});
  std::string ifs;
  for (int i = 0; i < 2000; ++i) ifs += "{% if true %}";
  expect_error([&] { render(ifs); }, Status::invalid_argument, {"nests too deeply"});
}

TEST(JinjaLimits, LongChainsAreRefused) {
  std::string sum = "1";
  for (int i = 0; i < 500; ++i) sum += " + 1";
  EXPECT_EQ(render("{{ " + sum + " }}"), "501");
  for (int i = 0; i < 1000; ++i) sum += " + 1";
  expect_error([&] { render("{{ " + sum + " }}"); }, Status::invalid_argument, {"line 1", "chains more than 1000"});
  std::string filters = "'a'";
  for (int i = 0; i < 1500; ++i) filters += "|upper";
  expect_error([&] { render("{{ " + filters + " }}"); }, Status::invalid_argument, {"chains more than"});
}

TEST(JinjaLimits, UnparsedTemplateIsRefused) {
  expect_error([] { jinja::Template().render({}); }, Status::invalid_argument, {"never parsed"});
}

TEST(JinjaLimits, VariablesAreDeclaredOnce) {
  const jinja::Template t = jinja::Template::parse("{{ a }}");
  expect_error([&] { t.render({{"a", jinja::Value::integer(1)}, {"a", jinja::Value::integer(2)}}); }, Status::invalid_argument,
               {"'a'", "already declared"});
}

TEST(JinjaLimits, EndlessRecursionIsRefused) {
  expect_error([] { render("{% macro f(n) %}\n{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); }, Status::invalid_argument,
               {"line 2", "recurses too deeply"});
}

TEST(JinjaLimits, HugeRangeIsRefused) {
  expect_error([] { render("{% for i in range(1000000000) %}x{% endfor %}"); }, Status::invalid_argument, {"line 1", "range()", "too long"});
  expect_error([] { render("{{ range(0, 1 / 0) }}"); }, Status::invalid_argument, {"too long"});
}

TEST(JinjaLimits, SelfContainingNamespaceIsRefused) {
  expect_error([] { render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"); }, Status::invalid_argument, {"nested too deeply"});
  // Rendering it without printing works and frees it (the sweep at the end of the render).
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me is defined }}"), "true");
}

TEST(JinjaLimits, PrintingAFunctionIsRefused) {
  // The reference prints the JavaScript source of the function; sluice has none to print.
  expect_error([] { render("\n{{ range }}"); }, Status::invalid_argument, {"line 2", "cannot print a function"});
  expect_error([] { render("{{ 'a'.upper ~ 'b' }}"); }, Status::invalid_argument, {"function"});
}

TEST(JinjaLimits, LinesSurviveWhitespaceControl) {
  // trim_blocks and lstrip_blocks remove newlines and indentation; the lines stay the original ones.
  const std::string source = "{% for m in messages %}\n    {%- if m %}\n        {{- m.content | nosuch }}\n    {%- endif %}\n{% endfor %}";
  const jinja::Template t = jinja::Template::parse(source);
  jinja::Variables vars = {{"messages", jinja::value_from_json(nlohmann::json::parse(R"([{"content": "x"}])"), "messages")}};
  expect_error([&] { t.render(vars); }, Status::invalid_argument, {"line 3: unknown filter 'nosuch' for a string"});
  expect_error([] { jinja::Template::parse("a\n\n  {% if x %}\n{% endfor %}"); }, Status::invalid_argument, {"line 4"});
  expect_error([] { jinja::Template::parse("a\n{{ 'x\ny' }}\n{{ 'open }}"); }, Status::invalid_argument, {"line 4", "unterminated string"});
  expect_error([] { jinja::Template::parse("{# a\nb #}\n{% generation %}\n{{ 1 +* 2 }}"); }, Status::invalid_argument, {"line 4"});
}

TEST(JinjaLimits, JavaScriptNumberPrinting) {
  EXPECT_EQ(jinja::js_number_to_string(1e21), "1e+21");
  EXPECT_EQ(jinja::js_number_to_string(1152921504606846976.0), "1152921504606847000");
  EXPECT_EQ(jinja::js_number_to_string(0.000001), "0.000001");
  EXPECT_EQ(jinja::js_number_to_string(1e-7), "1e-7");
  EXPECT_EQ(jinja::js_number_to_string(-0.0), "0");
  EXPECT_EQ(jinja::js_number_to_string(1.5e300), "1.5e+300");
  EXPECT_EQ(jinja::js_number_to_string(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(jinja::js_float_to_string(-0.0), "-0.0");
  EXPECT_EQ(jinja::js_float_to_string(2), "2.0");
  EXPECT_EQ(jinja::js_float_to_string(123456789012345680000.0), "123456789012345683968.0");
  EXPECT_EQ(jinja::js_float_to_string(1e21), "1e+21");
  EXPECT_EQ(jinja::js_parse_int("  -12abc"), -12);
  EXPECT_TRUE(std::isnan(jinja::js_parse_int("x1")));
  EXPECT_EQ(jinja::js_parse_float(" .5e3x"), 500);
  EXPECT_EQ(jinja::js_string_to_number(" 0x1F "), 31);
  EXPECT_TRUE(std::isnan(jinja::js_string_to_number("+0x1")));
  EXPECT_EQ(jinja::js_string_to_number(""), 0);
}

TEST(JinjaLimits, LocaleCompareOrdersAsciiLikeIcu) {
  // node: ["_a","a","A","a_","a1","a10","a9","ab","aB","Ab","b","B"].sort(localeCompare)
  std::vector<std::string> keys = {"b", "B", "ab", "aB", "Ab", "a", "A", "_a", "a_", "a1", "a10", "a9"};
  std::stable_sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) { return jinja::locale_compare(a, b) < 0; });
  EXPECT_EQ(keys, (std::vector<std::string>{"_a", "a", "A", "a_", "a1", "a10", "a9", "ab", "aB", "Ab", "b", "B"}));
}

}  // namespace
