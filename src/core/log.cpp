// The log sink and level. Thread-safe: lines from several threads never interleave.
#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace sluice {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::warn)};
std::mutex g_mutex;
LogSink g_sink;

const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warn: return "warning";
    case LogLevel::error: return "error";
    default: return "";
  }
}
}  // namespace

void log_set_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_set_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sink = std::move(sink);
}

void log_write(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_sink) {
    g_sink(level, message);
    return;
  }
  std::fprintf(stderr, "sluice: %s: %s\n", level_tag(level), message.c_str());
}

}  // namespace sluice
