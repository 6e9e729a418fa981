// Logging: one macro family with levels, routed through a settable sink (stderr by default).
// Nothing on the per-token hot path logs; counters carry cache and IO figures instead.
#pragma once

#include <functional>
#include <string>

#include "core/error.h"

namespace sluice {

enum class LogLevel : int { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

using LogSink = std::function<void(LogLevel, const std::string&)>;

void log_set_level(LogLevel level);
LogLevel log_level();
void log_set_sink(LogSink sink);  // an empty sink restores stderr
void log_write(LogLevel level, const std::string& message);

}  // namespace sluice

#define SLUICE_LOG(level, ...)                                                     \
  do {                                                                             \
    if (static_cast<int>(level) >= static_cast<int>(::sluice::log_level()))        \
      ::sluice::log_write(level, ::sluice::str(__VA_ARGS__));                      \
  } while (0)
#define LOG_DEBUG(...) SLUICE_LOG(::sluice::LogLevel::debug, __VA_ARGS__)
#define LOG_INFO(...) SLUICE_LOG(::sluice::LogLevel::info, __VA_ARGS__)
#define LOG_WARN(...) SLUICE_LOG(::sluice::LogLevel::warn, __VA_ARGS__)
#define LOG_ERROR(...) SLUICE_LOG(::sluice::LogLevel::error, __VA_ARGS__)
