// run_sluice_child: fork, redirect, setrlimit, exec; wait4 for the status, PeakRss for the
// peak RSS.
#include "tests/tools/cli/cli_child.h"

#include "tests/tools/cli/cli_util.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "format/json_file.h"

namespace fs = std::filesystem;

namespace sluice::test {

fs::path child_scratch(const std::string& name) { return pack_test_dir("child-" + name); }

std::string read_text(const fs::path& file) {
  std::ifstream f(file, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ChildResult run_sluice_child(const std::vector<std::string>& args, const ChildOptions& options) {
  const fs::path d = child_scratch("io");
  const fs::path out = options.stdout_path.empty() ? d / "out" : options.stdout_path, err = d / "err";
  std::vector<std::string> argv_s = {SLUICE_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);  // or the child would write the parent's buffered output again
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen(err.c_str(), "w", stderr)) std::_Exit(126);
    if (options.address_space_bytes) {
      const struct rlimit lim = {options.address_space_bytes, options.address_space_bytes};
      ::setrlimit(RLIMIT_AS, &lim);
    }
    for (const auto& [k, v] : options.env) ::setenv(k.c_str(), v.c_str(), 1);
    ::execv(argv[0], argv.data());
    std::_Exit(127);
  }
  PeakRss peak(pid);
  if (options.on_start) options.on_start(pid, out, err);
  ChildResult r;
  int raw = 0;
  struct rusage usage {};
  if (::wait4(pid, &raw, 0, &usage) == pid) {
    if (WIFEXITED(raw)) r.status = WEXITSTATUS(raw);
    if (WIFSIGNALED(raw)) r.signal = WTERMSIG(raw);
  }
  r.max_rss_kb = peak.stop();
  r.err = read_text(err);
  if (options.stdout_path.empty()) r.out = read_text(out);
  return r;
}

bool wait_for(const std::function<bool()>& done, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

bool make_char_device(const fs::path& path, unsigned major, unsigned minor) {
  return ::mknod(path.c_str(), S_IFCHR | 0666, makedev(major, minor)) == 0;
}

void edit_json_file(const fs::path& file, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = read_json_file(file);
  edit(j);
  std::ofstream(file, std::ios::trunc) << j.dump(1);
}

fs::path fixture_copy(const std::string& fixture, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path d = child_scratch(fixture);
  fs::copy(fixture_dir(fixture), d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  if (edit) edit_json_file(d / "config.json", edit);
  return d;
}

}  // namespace sluice::test
