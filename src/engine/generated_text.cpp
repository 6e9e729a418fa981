// GeneratedText (see generated_text.h).
#include "engine/generated_text.h"

#include "core/log.h"

namespace sluice {

GeneratedText::GeneratedText(const Tokenizer& tokenizer) : decoder_(tokenizer), n_tokens_(tokenizer.vocab_size()) {}

std::string GeneratedText::push(int32_t id) {
  if (id >= 0 && id < n_tokens_) return decoder_.push(id);
  if (unknown_ids_++ == 0)
    LOG_WARN("token id ", id, " is outside the tokenizer's ", n_tokens_,
             " tokens (a padded row of the output layer): it prints as nothing (warned once per run)");
  return {};
}

std::string GeneratedText::flush() { return decoder_.flush(); }

}  // namespace sluice
