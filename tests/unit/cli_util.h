// Running the sluice binary from a test: no shell (arguments reach it as given, "" too),
// stdout and stderr captured through files, the exit status, signal and peak RSS from wait4.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace sluice::test {

struct CliRun {
  int status = -1;  // exit status; -1 when killed by a signal
  int signal = 0;
  std::string out, err;
  long max_rss_kb = 0;
};

// Runs SLUICE_BINARY with args; its stdout and stderr go to io_dir/out and io_dir/err (io_dir
// must exist). `on_start` may act on the child's pid (send a signal) before it is waited for.
CliRun run_cli(const std::vector<std::string>& args, const std::filesystem::path& io_dir,
               const std::function<void(pid_t)>& on_start = {});

// "3,17,42": ids as --tokens takes them and --print-ids prints them.
std::string join_ids(const std::vector<int32_t>& ids);

// The whole file as bytes ("" when it cannot be read).
std::string slurp(const std::filesystem::path& p);

}  // namespace sluice::test
