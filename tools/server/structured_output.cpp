// Token constraints of requests (structured_output.h).
#include "structured_output.h"

#include "core/error.h"
#include "engine/json_schema.h"

namespace sluice::server {

using nlohmann::json;

namespace {

constexpr size_t kKeep = 16;  // compiled grammars kept

}  // namespace

std::shared_ptr<const TokenVocabulary> StructuredOutput::vocab() {
  if (!vocab_) vocab_ = std::make_shared<const TokenVocabulary>(tokenizer_);
  return vocab_;
}

std::shared_ptr<GrammarMatcher> StructuredOutput::matcher(const std::string& key, const std::function<ForcedCalls()>& make) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it)
    if (it->key == key) {
      lru_.splice(lru_.begin(), lru_, it);
      return lru_.front().matcher;
    }
  ForcedCalls g = make();
  std::vector<int32_t> specials;
  for (const std::string& s : g.specials)
    if (auto id = vocab()->find(s)) specials.push_back(*id);
  auto m = std::make_shared<GrammarMatcher>(g.grammar, vocab(), std::move(specials));
  lru_.push_front({key, m});
  if (lru_.size() > kKeep) lru_.pop_back();
  return m;
}

std::shared_ptr<TokenConstraint> StructuredOutput::response_format(const json& format, std::optional<int32_t> eos_id) {
  const std::string type = format.value("type", "");
  if (type == "json_object")
    return std::make_shared<GrammarConstraint>(matcher("json_object", [] { return ForcedCalls{json_object_grammar(), {}}; }), eos_id);
  const json& js = format["json_schema"];
  const json schema = js.contains("schema") && !js["schema"].is_null() ? js["schema"] : json::object();
  return std::make_shared<GrammarConstraint>(
      matcher("schema:" + schema.dump(), [&] { return ForcedCalls{json_schema_grammar(schema), {}}; }), eos_id);
}

std::shared_ptr<TokenConstraint> StructuredOutput::forced_calls(ReplyFormat f, const json& tools,
                                                                const std::optional<std::string>& name, bool parallel,
                                                                std::optional<int32_t> eos_id) {
  const std::string key = str("calls:", reply_format_name(f), ":", name.value_or(""), ":", parallel, ":", tools.dump());
  return std::make_shared<GrammarConstraint>(matcher(key, [&] { return forced_call_grammar(f, tools, name, parallel); }), eos_id);
}

}  // namespace sluice::server
