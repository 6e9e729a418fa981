// A switch of the registry (core/switches.h) set (or unset) for a scope and put back as it
// was after it, so that a GPU test's switch (SLUICE_CUDA_HOST_ROUTED, SLUICE_CUDA_MOE_DECODE,
// ...) cannot leak into the tests after it, nor erase a value the whole run was started with.
// Each change sets the environment variable and reloads the registry, so the next launch (or
// graph capture) reads the new value.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "core/switches.h"

namespace sluice {

class ScopedEnv {
 public:
  // value null: unset for the scope.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  // A new value within the scope (null: unset); the destructor still restores the original.
  void set(const char* value) const {
    if (value) setenv(name_.c_str(), value, 1);
    else unsetenv(name_.c_str());
    switches::reload();
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace sluice
