// UTF-8 validation, decoding and repair, and the GPT-2 byte-level alphabet.
#include "format/utf8.h"

namespace sluice {

namespace {

// Valid range of the second byte of a multi-byte sequence, per lead byte (RFC 3629 table):
// these ranges are what exclude overlongs (E0, F0), surrogates (ED) and > U+10FFFF (F4).
struct LeadInfo {
  uint8_t len;              // total sequence length, 0 when b cannot lead
  uint8_t lo, hi;           // allowed range of the second byte
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};  // continuation byte, or C0/C1 (always overlong)
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};  // F5..FF
}

const char* bad_second_reason(uint8_t lead, uint8_t second) {
  if (second < 0x80 || second > 0xBF) return "truncated sequence (missing continuation byte)";
  if (lead == 0xE0 || lead == 0xF0) return "overlong encoding";
  if (lead == 0xED) return "UTF-16 surrogate code point";
  return "code point above U+10FFFF";
}

}  // namespace

std::optional<Utf8Error> utf8_find_invalid(std::string_view text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path: 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const uint8_t b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    const LeadInfo info = lead_info(b);
    if (info.len == 0) {
      if (b >= 0x80 && b <= 0xBF) return Utf8Error{i, "lone continuation byte"};
      if (b == 0xC0 || b == 0xC1) return Utf8Error{i, "overlong encoding"};
      return Utf8Error{i, "byte that never appears in UTF-8"};
    }
    if (i + 1 >= n) return Utf8Error{i, "truncated sequence at end of text"};
    if (p[i + 1] < info.lo || p[i + 1] > info.hi) return Utf8Error{i, bad_second_reason(b, p[i + 1])};
    for (size_t k = 2; k < info.len; ++k) {
      if (i + k >= n) return Utf8Error{i, "truncated sequence at end of text"};
      if ((p[i + k] & 0xC0) != 0x80) return Utf8Error{i, "truncated sequence (missing continuation byte)"};
    }
    i += info.len;
  }
  return std::nullopt;
}

uint32_t utf8_decode(std::string_view text, size_t pos, size_t* len) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + pos;
  const size_t l = utf8_seq_len(p[0]);
  *len = l;
  switch (l) {
    case 1: return p[0];
    case 2: return (uint32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3: return (uint32_t(p[0] & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return (uint32_t(p[0] & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) | (uint32_t(p[2] & 0x3F) << 6) |
             (p[3] & 0x3F);
  }
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t utf8_repair(std::string_view bytes, bool final, std::string& out) {
  static constexpr char replacement[] = "\xEF\xBF\xBD";  // U+FFFD
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = p[i];
    if (b < 0x80) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    const LeadInfo info = lead_info(b);
    if (info.len == 0) {
      out += replacement;
      ++i;
      continue;
    }
    // Count how many bytes after the lead continue the sequence validly.
    size_t k = 1;
    bool broken = false;
    for (; k < info.len; ++k) {
      if (i + k >= n) break;
      const uint8_t c = p[i + k];
      const bool ok = k == 1 ? (c >= info.lo && c <= info.hi) : ((c & 0xC0) == 0x80);
      if (!ok) {
        broken = true;
        break;
      }
    }
    if (k == info.len) {
      out.append(bytes.data() + i, info.len);
      i += info.len;
    } else if (broken) {
      out += replacement;  // the maximal subpart [i, i + k) is replaced as a whole
      i += k;
    } else {
      // Valid prefix cut off by the end of the buffer.
      if (!final) return i;
      out += replacement;
      i = n;
    }
  }
  return i;
}

bool unicode_is_white_space(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet = [] {
    ByteLevelAlphabet a{};
    a.cp_to_byte.fill(-1);
    uint32_t next_extra = 256;  // bytes outside the printable ranges, in byte order
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? b : next_extra++;
      a.byte_to_cp[b] = cp;
      a.cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return alphabet;
}

bool byte_level_decode_to(std::string_view spelled, std::string& out) {
  const ByteLevelAlphabet& a = byte_level_alphabet();
  out.clear();
  for (size_t i = 0; i < spelled.size();) {
    const auto b = static_cast<uint8_t>(spelled[i]);
    if (b < 0x80) {  // printable ASCII stands for itself; controls and space are not in the alphabet
      if (a.cp_to_byte[b] < 0) return false;
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    size_t len = 0;
    const uint32_t cp = utf8_decode(spelled, i, &len);
    if (cp >= a.cp_to_byte.size() || a.cp_to_byte[cp] < 0) return false;
    out += static_cast<char>(a.cp_to_byte[cp]);
    i += len;
  }
  return true;
}

std::optional<std::string> byte_level_decode(std::string_view spelled) {
  std::string out;
  if (!byte_level_decode_to(spelled, out)) return std::nullopt;
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  const ByteLevelAlphabet& a = byte_level_alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8_append(out, a.byte_to_cp[static_cast<uint8_t>(c)]);
  return out;
}

}  // namespace sluice
