// GeneratedText: the text of generated ids as it completes (StreamDecoder: never half a
// UTF-8 character). An id the tokenizer does not know, a padded row of an output layer larger
// than the tokenizer (Qwen3's 151936 rows for 151669 tokens), decodes to nothing with one
// warning per run: it never ends a generation with an error. (The generator masks those ids
// before sampling when it knows the tokenizer's size, so this is the backstop.)
#pragma once

#include <cstdint>
#include <string>

#include "format/tokenizer.h"

namespace sluice {

class GeneratedText {
 public:
  explicit GeneratedText(const Tokenizer& tokenizer);
  std::string push(int32_t id);  // the text that is now complete
  std::string flush();           // what remains (an incomplete tail as U+FFFD)
  int64_t unknown_ids() const { return unknown_ids_; }  // ids that decoded to nothing

 private:
  StreamDecoder decoder_;
  int32_t n_tokens_;  // the tokenizer's vocab_size()
  int64_t unknown_ids_ = 0;
};

}  // namespace sluice
