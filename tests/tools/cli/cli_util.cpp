// The CLI test runner (cli_util.h).
#include "tests/tools/cli/cli_util.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace sluice::test {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

PeakRss::PeakRss(pid_t pid) : pid_(pid) {
  reader_ = std::thread([this] {
    const std::string dir = "/proc/" + std::to_string(pid_), path = dir + "/status";
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    while (!done_.load()) {
      // Until exec the child is a copy of this process, RSS and high-water mark included.
      if (fs::read_symlink(dir + "/exe", ec) == self || ec) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      std::ifstream f(path);
      for (std::string line; std::getline(f, line);)
        if (line.rfind("VmHWM:", 0) == 0) {
          const long kb = std::strtol(line.c_str() + 6, nullptr, 10);
          if (kb > peak_kb_.load()) peak_kb_.store(kb);
          break;
        }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
}

PeakRss::~PeakRss() { stop(); }

long PeakRss::stop() {
  done_.store(true);
  if (reader_.joinable()) reader_.join();
  return peak_kb_.load();
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

CliRun run_cli(const std::vector<std::string>& args, const fs::path& io_dir,
               const std::function<void(pid_t)>& on_start) {
  std::fflush(stdout);  // or the child would write the parent's buffered output again
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid == 0) {
    FILE* o = std::freopen((io_dir / "out").c_str(), "w", stdout);
    FILE* e = std::freopen((io_dir / "err").c_str(), "w", stderr);
    (void)o;
    (void)e;
    std::vector<char*> argv = {const_cast<char*>(SLUICE_BINARY)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(SLUICE_BINARY, argv.data());
    std::_Exit(127);
  }
  PeakRss peak(pid);
  if (on_start) on_start(pid);
  int raw = 0;
  struct rusage ru {};
  ::wait4(pid, &raw, 0, &ru);
  CliRun r;
  r.max_rss_kb = peak.stop();
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.signal = WIFSIGNALED(raw) ? WTERMSIG(raw) : 0;
  r.out = slurp(io_dir / "out");
  r.err = slurp(io_dir / "err");
  return r;
}

uint64_t self_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, n, key) == 0) return std::stoull(line.substr(n));
  return 0;
}

size_t self_thread_count() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory();
  return n;
}

void self_reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace sluice::test
