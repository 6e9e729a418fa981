// JavaScript string semantics on UTF-8 (see js_text.h).
#include "format/jinja/js_text.h"

#include <utf8proc.h>

#include <cmath>

#include "format/utf8.h"

namespace sluice::jinja {

namespace {

bool is_js_space_cp(uint32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

// The code point at s[pos] and its byte length (s is valid UTF-8).
uint32_t decode_at(std::string_view s, size_t pos, size_t* len) { return utf8_decode(s, pos, len); }

uint32_t first_utf16_unit(uint32_t cp) { return cp < 0x10000 ? cp : 0xD800 + ((cp - 0x10000) >> 10); }

// Full (one-to-many) mappings of SpecialCasing.txt that are unconditional; utf8proc gives
// only the simple ones.
const char* special_upper(uint32_t cp) {
  switch (cp) {
    case 0x00DF: return "SS";
    case 0x0149: return "\u02BCN";
    case 0xFB00: return "FF";
    case 0xFB01: return "FI";
    case 0xFB02: return "FL";
    case 0xFB03: return "FFI";
    case 0xFB04: return "FFL";
    case 0xFB05: return "ST";
    case 0xFB06: return "ST";
    default: return nullptr;
  }
}

template <typename Map>
std::string map_code_points(std::string_view s, Map&& map) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const uint32_t cp = decode_at(s, i, &len);
    map(cp, out);
    i += len;
  }
  return out;
}

std::string hex4(uint32_t unit) {
  static const char* digits = "0123456789abcdef";
  std::string out = "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += digits[(unit >> shift) & 0xF];
  return out;
}

}  // namespace

size_t js_space_length(std::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  const auto b = static_cast<uint8_t>(s[pos]);
  if (b < 0x80) return is_js_space_cp(b) ? 1 : 0;
  if (b != 0xC2 && b != 0xE1 && b != 0xE2 && b != 0xE3 && b != 0xEF) return 0;
  size_t len = 0;
  const uint32_t cp = decode_at(s, pos, &len);
  return is_js_space_cp(cp) ? len : 0;
}

size_t js_space_length_before(std::string_view s, size_t end) {
  if (end == 0) return 0;
  const auto last = static_cast<uint8_t>(s[end - 1]);
  if (last < 0x80) return is_js_space_cp(last) ? 1 : 0;
  // Every non-ASCII space is 2 or 3 bytes long.
  for (size_t len : {size_t{2}, size_t{3}})
    if (end >= len && js_space_length(s, end - len) == len) return len;
  return 0;
}

std::string_view js_trim_start(std::string_view s) {
  size_t i = 0;
  while (size_t n = js_space_length(s, i)) i += n;
  return s.substr(i);
}

std::string_view js_trim_end(std::string_view s) {
  size_t end = s.size();
  while (size_t n = js_space_length_before(s, end)) end -= n;
  return s.substr(0, end);
}

std::string_view js_trim(std::string_view s) { return js_trim_end(js_trim_start(s)); }

size_t utf16_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    const size_t len = utf8_seq_len(b);
    n += len == 4 ? 2 : 1;
    i += len;
  }
  return n;
}

std::optional<std::string> js_char_at(std::string_view s, double index) {
  // Array/String.prototype.at: ToIntegerOrInfinity (NaN is 0), negative counts from the end.
  double k = std::isnan(index) ? 0 : std::trunc(index);
  const double length = static_cast<double>(utf16_length(s));
  if (k < 0) k += length;
  if (k < 0 || k >= length) return std::nullopt;
  size_t unit = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const uint32_t cp = decode_at(s, i, &len);
    const size_t units = cp >= 0x10000 ? 2 : 1;
    if (k < static_cast<double>(unit + units)) return units == 2 ? std::string("\uFFFD") : std::string(s.substr(i, len));
    unit += units;
    i += len;
  }
  return std::nullopt;
}

std::vector<std::string> code_points(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_seq_len(static_cast<uint8_t>(s[i]));
    out.emplace_back(s.substr(i, len));
    i += len;
  }
  return out;
}

int utf16_compare(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    size_t la = 0, lb = 0;
    const uint32_t x = decode_at(a, i, &la), y = decode_at(b, j, &lb);
    if (x != y) {
      const uint32_t ux = first_utf16_unit(x), uy = first_utf16_unit(y);
      if (ux != uy) return ux < uy ? -1 : 1;
      return x < y ? -1 : 1;  // the same high surrogate: the low ones order as the code points
    }
    i += la;
    j += lb;
  }
  if (i < a.size()) return 1;
  if (j < b.size()) return -1;
  return 0;
}

std::string js_to_upper(std::string_view s) {
  return map_code_points(s, [](uint32_t cp, std::string& out) {
    if (const char* special = special_upper(cp)) {
      out += special;
      return;
    }
    utf8_append(out, static_cast<uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))));
  });
}

std::string js_to_lower(std::string_view s) {
  return map_code_points(s, [](uint32_t cp, std::string& out) {
    if (cp == 0x0130) {  // İ -> i + combining dot above
      out += "i\u0307";
      return;
    }
    utf8_append(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  });
}

std::string js_title(std::string_view s) {
  std::string out(s);
  for (size_t i = 0; i < out.size(); ++i) {
    const bool at_boundary = i == 0 || !js_is_word(out[i - 1]);
    if (at_boundary && out[i] >= 'a' && out[i] <= 'z') out[i] = static_cast<char>(out[i] - 'a' + 'A');
  }
  return out;
}

std::string js_capitalize(std::string_view s) {
  if (s.empty()) return {};
  size_t len = 0;
  const uint32_t cp = decode_at(s, 0, &len);
  if (cp >= 0x10000) return std::string(s);  // charAt(0) is half a surrogate pair: no case
  return js_to_upper(s.substr(0, len)) + std::string(s.substr(len));
}

std::string json_quote(std::string_view s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    const auto b = static_cast<uint8_t>(c);
    if (b < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (b < 0x20) out += hex4(b);
          else if (b == 0x7F && ensure_ascii) out += hex4(b);
          else out += c;
      }
      ++i;
      continue;
    }
    size_t len = 0;
    const uint32_t cp = decode_at(s, i, &len);
    if (!ensure_ascii) {
      out.append(s.substr(i, len));
    } else if (cp < 0x10000) {
      out += hex4(cp);
    } else {
      out += hex4(0xD800 + ((cp - 0x10000) >> 10));
      out += hex4(0xDC00 + ((cp - 0x10000) & 0x3FF));
    }
    i += len;
  }
  out += '"';
  return out;
}

std::string js_replace(std::string_view s, std::string_view old_text, std::string_view new_text,
                       std::optional<double> count) {
  if (count && *count == 0) return std::string(s);
  double remaining = (!count || *count < 0) ? INFINITY : *count;
  std::string out;
  if (old_text.empty()) {
    // /(?=)/gu: an empty match before every code point and at the end.
    for (size_t i = 0;; ) {
      if (remaining > 0) {
        out += new_text;
        --remaining;
      }
      if (i >= s.size()) break;
      const size_t len = utf8_seq_len(static_cast<uint8_t>(s[i]));
      out.append(s.substr(i, len));
      i += len;
    }
    return out;
  }
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(old_text, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    if (remaining > 0) {
      out += new_text;
      --remaining;
    } else {
      out += old_text;
    }
    pos = hit + old_text.size();
  }
  out.append(s.substr(pos));
  return out;
}

std::vector<std::string> js_split(std::string_view s, std::string_view sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(sep, pos);
    if (hit == std::string_view::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

}  // namespace sluice::jinja
