// The token constraints of requests: `response_format` (json_object, json_schema) and tool
// calls forced by `tool_choice` ("required" or a named function), as grammars over the
// model's vocabulary (engine/token_mask.h). Compiled grammars and their masks are kept by
// the text they were made from (the last 16), so a schema sent again starts warm.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/token_mask.h"
#include "format/tokenizer.h"
#include "reply_formats.h"

namespace sluice::server {

class StructuredOutput {
 public:
  explicit StructuredOutput(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  // response_format as parse_request checked it (json_object, or json_schema with its
  // schema). Throws Error(invalid_argument) naming what the grammar compiler refused.
  std::shared_ptr<TokenConstraint> response_format(const nlohmann::json& format, std::optional<int32_t> eos_id);
  // A reply of tool calls in the family's format (reply_formats.h).
  std::shared_ptr<TokenConstraint> forced_calls(ReplyFormat f, const nlohmann::json& tools,
                                                const std::optional<std::string>& name, bool parallel,
                                                std::optional<int32_t> eos_id);

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<GrammarMatcher> matcher;
  };
  std::shared_ptr<GrammarMatcher> matcher(const std::string& key, const std::function<ForcedCalls()>& make);
  std::shared_ptr<const TokenVocabulary> vocab();

  Tokenizer tokenizer_;
  std::mutex mu_;
  std::shared_ptr<const TokenVocabulary> vocab_;  // built on first use
  std::list<Entry> lru_;                          // most recent first
};

}  // namespace sluice::server
