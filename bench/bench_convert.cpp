// bench_convert: convert throughput and memory. Writes a random bf16 qwen3_moe checkpoint of
// about --gb gigabytes (once; reused while its size matches), then times `convert` of it in
// a child process (so the peak RSS and CPU time from wait4 are the convert's alone) and
// prints a markdown row: input size, kinds, threads, seconds, MB/s of checkpoint input, CPU
// seconds and input MB per CPU second (the figure that does not depend on how many cores
// are free), peak RSS.
//
//   bench_convert [--gb 4] [--dir DIR] [--kinds q4] [--threads N] [--reps R] [--drop-caches]
//
// --drop-caches (root only) empties the page cache before each run, so the checkpoint is
// read from the disk rather than from memory; without it the input is usually cached.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "convert/convert.h"
#include "testkit/synthetic_model.h"
#include "core/thread_pool.h"

using namespace sluice;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  double gb = 4;
  fs::path dir = fs::temp_directory_path() / "sluice-bench-convert";
  std::string kinds = "q4";
  int threads = 0, reps = 1;
  bool drop_caches = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--gb") gb = std::atof(next().c_str());
    else if (a == "--dir") dir = next();
    else if (a == "--kinds") kinds = next();
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--reps") reps = std::atoi(next().c_str());
    else if (a == "--drop-caches") drop_caches = true;
    else {
      std::fprintf(stderr, "usage: bench_convert [--gb 4] [--dir DIR] [--kinds q4] [--threads N] [--reps R] [--drop-caches]\n");
      return 2;
    }
  }
  try {
    const fs::path ck = dir / "checkpoint", out = dir / "pack";
    SyntheticSpec spec = synthetic_spec_for_bytes(static_cast<uint64_t>(gb * 1e9));
    std::error_code ec;
    std::ifstream spec_file(dir / "spec.txt");
    int64_t had_layers = -1;
    if (spec_file) spec_file >> had_layers;
    if (had_layers != spec.n_layer || !fs::exists(ck / "model.safetensors", ec)) {
      fs::remove_all(dir, ec);
      auto t0 = std::chrono::steady_clock::now();
      uint64_t bytes = write_synthetic_checkpoint(ck, spec, 1);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::ofstream(dir / "spec.txt") << spec.n_layer << "\n";
      std::fprintf(stderr, "bench_convert: wrote a %.2f GB checkpoint (%lld layers) in %.1f s\n", bytes / 1e9,
                   static_cast<long long>(spec.n_layer), s);
    }
    const uint64_t in_bytes = fs::file_size(ck / "model.safetensors");
    std::printf("| input GB | kinds | threads | cache | seconds | input MB/s | CPU s (user+sys) | input MB per CPU s | peak RSS MB |\n"
                "|---|---|---|---|---|---|---|---|---|\n");
    for (int r = 0; r < reps; ++r) {
      fs::remove_all(out, ec);
      if (drop_caches) {
        ::sync();
        std::ofstream("/proc/sys/vm/drop_caches") << "3\n";
      }
      auto t0 = std::chrono::steady_clock::now();
      pid_t pid = ::fork();
      if (pid == 0) {
        try {
          if (threads > 0) ThreadPool::set_global_threads(threads);
          ConvertOptions opt;
          opt.kinds = parse_expert_kinds(kinds);
          convert_checkpoint(ck, out, opt);
          std::_Exit(0);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "bench_convert: convert failed: %s\n", e.what());
          std::_Exit(1);
        }
      }
      int status = 0;
      struct rusage ru {};
      if (pid < 0 || ::wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "bench_convert: the convert child failed\n");
        return 1;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
      std::printf("| %.2f | %s | %d | %s | %.2f | %.0f | %.2f | %.0f | %.0f |\n", in_bytes / 1e9, kinds.c_str(),
                  threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()),
                  drop_caches ? "dropped" : "warm", s, in_bytes / 1e6 / s, cpu, in_bytes / 1e6 / cpu, ru.ru_maxrss / 1024.0);
      std::fflush(stdout);
    }
    fs::remove_all(out, ec);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_convert: %s\n", e.what());
    return 1;
  }
  return 0;
}
