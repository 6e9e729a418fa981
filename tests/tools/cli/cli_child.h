// The sluice binary as a child process, for command-line tests that need more than a shell
// line: stdout sent to a chosen file (/dev/full), an address-space limit (so a regression
// that allocates without bound fails at once with "out of memory" instead of eating the
// machine's memory), a hook that acts on the running child (a signal once it has written
// something), and the child's peak RSS. Plus small helpers to copy and edit fixtures.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sluice::test {

struct ChildResult {
  int status = -1;  // exit status; -1 when killed by a signal
  int signal = 0;   // the signal that killed it, if any
  std::string out, err;
  long max_rss_kb = 0;  // peak resident set size (PeakRss, cli_util.h)
};

struct ChildOptions {
  std::filesystem::path stdout_path;  // empty: a scratch file, read back into ChildResult::out
  uint64_t address_space_bytes = 0;   // RLIMIT_AS of the child; 0: the parent's
  std::vector<std::pair<std::string, std::string>> env;  // set in the child's environment
  // Runs while the child does (with its pid and the files its stdout and stderr go to).
  std::function<void(pid_t pid, const std::filesystem::path& out, const std::filesystem::path& err)> on_start;
};

ChildResult run_sluice_child(const std::vector<std::string>& args, const ChildOptions& options = {});

// Polls `done` every 5 ms for at most `seconds`; whether it became true.
bool wait_for(const std::function<bool()>& done, double seconds);

// A fresh directory under the test's temporary root (removed at exit).
std::filesystem::path child_scratch(const std::string& name);

// A copy of a fixture directory (files copied, not linked, so they can be damaged), with
// edit() applied to its config.json.
std::filesystem::path fixture_copy(const std::string& fixture, const std::function<void(nlohmann::json&)>& edit = {});

// Edits a JSON file in place.
void edit_json_file(const std::filesystem::path& file, const std::function<void(nlohmann::json&)>& edit);

std::string read_text(const std::filesystem::path& file);

// A character device node at `path` (mknod): (1, 3) behaves as /dev/null, (1, 7) as
// /dev/full. Tests of device outputs use these, never the real /dev/null: a regression that
// renames over its output must not destroy the machine's /dev/null. False when not permitted
// (mknod needs root or CAP_MKNOD).
bool make_char_device(const std::filesystem::path& path, unsigned major, unsigned minor);

}  // namespace sluice::test
