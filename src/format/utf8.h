// UTF-8 helpers for the tokenizer: strict validation with the offending byte offset, code
// point decoding of already-validated text, lossy repair for streamed output, and the GPT-2
// byte-to-unicode alphabet that byte-level BPE vocabularies are spelled in.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sluice {

struct Utf8Error {
  size_t offset;       // byte offset of the first byte of the bad sequence
  const char* reason;  // "lone continuation byte", "truncated sequence", ...
};

// The first ill-formed sequence (RFC 3629: no overlongs, no surrogates, nothing past
// U+10FFFF), or nullopt when the whole text is valid.
std::optional<Utf8Error> utf8_find_invalid(std::string_view text);

// Byte length of the sequence that starts with lead byte b (1 for ASCII and for bytes that
// cannot start a sequence; callers only use it on validated text).
inline size_t utf8_seq_len(uint8_t b) {
  if (b < 0xC0) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  return 4;
}

// Decodes the code point at text[pos] of validated text; *len receives its byte length.
uint32_t utf8_decode(std::string_view text, size_t pos, size_t* len);

void utf8_append(std::string& out, uint32_t cp);

// Appends the longest part of bytes that is complete, well-formed UTF-8 to out and returns
// how many bytes it consumed. Ill-formed sequences become U+FFFD (one per maximal subpart,
// as Rust's from_utf8_lossy and the WHATWG decoder do). A trailing sequence that is a valid
// but incomplete prefix is left unconsumed unless final is true, when it becomes U+FFFD.
size_t utf8_repair(std::string_view bytes, bool final, std::string& out);

// Rust's char::is_whitespace (the White_Space property), which `tokenizers` uses for the
// lstrip/rstrip of added tokens; Oniguruma's \s is the same set.
bool unicode_is_white_space(uint32_t cp);

// GPT-2's byte-to-unicode alphabet: printable Latin-1 bytes stand for themselves, the other
// 68 bytes map to U+0100..U+0143 in byte order.
struct ByteLevelAlphabet {
  std::array<uint32_t, 256> byte_to_cp;  // byte -> code point
  std::array<int16_t, 324> cp_to_byte;   // code point (< 324) -> byte, -1 when not in the alphabet
};
const ByteLevelAlphabet& byte_level_alphabet();

// Maps a token spelled in the byte-level alphabet back to its raw bytes; nullopt when some
// character is outside the alphabet (added tokens, foreign vocabularies). Input must be valid
// UTF-8.
std::optional<std::string> byte_level_decode(std::string_view spelled);
// The same into a caller's buffer (replaced, not appended to); false when outside the alphabet.
bool byte_level_decode_to(std::string_view spelled, std::string& out);

// Spells raw bytes in the byte-level alphabet (the inverse of byte_level_decode).
std::string byte_level_encode(std::string_view bytes);

}  // namespace sluice
