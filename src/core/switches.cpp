// The switches' values (switches.h): read from the environment once, at the first use of any,
// and again at each reload. The only getenv of the library.
#include "core/switches.h"

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "core/error.h"

namespace sluice::switches {
namespace {

constexpr size_t kCount = std::size(kSwitches);

constexpr bool table_in_order() {
  for (size_t i = 0; i < kCount; ++i)
    if (static_cast<size_t>(kSwitches[i].id) != i) return false;
  return true;
}
static_assert(table_in_order(), "kSwitches lists every Switch once, in the enum's order");

// One switch's value: a flag's or an integer's in numbers[0], the integers' in order.
struct Value {
  std::vector<int64_t> numbers;
};
using Values = std::vector<Value>;  // [kCount]

[[noreturn]] void refuse(const Info& s, std::string_view text) {
  fail(Status::invalid_argument, "environment: ", s.name, "=", text, ": the switch takes ", takes(s), " (unset: ",
       s.default_value, "; docs/configuration.md)");
}

// A decimal integer within [min, max], the whole of `text`.
bool parse_integer(std::string_view text, int64_t min, int64_t max, int64_t& out) {
  if (text.empty() || text.size() > 18) return false;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v < min || v > max) return false;
  out = v;
  return true;
}

Value parse(const Info& s, std::string_view text) {
  Value v;
  if (s.type == Type::flag) {
    if (text != "0" && text != "1") refuse(s, text);
    v.numbers.push_back(text == "1" ? 1 : 0);
    return v;
  }
  if (s.type == Type::integer) {
    int64_t n = 0;
    if (!parse_integer(text, s.min, s.max, n)) refuse(s, text);
    v.numbers.push_back(n);
    return v;
  }
  size_t at = 0;
  for (;;) {
    const size_t comma = text.find(',', at);
    int64_t n = 0;
    if (!parse_integer(text.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at), s.min,
                       s.max, n))
      refuse(s, text);
    v.numbers.push_back(n);
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  if (static_cast<int>(v.numbers.size()) != s.count) refuse(s, text);
  return v;
}

Values read_environment() {
  Values values(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    const Info& s = kSwitches[i];
    const char* env = std::getenv(s.name);
    values[i] = parse(s, env != nullptr && *env != '\0' ? std::string_view(env) : std::string_view(s.default_value));
  }
  return values;
}

// The values in use, and every set read before them (kept: a reader on another thread may
// still hold one; a process reloads a handful of times at most).
std::mutex g_mu;
std::atomic<const Values*> g_current{nullptr};
std::vector<std::unique_ptr<const Values>> g_read;

const Values& install(Values v) {
  g_read.push_back(std::make_unique<const Values>(std::move(v)));
  g_current.store(g_read.back().get(), std::memory_order_release);
  return *g_read.back();
}

const Values& current() {
  const Values* v = g_current.load(std::memory_order_acquire);
  if (v == nullptr) {
    std::lock_guard<std::mutex> lk(g_mu);
    v = g_current.load(std::memory_order_acquire);
    if (v == nullptr) v = &install(read_environment());
  }
  return *v;
}

const Value& value(Switch s, Type type) {
  const Info& i = info(s);
  SLUICE_CHECK(i.type == type, Status::internal, "switches: ", i.name, " read as another type");
  return current()[static_cast<size_t>(s)];
}

}  // namespace

const Info& info(Switch s) {
  const auto i = static_cast<size_t>(s);
  SLUICE_CHECK(i < kCount, Status::internal, "switches: no switch ", i);
  return kSwitches[i];
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::setting: return "setting";
    case Kind::fallback: return "fallback";
    case Kind::diagnostic: return "diagnostic";
  }
  return "?";
}

std::string takes(const Info& s) {
  switch (s.type) {
    case Type::flag: return "1 (on) or 0 (off)";
    case Type::integer: return str("an integer from ", s.min, " to ", s.max);
    case Type::integers: return str(s.count, " integers from ", s.min, " to ", s.max, " separated by commas");
  }
  return "";
}

bool on(Switch s) { return value(s, Type::flag).numbers[0] != 0; }
int64_t integer(Switch s) { return value(s, Type::integer).numbers[0]; }
const std::vector<int64_t>& integers(Switch s) { return value(s, Type::integers).numbers; }

void load() { current(); }

void reload() {
  Values v = read_environment();  // an invalid value throws here and keeps the values in use
  std::lock_guard<std::mutex> lk(g_mu);
  install(std::move(v));
}

}  // namespace sluice::switches
