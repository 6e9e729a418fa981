// Added tokens of tokenizer.json ("added_tokens": specials like <|im_end|> and user tokens):
// found in the text before the model sees it, as tokenizers' AddedVocabulary does it:
// leftmost-longest match, then the single_word / lstrip / rstrip adjustments.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;  // only match when not inside a word
  bool lstrip = false;       // swallow whitespace to the left
  bool rstrip = false;       // swallow whitespace to the right
  bool normalized = false;   // match in the normalized text rather than the raw text
  bool special = false;      // skipped by decode(skip_special)
};

// One matching set (tokenizers keeps two: raw-text tokens and normalized-text tokens).
class AddedTokenMatcher {
 public:
  // pattern: the text to look for (the content, normalized for normalized tokens).
  void add(std::string_view pattern, const AddedToken* token);
  bool empty() const { return nodes_.size() <= 1; }

  // Cuts text into the pieces between matches and the matched tokens, in order: on_text gets
  // every non-empty stretch of plain text, on_token every matched token.
  template <typename OnText, typename OnToken>
  void split(std::string_view text, OnText&& on_text, OnToken&& on_token) const {
    if (empty()) {
      if (!text.empty()) on_text(text);
      return;
    }
    size_t start_offset = 0;  // end of what has been emitted
    size_t from = 0;          // where the scan for the next match starts
    size_t begin = 0, end = 0;
    const AddedToken* token = nullptr;
    while (find(text, from, &begin, &end, &token)) {
      from = end;  // the automaton resumes after the raw match, whatever is done with it
      if (!adjust(text, start_offset, *token, &begin, &end)) continue;
      if (start_offset < begin) on_text(text.substr(start_offset, begin - start_offset));
      on_token(*token);
      start_offset = end;
    }
    if (start_offset < text.size()) on_text(text.substr(start_offset));
  }

 private:
  struct Node {
    const AddedToken* token = nullptr;               // a pattern ends here
    std::vector<std::pair<uint8_t, int32_t>> next;   // byte -> child node
  };
  // Leftmost, then longest, match starting at or after from.
  bool find(std::string_view text, size_t from, size_t* begin, size_t* end, const AddedToken** token) const;
  // single_word check and lstrip/rstrip widening; false when the match is discarded.
  static bool adjust(std::string_view text, size_t start_offset, const AddedToken& token, size_t* begin, size_t* end);

  std::vector<Node> nodes_{1};          // nodes_[0] is the root
  std::array<bool, 256> first_byte_{};  // bytes some pattern starts with
};

}  // namespace sluice
