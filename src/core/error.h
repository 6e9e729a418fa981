// Errors inside the library: one exception type carrying a status code and a message that
// names what failed (file, tensor, field, layer). The public API turns it into a status code.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace sluice {

// Status codes of the public boundary; also documented in include/sluice/sluice.h.
enum class Status : int {
  ok = 0,
  invalid_argument = 1,  // the caller's input is wrong (bad option, bad token id)
  not_found = 2,         // a file or tensor that should exist does not
  corrupt = 3,           // a file exists but its contents are malformed
  unsupported = 4,       // well-formed but not something sluice implements (dtype, family)
  io = 5,                // the operating system refused a read or write
  out_of_memory = 6,     // an allocation failed or a budget is too small
  timeout = 7,           // a wait ran past its deadline
  internal = 8,          // a bug in sluice
  unavailable = 9,       // busy or shutting down: the same request may succeed later
};

const char* status_name(Status s);

class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

// str(a, b, c): concatenates anything printable with operator<<.
template <typename... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(Status status, Args&&... args) {
  throw Error(status, str(std::forward<Args>(args)...));
}

}  // namespace sluice

// SLUICE_CHECK(cond, status, message parts...): throws sluice::Error when cond is false.
#define SLUICE_CHECK(cond, status, ...)                        \
  do {                                                         \
    if (!(cond)) ::sluice::fail((status), __VA_ARGS__);        \
  } while (0)

// SLUICE_ASSERT(cond): an internal invariant; a failure is a bug and says where.
#define SLUICE_ASSERT(cond)                                                              \
  do {                                                                                   \
    if (!(cond))                                                                         \
      ::sluice::fail(::sluice::Status::internal, "internal error: ", #cond, " at ",      \
                     __FILE__, ":", __LINE__);                                           \
  } while (0)
