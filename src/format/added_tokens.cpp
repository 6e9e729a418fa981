// Added-token matching (see added_tokens.h): a byte trie scanned from each position where
// some pattern can start, and tokenizers' single_word / lstrip / rstrip rules.
#include "format/added_tokens.h"

#include <algorithm>
#include <utf8proc.h>

#include "format/utf8.h"

namespace sluice {

namespace {

// Rust regex's Unicode \w, which tokenizers' single_word check uses: Alphabetic, marks,
// decimal digits, connector punctuation and the join controls. Alphabetic is approximated by
// the letter categories and Nl (Other_Alphabetic is mostly marks, already included).
bool is_word_char(uint32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// Start of the character that holds byte pos of valid UTF-8 text.
size_t char_begin(std::string_view text, size_t pos) {
  while (pos > 0 && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

}  // namespace

void AddedTokenMatcher::add(std::string_view pattern, const AddedToken* token) {
  if (pattern.empty()) return;  // tokenizers ignores empty added tokens
  int32_t node = 0;
  for (char ch : pattern) {
    const uint8_t c = static_cast<uint8_t>(ch);
    auto& next = nodes_[node].next;
    auto it = std::find_if(next.begin(), next.end(), [c](const auto& e) { return e.first == c; });
    if (it != next.end()) {
      node = it->second;
    } else {
      const int32_t child = static_cast<int32_t>(nodes_.size());
      next.emplace_back(c, child);
      nodes_.emplace_back();  // invalidates next; not used again
      node = child;
    }
  }
  if (!nodes_[node].token) nodes_[node].token = token;  // a repeated content keeps the first token
  first_byte_[static_cast<uint8_t>(pattern[0])] = true;
}

bool AddedTokenMatcher::find(std::string_view text, size_t from, size_t* begin, size_t* end,
                             const AddedToken** token) const {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[p[i]]) continue;
    int32_t node = 0;
    const AddedToken* best = nullptr;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto& next = nodes_[node].next;
      auto it = std::find_if(next.begin(), next.end(), [c = p[j]](const auto& e) { return e.first == c; });
      if (it == next.end()) break;
      node = it->second;
      if (nodes_[node].token) {
        best = nodes_[node].token;
        best_end = j + 1;
      }
    }
    if (best) {
      *begin = i;
      *end = best_end;
      *token = best;
      return true;
    }
  }
  return false;
}

bool AddedTokenMatcher::adjust(std::string_view text, size_t start_offset, const AddedToken& token, size_t* begin,
                               size_t* end) {
  if (token.single_word) {
    size_t len = 0;
    const bool start_ok = *begin == 0 || !is_word_char(utf8_decode(text, char_begin(text, *begin - 1), &len));
    const bool stop_ok = *end == text.size() || !is_word_char(utf8_decode(text, *end, &len));
    if (!start_ok || !stop_ok) return false;
  }
  if (token.lstrip) {
    // Back over the whitespace before the token, but not into what was already emitted.
    size_t b = *begin;
    while (b > 0) {
      const size_t lead = char_begin(text, b - 1);
      size_t len = 0;
      if (!unicode_is_white_space(utf8_decode(text, lead, &len))) break;
      b = lead;
    }
    *begin = std::max(b, start_offset);
  }
  if (token.rstrip) {
    size_t e = *end;
    while (e < text.size()) {
      size_t len = 0;
      if (!unicode_is_white_space(utf8_decode(text, e, &len))) break;
      e += len;
    }
    *end = e;
  }
  return true;
}

}  // namespace sluice
