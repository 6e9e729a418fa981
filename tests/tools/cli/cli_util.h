// Running the sluice binary from a test: no shell (arguments reach it as given, "" too),
// stdout and stderr captured through files, the exit status and signal from wait4, the peak
// RSS from the child's /proc (PeakRss).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace sluice::test {

// The peak resident set of a child's program, in KiB: its /proc/PID/status VmHWM once it has
// exec'd, read every millisecond by a thread from construction until stop() (call it after
// wait4). Not wait4's
// ru_maxrss: Linux carries the RSS the parent had at fork into an exec'd child's maximum, so
// a test process that grew (a large tokenizer loaded by an earlier test of the same binary)
// made a small child read large. The high-water mark is monotonic, so only a peak in the
// child's last millisecond can be missed.
class PeakRss {
 public:
  explicit PeakRss(pid_t pid);
  ~PeakRss();
  PeakRss(const PeakRss&) = delete;
  PeakRss& operator=(const PeakRss&) = delete;
  long stop();  // the largest VmHWM read (0 if none was)

 private:
  pid_t pid_;
  std::atomic<bool> done_{false};
  std::atomic<long> peak_kb_{0};
  std::thread reader_;
};

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

// This test process's own figures: a /proc/self/status field in KiB ("VmRSS:", "VmHWM:"; 0 if
// absent), its thread count, and a reset of VmHWM to the current RSS (/proc/self/clear_refs).
uint64_t self_status_kb(const char* key);
size_t self_thread_count();
void self_reset_peak_rss();

// "3,17,42": ids as --tokens takes them and --print-ids prints them.
std::string join_ids(const std::vector<int32_t>& ids);

// The whole file as bytes ("" when it cannot be read).
std::string slurp(const std::filesystem::path& p);

}  // namespace sluice::test
