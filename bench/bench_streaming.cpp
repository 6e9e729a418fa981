// bench_streaming: decode speed when the experts stream from disk, against the disk itself.
//
//   bench_streaming [--dir DIR] [--gb 6] [--kind q4] [--cache-gb G] [--tokens 32] [--prompt 8]
//                   [--threads N] [--io-depth 8] [--depths 1,4,8,16,32] [--lookahead off,on]
//                   [--prefill-banks 1,2] [--keep]
//
// 1. Writes (once; reused while the spec matches) a synthetic qwen3_moe-shaped pack of about
//    --gb GB of experts of one kind (Qwen3-30B-A3B's shapes: n_embd 2048, 128 experts of
//    n_ff 768, top-8; as many layers as the size asks for), straight as a pack.
// 2. Drops the page cache when run as root (ignored otherwise).
// 3. Measures the disk's O_DIRECT read bandwidth on that pack's expert file with the IO
//    engine: random whole records at each queue depth of --depths.
// 4. Decodes --tokens tokens (a fixed pseudo-random token stream, after a --prompt-token
//    prefill) on the CPU backend with
//    an expert cache of --cache-gb (default: a twelfth of the pack), once per --lookahead
//    setting, and prints a markdown row per run: decode tokens/s, hit rate, GB read, the
//    achieved read bandwidth (over busy IO time and over the decode's wall time) against the
//    best direct bandwidth measured in step 3, the share of read time hidden behind compute,
//    and the wait per token.
//
// 5. With --prefill-banks: prefills the --prompt tokens from a cold cache once per bank count
//    (1: each sub-batch planned after the previous retired; 2: the next sub-batch's reads
//    issued while this one computes) and prints prefill tokens/s, sub-batches per layer,
//    GB read, wait and compute seconds, against the IO bound (GB read / the disk's best) and
//    the compute bound (the run's expert compute seconds plus its dense work).
//
// Random weights route almost uniformly, so the hit rate is about cache / pack: the decode is
// miss-bound by construction, which is what this measures.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "testkit/synthetic_model.h"
#include "core/thread_pool.h"
#include "engine/generator.h"
#include "experts/io_engine.h"
#include "experts/read_rate.h"
#include "experts/streamer.h"
#include "models/load.h"

using namespace sluice;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t c = std::min(s.find(',', pos), s.size());
    out.push_back(s.substr(pos, c - pos));
    pos = c + 1;
  }
  return out;
}

void drop_caches() {
  if (::geteuid() != 0) return;
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (f) f << "3\n";
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir = fs::temp_directory_path() / "sluice-bench-streaming";
  double gb = 6, cache_gb = 0;
  std::string kind_name = "q4", depths_text = "1,4,8,16,32", lookahead_text = "off,on", banks_text;
  int64_t n_tokens = 32, n_prompt = 8;
  int threads = 0, io_depth = 8;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--dir") dir = next();
    else if (a == "--gb") gb = std::atof(next().c_str());
    else if (a == "--kind") kind_name = next();
    else if (a == "--cache-gb") cache_gb = std::atof(next().c_str());
    else if (a == "--tokens") n_tokens = std::atoll(next().c_str());
    else if (a == "--prompt") n_prompt = std::atoll(next().c_str());
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--io-depth") io_depth = std::atoi(next().c_str());
    else if (a == "--depths") depths_text = next();
    else if (a == "--lookahead") lookahead_text = next();
    else if (a == "--keep") keep = true;
    else if (a == "--prefill-banks") banks_text = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_streaming [--dir DIR] [--gb 6] [--kind q4] [--cache-gb G] [--tokens 32] [--prompt 8]\n"
                   "                       [--threads N] [--io-depth 8] [--depths 1,4,8,16,32] [--lookahead off,on]\n"
                   "                       [--prefill-banks 1,2] [--keep]\n");
      return 2;
    }
  }
  try {
    if (threads > 0) ThreadPool::set_global_threads(threads);
    const std::optional<DType> kind = expert_kind_from_name(kind_name);
    SLUICE_CHECK(kind, Status::invalid_argument, "--kind: unknown kind ", kind_name);

    // 1. The pack: Qwen3-30B-A3B's expert and attention shapes, a small vocabulary.
    SyntheticSpec spec;
    spec.n_embd = 2048;
    spec.n_ff = 768;
    spec.n_expert = 128;
    spec.n_expert_used = 8;
    spec.n_head = 32;
    spec.n_head_kv = 4;
    spec.head_dim = 128;
    spec.n_vocab = 8192;
    const uint64_t stride = pack_kind_layout(*kind, spec.n_embd, spec.n_ff).record_stride;
    spec.n_layer = std::max<int64_t>(2, static_cast<int64_t>(gb * 1e9 / static_cast<double>(stride * spec.n_expert) + 0.5));
    const fs::path pack = dir / "pack";
    const std::string tag = str(spec.n_layer, " ", kind_name);
    std::string had;
    {
      std::ifstream sf(dir / "spec.txt");
      std::getline(sf, had);
    }
    std::error_code ec;
    if (had != tag || !Pack::is_pack(pack)) {
      fs::remove_all(dir, ec);
      fs::create_directories(dir);
      const auto t0 = Clock::now();
      const uint64_t bytes = write_synthetic_pack(pack, spec, {*kind});
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      std::ofstream(dir / "spec.txt") << tag << "\n";
      std::fprintf(stderr, "bench_streaming: wrote a %.2f GB %s pack (%lld layers x %lld experts) in %.1f s\n",
                   bytes / 1e9, kind_name.c_str(), static_cast<long long>(spec.n_layer),
                   static_cast<long long>(spec.n_expert), s);
    }
    std::shared_ptr<Pack> p = Pack::open(pack, false);
    const int64_t n_records = p->manifest().n_records();
    const uint64_t pack_bytes = static_cast<uint64_t>(n_records) * stride;
    const uint64_t cache_bytes = cache_gb > 0 ? static_cast<uint64_t>(cache_gb * 1e9) : pack_bytes / 12;

    // 2-3. The disk.
    drop_caches();
    std::printf("## bench_streaming: %s pack %.2f GB (%lld records of %.2f MB), %d threads\n\n", kind_name.c_str(),
                pack_bytes / 1e9, static_cast<long long>(n_records), stride / 1e6,
                threads > 0 ? threads : ThreadPool::global().size());
    std::printf("| disk: O_DIRECT random records, queue depth | GB/s |\n|---|---|\n");
    double disk_best = 0;
    bool direct = true;
    int seed = 1;
    for (const std::string& d : split(depths_text)) {
      const int depth = std::atoi(d.c_str());
      // About 1 GB per depth (at least 4 reads per slot in flight), fewer on a small pack.
      const uint64_t bytes = std::min<uint64_t>(1000000000, static_cast<uint64_t>(n_records) * stride);
      const ReadRate rate = measure_read_rate(*p, *kind, depth, bytes, 60, static_cast<uint64_t>(seed++));
      direct = direct && rate.direct;
      const double bw = rate.bytes_per_second / 1e9;
      disk_best = std::max(disk_best, bw);
      std::printf("| %d | %.2f |\n", depth, bw);
      std::fflush(stdout);
    }
    if (!direct) std::printf("\n(the file system refused O_DIRECT: these reads went through the page cache)\n");
    std::printf("\n");

    // 4. Decode.
    std::printf("| cache | lookahead | io depth | decode tok/s | hit rate | GB read | read GB/s (busy) | read GB/s (wall) | "
                "vs disk | read time hidden | wait ms/token |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const std::string& la : split(lookahead_text)) {
      drop_caches();
      auto be = make_cpu_backend();
      LoadOptions lo;
      lo.expert_kind = *kind;
      StreamerOptions so;
      so.cache_bytes = cache_bytes;
      so.io_depth = io_depth;
      so.lookahead = la == "on";
      lo.streaming = so;
      LoadedModel m = load_model(pack, *be, lo);
      StreamingProvider& st = *m.streamer;
      // Prefill (its reads warm nothing useful on uniform routing), then a fresh window.
      std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
      for (int64_t i = 0; i < n_prompt; ++i) prompt[static_cast<size_t>(i)] = static_cast<int32_t>(1 + i * 37 % 4000);
      auto state = m.model->new_state(n_prompt + n_tokens + 1);
      std::vector<float> logits(static_cast<size_t>(m.model->info().n_vocab));
      m.model->forward(prompt, *state, logits, false);
      st.reset_stats();
      const auto t0 = Clock::now();
      for (int64_t t = 0; t < n_tokens; ++t) {
        // A fixed pseudo-random token stream rather than sampling: a random model's greedy
        // output repeats one token, whose routing would repeat too and turn misses into hits.
        const int32_t next = static_cast<int32_t>((t * 2654435761u + 12345u) % static_cast<uint64_t>(spec.n_vocab));
        m.model->forward(std::span<const int32_t>(&next, 1), *state, logits, false);
      }
      const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
      st.drain(std::chrono::seconds(30));
      RunStats r = st.stats();
      r.decode_tokens = static_cast<uint64_t>(n_tokens);
      r.decode_seconds = wall;
      const LayerStats tot = r.totals();
      const double busy_bw = r.read_bytes_per_second() / 1e9, wall_bw = r.io_bytes / wall / 1e9;
      std::printf("| %.2f GB (%lld slots) | %s | %d | %.2f | %.3f | %.2f | %.2f | %.2f | %.0f%% (busy), %.0f%% (wall) | "
                  "%.0f%% | %.1f |\n",
                  r.cache_bytes / 1e9, static_cast<long long>(r.slots), la.c_str(), io_depth,
                  r.decode_tokens_per_second(), r.hit_rate(), r.io_bytes / 1e9, busy_bw, wall_bw,
                  disk_best > 0 ? 100 * busy_bw / disk_best : 0, disk_best > 0 ? 100 * wall_bw / disk_best : 0,
                  100 * r.read_hidden_share(),
                  1e3 * (tot.demand_wait_seconds + tot.prefetch_wait_seconds) / static_cast<double>(n_tokens));
      std::fflush(stdout);
      for (const std::string& e : r.consistency_errors(stride)) std::fprintf(stderr, "bench_streaming: stats: %s\n", e.c_str());
    }
    // 5. Prefill, one bank against two.
    if (!banks_text.empty()) {
      std::printf("\n| cache | prefill banks | prompt tokens | prefill tok/s | sub-batches a layer | tokens a sub-batch | "
                  "overlapped | GB read | IO bound s | wait s | compute s | wall s |\n"
                  "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
      for (const std::string& nb : split(banks_text)) {
        drop_caches();
        auto be = make_cpu_backend();
        LoadOptions lo;
        lo.expert_kind = *kind;
        StreamerOptions so;
        so.cache_bytes = cache_bytes;
        so.io_depth = io_depth;
        so.prefill_banks = std::atoi(nb.c_str());
        lo.streaming = so;
        LoadedModel m = load_model(pack, *be, lo);
        std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
        for (int64_t i = 0; i < n_prompt; ++i)
          prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 2654435761u + 7u) % static_cast<uint64_t>(spec.n_vocab));
        auto state = m.model->new_state(n_prompt);
        std::vector<float> logits(static_cast<size_t>(m.model->info().n_vocab));
        const auto t0 = Clock::now();
        m.model->forward(prompt, *state, logits, false);
        const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
        m.streamer->drain(std::chrono::seconds(30));
        const RunStats r = m.streamer->stats();
        const LayerStats& pre = r.prefill;
        const double gb_read = static_cast<double>(pre.bytes_demand + pre.bytes_prefetch) / 1e9;
        std::printf("| %.2f GB (%lld slots) | %s | %lld | %.1f | %.1f | %.1f | %llu | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
                    r.cache_bytes / 1e9, static_cast<long long>(r.slots), nb.c_str(), static_cast<long long>(n_prompt),
                    static_cast<double>(n_prompt) / wall, static_cast<double>(pre.steps) / static_cast<double>(r.layers.size()),
                    pre.steps ? static_cast<double>(pre.rows) / static_cast<double>(pre.steps) : 0.0,
                    static_cast<unsigned long long>(pre.overlapped), gb_read, disk_best > 0 ? gb_read / disk_best : 0.0,
                    pre.demand_wait_seconds, pre.compute_seconds, wall);
        std::fflush(stdout);
        for (const std::string& e : r.consistency_errors(stride)) std::fprintf(stderr, "bench_streaming: stats: %s\n", e.c_str());
      }
    }
    if (!keep) fs::remove_all(dir, ec);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_streaming: %s\n", e.what());
    return 1;
  }
  return 0;
}
