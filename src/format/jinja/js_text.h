// Strings as @huggingface/jinja sees them: JavaScript strings (UTF-16), here held as UTF-8.
// These helpers give the JavaScript answers on UTF-8 text: the whitespace set of \s and
// trim(), lengths and indexes in UTF-16 code units, code point slicing, case mapping,
// JSON.stringify's quoting, String.prototype.replace/split as the reference uses them.
// Every input is valid UTF-8 (templates and variables are checked on the way in).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::jinja {

// Byte length of the JavaScript whitespace character (\s, what trim() removes: ASCII
// \t\n\v\f\r and space, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
// U+3000, U+FEFF) that starts at s[pos], or 0 when there is none.
size_t js_space_length(std::string_view s, size_t pos);
// The same for the character that ends just before s[end].
size_t js_space_length_before(std::string_view s, size_t end);

std::string_view js_trim(std::string_view s);
std::string_view js_trim_start(std::string_view s);
std::string_view js_trim_end(std::string_view s);

// JavaScript's \w: ASCII letters, digits and underscore.
inline bool js_is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// s.length: UTF-16 code units (a character outside the BMP counts 2).
size_t utf16_length(std::string_view s);

// s.at(index) for a string: the UTF-16 code unit at index (negative counts from the end), as
// UTF-8; nullopt when out of range. Half of a surrogate pair comes back as U+FFFD (UTF-8
// cannot hold a lone surrogate).
std::optional<std::string> js_char_at(std::string_view s, double index);

// Array.from(s): the code points, each as UTF-8.
std::vector<std::string> code_points(std::string_view s);

// a < b on JavaScript strings: UTF-16 code unit order. -1, 0 or 1.
int utf16_compare(std::string_view a, std::string_view b);

// toUpperCase / toLowerCase: Unicode simple case mapping (utf8proc) plus the unconditional
// full mappings JavaScript applies to common text (ß -> SS, ligatures, İ -> i̇).
std::string js_to_upper(std::string_view s);
std::string js_to_lower(std::string_view s);

// @huggingface/jinja's title(): upper-cases each ASCII word character that follows a
// non-word character (/\b\w/g); nothing is lowered.
std::string js_title(std::string_view s);
// capitalize(): the first UTF-16 unit upper-cased (a character outside the BMP stays), the
// rest unchanged.
std::string js_capitalize(std::string_view s);

// JSON.stringify(s): quotes, \" \\ \b \f \n \r \t, other controls as \u00xx. With
// ensure_ascii, every UTF-16 unit from U+007F up is written \uxxxx too (the reference's
// ensure_ascii).
std::string json_quote(std::string_view s, bool ensure_ascii);

// The reference's replace(str, old, new, count): count 0 changes nothing, a negative or
// absent count replaces every match; an empty `old` matches between every two code points
// and at both ends.
std::string js_replace(std::string_view s, std::string_view old_text, std::string_view new_text,
                       std::optional<double> count);

// s.split(sep) of JavaScript (sep not empty).
std::vector<std::string> js_split(std::string_view s, std::string_view sep);

}  // namespace sluice::jinja
