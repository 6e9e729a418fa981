// JavaScript's number printing and parsing (see js_number.h), on top of std::to_chars's
// shortest round-trip digits and strtod's correctly rounded parsing.
#include "format/jinja/js_number.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "format/jinja/js_text.h"

namespace sluice::jinja {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// strtod on exactly `s` (which the callers have already checked is a decimal literal).
double parse_decimal(std::string_view s) {
  const std::string copy(s);
  return std::strtod(copy.c_str(), nullptr);
}

// Length of the StrUnsignedDecimalLiteral at the start of s (digits [. digits] [e[+-]digits],
// or . digits [...]), 0 when there is none.
size_t decimal_literal_length(std::string_view s) {
  size_t i = 0, int_digits = 0, frac_digits = 0;
  while (i < s.size() && is_digit(s[i])) ++i, ++int_digits;
  if (i < s.size() && s[i] == '.') {
    size_t j = i + 1;
    while (j < s.size() && is_digit(s[j])) ++j, ++frac_digits;
    if (int_digits > 0 || frac_digits > 0) i = j;
  }
  if (int_digits == 0 && frac_digits == 0) return 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    const size_t exp_start = j;
    while (j < s.size() && is_digit(s[j])) ++j;
    if (j > exp_start) i = j;
  }
  return i;
}

}  // namespace

std::string js_number_to_string(double x) {
  if (std::isnan(x)) return "NaN";
  if (x == 0) return "0";
  if (x < 0) return std::string("-").append(js_number_to_string(-x));
  if (std::isinf(x)) return "Infinity";
  // Shortest digits d1..dk and exponent n with x = 0.d1...dk * 10^n (ECMA-262 Number::toString).
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));  // "d.ddde+XX"
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits += c;
  const int k = static_cast<int>(digits.size());
  const int n = std::atoi(std::string(sci.substr(e + 1)).c_str()) + 1;
  if (k <= n && n <= 21) return digits + std::string(static_cast<size_t>(n - k), '0');
  if (0 < n && n <= 21) return digits.substr(0, static_cast<size_t>(n)) + "." + digits.substr(static_cast<size_t>(n));
  if (-6 < n && n <= 0) return std::string("0.").append(static_cast<size_t>(-n), '0').append(digits);
  std::string out = digits.substr(0, 1);
  if (k > 1) out.append(".").append(digits, 1);
  out += "e";
  out += (n - 1 < 0) ? "-" : "+";
  out += std::to_string(std::abs(n - 1));
  return out;
}

std::string js_float_to_string(double x) {
  if (x == 0 && std::signbit(x)) return "-0.0";
  if (std::isfinite(x) && std::trunc(x) == x) {
    // x.toFixed(1): exact digits below 1e21, Number::toString from there on.
    if (std::abs(x) >= 1e21) return js_number_to_string(x);
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::fixed, 1);
    return std::string(buf, r.ptr);
  }
  return js_number_to_string(x);
}

double js_parse_int(std::string_view s) {
  s = js_trim_start(s);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  size_t n = 0;
  while (n < s.size() && is_digit(s[n])) ++n;
  if (n == 0) return std::numeric_limits<double>::quiet_NaN();
  const double v = parse_decimal(s.substr(0, n));
  return negative ? -v : v;
}

double js_parse_float(std::string_view s) {
  s = js_trim_start(s);
  bool negative = false;
  std::string_view body = s;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body.starts_with("Infinity")) return negative ? -INFINITY : INFINITY;
  const size_t n = decimal_literal_length(body);
  if (n == 0) return std::numeric_limits<double>::quiet_NaN();
  const double v = parse_decimal(body.substr(0, n));
  return negative ? -v : v;
}

double js_string_to_number(std::string_view s) {
  s = js_trim(s);
  if (s.empty()) return 0;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (s.size() > 2 && s[0] == '0') {
    int base = 0;
    if (s[1] == 'x' || s[1] == 'X') base = 16;
    if (s[1] == 'o' || s[1] == 'O') base = 8;
    if (s[1] == 'b' || s[1] == 'B') base = 2;
    if (base != 0) {
      double v = 0;
      for (char c : s.substr(2)) {
        int d = -1;
        if (is_digit(c)) d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        if (d < 0 || d >= base) return nan;
        v = v * base + d;
      }
      return v;
    }
  }
  bool negative = false;
  std::string_view body = s;
  if (body[0] == '+' || body[0] == '-') {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body == "Infinity") return negative ? -INFINITY : INFINITY;
  if (decimal_literal_length(body) != body.size() || body.empty()) return nan;
  const double v = parse_decimal(body);
  return negative ? -v : v;
}

}  // namespace sluice::jinja
