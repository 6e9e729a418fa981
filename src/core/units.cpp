// Byte sizes: parsing with binary suffixes, and printing.
#include "core/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace sluice {

uint64_t parse_byte_size(std::string_view text, std::string_view what) {
  auto bad = [&]() -> uint64_t {
    fail(Status::invalid_argument, what, ": '", text, "' is not a size (examples: 4096, 512M, 8G, 1.5GiB)");
  };
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  size_t digits = 0;
  while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) || s[digits] == '.')) ++digits;
  if (digits == 0) return bad();
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + digits, value);
  if (ec != std::errc() || end != s.data() + digits || !(value >= 0)) return bad();
  std::string suffix;
  for (char c : s.substr(digits)) suffix += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (!suffix.empty() && suffix.front() == ' ') suffix.erase(0, 1);
  double mul = 1;
  if (!suffix.empty() && suffix != "B") {
    const std::string rest = suffix.substr(1);
    if (rest != "" && rest != "B" && rest != "IB") return bad();
    switch (suffix.front()) {
      case 'K': mul = 1024.0; break;
      case 'M': mul = 1024.0 * 1024; break;
      case 'G': mul = 1024.0 * 1024 * 1024; break;
      case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
      default: return bad();
    }
  }
  const double bytes = std::floor(value * mul);
  SLUICE_CHECK(bytes < 9.0e18, Status::invalid_argument, what, ": '", text, "' is too large");
  return static_cast<uint64_t>(bytes);
}

std::string byte_size_text(uint64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else if (b < 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  else if (b < 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  else std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  return buf;
}

}  // namespace sluice
