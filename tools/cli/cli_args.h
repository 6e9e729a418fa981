// Numeric options and command-line errors in sluice's own words. CLI11 parses the command
// line; the numbers are converted here, so that every bad value gets one line that echoes
// the text and states the option's range ("-n -1: expected an integer, 0 or more") instead
// of CLI11's "Value -1 not in range 0.000000 to 1797...(300 digits)".
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace sluice::cli {

// The values an integer option takes; the type it is stored in may cap `max` further.
struct IntRange {
  int64_t min = 0;
  int64_t max = std::numeric_limits<int64_t>::max();
  std::string note;  // what a special value means, appended to the range: "0: all cores"

  static IntRange from(int64_t min, int64_t max, std::string note = "") { return {min, max, std::move(note)}; }
  static IntRange at_least(int64_t min, std::string note = "") {
    return {min, std::numeric_limits<int64_t>::max(), std::move(note)};
  }
};

// The values a real option takes: finite, from min (or above it with min_open) to max.
struct RealRange {
  double min = 0;
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false;  // true: min itself is not allowed
  std::string note;

  static RealRange from(double min, double max, std::string note = "") { return {min, max, false, std::move(note)}; }
  static RealRange at_least(double min, std::string note = "") {
    return {min, std::numeric_limits<double>::infinity(), false, std::move(note)};
  }
  // (min, max]
  static RealRange above(double min, double max = std::numeric_limits<double>::infinity(), std::string note = "") {
    return {min, max, true, std::move(note)};
  }
};

// `names` as CLI11 takes them ("-n,--n-predict"); the first one names the option in messages.
CLI::Option* add_integer(CLI::App& cmd, const std::string& names, int64_t& value, const IntRange& range,
                         const std::string& help);
CLI::Option* add_integer(CLI::App& cmd, const std::string& names, int32_t& value, const IntRange& range,
                         const std::string& help);
// Any integer from 0 to 2^64-1; a minus sign or a larger number is an error, never wrapped.
CLI::Option* add_seed(CLI::App& cmd, const std::string& names, uint64_t& value, const std::string& help);
CLI::Option* add_real(CLI::App& cmd, const std::string& names, double& value, const RealRange& range,
                      const std::string& help);
// Stored as float: a value beyond float's range becomes its largest finite value, and with
// min_open a positive value below float's smallest becomes that (not 0, which the range
// excludes). Both keep the value's meaning for the samplers' parameters, whose results
// saturate long before (see cmd_run.cpp).
CLI::Option* add_real(CLI::App& cmd, const std::string& names, float& value, const RealRange& range,
                      const std::string& help);

// --threads N: 0 (all cores) to kThreadsMax.
inline constexpr int32_t kThreadsMax = ThreadPool::kMaxThreads;
CLI::Option* add_threads(CLI::App& cmd, int32_t& value, const std::string& help);

// What the allowed values are, as messages state them: "an integer from 1 to 256", "a finite
// number above 0".
std::string range_text(const IntRange& range);
std::string range_text(const RealRange& range);

// The one line (without "sluice: error: ") for a parse error of `app`: an unknown subcommand
// lists the subcommands; an option given twice, or without its value, says so; others keep
// CLI11's text and point at --help. `args` is the command line without the program name.
std::string parse_error_text(const CLI::App& app, const CLI::ParseError& e, const std::vector<std::string>& args);

}  // namespace sluice::cli
