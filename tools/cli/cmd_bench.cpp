// sluice bench: the benchmark users of llama.cpp know (llama-bench's flags and table): for each
// test, r repetitions after a warm-up, tokens/s as mean ± standard deviation, one markdown
// row (or a JSON object) per test. Tests:
//   -p N        prompt processing: a prefill of N tokens from an empty context      ppN
//   -n N        text generation: N decode steps from an empty context               tgN
//   -d D        with -n: the decode steps after a D-token prompt (not timed)         tgN @ dD
//   -gp P,T     a prefill of P tokens then T decode steps, timed together          ppP+tgT
// The tokens are a fixed pseudo-random sequence (tokenization and sampling excluded: decode
// steps are greedy, on the device where the backend samples there). With streamed experts
// (STREAMING options) the rows add the expert cache, the routing (the model's, or a replayed
// trace: --replay-routing), its hit rate and the read bandwidth of the timed part, and the
// bound of each row (--bound on, the default): the disk's O_DIRECT read rate measured at the
// start (expert records at the engine's queue depth, experts/read_rate.h), the bytes read a
// token, the IO bound (rate / bytes a token), the compute bound (the test once more through a
// streamer with --fake-experts: the same steps with no read) and the row's ratio to the tighter
// of the two (docs/streaming.md, "The IO bound").
#include <algorithm>
#include <chrono>
#include <optional>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "cli_common.h"
#include "cli_output.h"
#include "core/thread_pool.h"
#include "core/units.h"
#include "experts/read_rate.h"
#include "experts/routing_replay.h"
#include "experts/streaming_provider.h"

namespace sluice::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct Test {
  int64_t prompt = 0, generate = 0, depth = 0;
  std::string name() const {
    if (prompt > 0 && generate > 0) return str("pp", prompt, "+tg", generate);
    if (prompt > 0) return str("pp", prompt);
    return depth > 0 ? str("tg", generate, " @ d", depth) : str("tg", generate);
  }
  int64_t timed_tokens() const { return prompt + generate; }
};

struct Sample {
  double seconds = 0;
  double hit_rate = -1, read_bytes = 0;  // streaming only: read_bytes are the IO engine's (the disk's)
};

std::vector<int64_t> parse_list(const std::string& text, const char* option) {
  std::vector<int64_t> out;
  // Every item between commas counts, a trailing empty one too ("4," is as malformed as "4,,8").
  std::vector<std::string> items(1);
  for (char c : text) {
    if (c == ',') items.emplace_back();
    else items.back() += c;
  }
  for (const std::string& item : items) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    SLUICE_CHECK(!item.empty() && end && *end == '\0' && v >= 0 && v <= 1000000, Status::invalid_argument, option,
                 " ", text, ": expected comma-separated token counts from 0 to 1000000");
    out.push_back(v);
  }
  SLUICE_CHECK(!out.empty(), Status::invalid_argument, option, " needs at least one count");
  return out;
}

// The model's bytes on disk: a pack's dense.bin and the expert file of the kind in use, or a
// checkpoint's safetensors.
uint64_t model_bytes(const LoadedModel& m) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(m.dir, ec)) {
    const std::string n = e.path().filename().string();
    const bool pack_file = n == "dense.bin" || (m.expert_kind && n == str("experts.", expert_kind_name(*m.expert_kind), ".bin"));
    if (pack_file || e.path().extension() == ".safetensors") total += e.file_size(ec);
  }
  return total;
}

std::vector<int32_t> bench_tokens(int64_t n, int64_t vocab, uint64_t salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] =
        static_cast<int32_t>((static_cast<uint64_t>(i + 1) * 2654435761ull + salt * 40503ull) % static_cast<uint64_t>(vocab));
  return t;
}

// One run of test t through the model's expert provider `st` (null: none). finite_only: a step
// whose logits are not finite is an error (not for --fake-experts' slots, which hold anything).
Sample run_once(Session& s, StreamingProvider* st, const Test& t, uint64_t salt, bool finite_only = true) {
  Model& model = *s.model.model;
  const int64_t V = model.info().n_vocab;
  // Positions: the depth, the prompt, and one per decode step (each feeds its token).
  auto state = model.new_state(std::max<int64_t>(t.depth + t.prompt + t.generate, 2));
  std::vector<float> logits(static_cast<size_t>(V));
  if (t.depth > 0) {  // the context the timed decode starts from
    const std::vector<int32_t> d = bench_tokens(t.depth, V, salt + 1);
    for (int64_t i = 0; i < t.depth; i += 512)
      model.forward(std::span<const int32_t>(d).subspan(static_cast<size_t>(i), static_cast<size_t>(std::min<int64_t>(512, t.depth - i))),
                    *state, logits, false);
  }
  if (st) st->reset_stats();
  const std::vector<int32_t> p = bench_tokens(t.prompt, V, salt);
  const auto t0 = Clock::now();
  if (t.prompt > 0) model.forward(p, *state, logits, false);
  int32_t next = static_cast<int32_t>(salt % static_cast<uint64_t>(V));
  const SampleRule greedy{0.0f, 0, 1.0f};
  for (int64_t i = 0; i < t.generate; ++i) {
    next = model.forward_sample(next, *state, greedy, V, 0, i + 1 < t.generate ? std::optional<int64_t>(0) : std::nullopt);
    SLUICE_CHECK(next >= 0 || !finite_only, Status::corrupt, "bench: the model's logits are not finite at decode step ",
                 i + 1);
    next = std::max(next, 0);
  }
  Sample out;
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (st) {
    st->drain(st->options().io_timeout);
    const RunStats r = st->stats();
    out.hit_rate = r.hit_rate();
    out.read_bytes = static_cast<double>(r.io_bytes);
  }
  return out;
}

// The compute bound of a streamed test: the test once through `fake` (the run's streamer
// options with --fake-experts: the same plans, no read), as the model's provider meanwhile.
double compute_bound_seconds(Session& s, const std::shared_ptr<StreamingProvider>& fake, const Test& t, uint64_t salt) {
  Model& model = *s.model.model;
  model.set_expert_provider(fake);
  try {
    const Sample x = run_once(s, fake.get(), t, salt, /*finite_only=*/false);
    model.set_expert_provider(s.model.streamer);
    return x.seconds;
  } catch (...) {
    model.set_expert_provider(s.model.streamer);
    throw;
  }
}

std::string fixed(double v, int digits) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

}  // namespace

void register_bench(CLI::App& app) {
  struct Options {
    ModelOptions model;
    std::string prompts = "512", gens = "128", depths = "0", gps;
    int64_t reps = 5;
    std::string output = "md", bound = "on";
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("bench", "llama-bench style speed tests: prompt processing and generation");
  add_model_options(*cmd, opt->model);
  cmd->add_option("-p,--n-prompt", opt->prompts, "prompt tokens of the pp tests, comma-separated (default 512; 0: none)");
  cmd->add_option("-n,--n-gen", opt->gens, "decode steps of the tg tests, comma-separated (default 128; 0: none)");
  cmd->add_option("-d,--n-depth", opt->depths, "context before the tg tests, comma-separated (default 0)");
  cmd->add_option("--gp,--n-gen-prompt", opt->gps, "a pp+tg test: PROMPT,GEN (timed together; also -gp, as llama-bench)");
  add_integer(*cmd, "-r,--repetitions", opt->reps, IntRange::from(1, 1000), "repetitions of each test (default 5)");
  cmd->add_option("-o,--output", opt->output, "md (a markdown table, default) or json");
  cmd->add_option("--bound", opt->bound,
                  "streamed rows: on (default) measures the disk's O_DIRECT read rate and each test's compute bound "
                  "(once more with --fake-experts) and gives each row's ratio to its bound; off skips them");
  cmd->callback([opt] {
    SLUICE_CHECK(opt->output == "md" || opt->output == "json", Status::invalid_argument, "-o ", opt->output,
                 ": expected md or json");
    SLUICE_CHECK(opt->model.stats.empty(), Status::invalid_argument,
                 "--stats: sluice bench writes no statistics file (its rows carry the hit rate and read GB/s of each "
                 "test; sluice run --stats writes one)");
    SLUICE_CHECK(opt->bound == "on" || opt->bound == "off", Status::invalid_argument, "--bound ", opt->bound,
                 ": expected on or off");
    SLUICE_CHECK(opt->bound == "off" || !opt->model.fake_experts, Status::invalid_argument,
                 "--bound on measures the bound of a run that reads its experts: with --fake-experts give --bound off");
    std::vector<Test> tests;
    for (int64_t p : parse_list(opt->prompts, "-p"))
      if (p > 0) tests.push_back({p, 0, 0});
    for (int64_t n : parse_list(opt->gens, "-n"))
      for (int64_t d : parse_list(opt->depths, "-d"))
        if (n > 0) tests.push_back({0, n, d});
    if (!opt->gps.empty()) {
      const std::vector<int64_t> gp = parse_list(opt->gps, "-gp");
      SLUICE_CHECK(gp.size() == 2 && gp[0] > 0 && gp[1] > 0, Status::invalid_argument, "-gp ", opt->gps,
                   ": expected PROMPT,GEN, both above 0");
      tests.push_back({gp[0], gp[1], 0});
    }
    SLUICE_CHECK(!tests.empty(), Status::invalid_argument, "bench: no test (every -p and -n is 0)");
    Session s = open_session(opt->model);
    Model& model = *s.model.model;
    for (const Test& t : tests) model.check_context(t.depth + t.prompt + t.generate, str("the test ", t.name()));
    const ModelInfo& info = model.info();
    const std::string name = str(info.family, s.model.expert_kind ? str(" ", expert_kind_name(*s.model.expert_kind)) : "");
    const std::string size = byte_size_text(model_bytes(s.model));
    char params[32];  // as llama-bench prints them: "30.53 B", "11.70 M"
    const double np = static_cast<double>(info.n_params);
    std::snprintf(params, sizeof params, np >= 1e9 ? "%.2f B" : "%.2f M", np >= 1e9 ? np / 1e9 : np / 1e6);
    const int threads = ThreadPool::global().size();
    StreamingProvider* st = s.model.streamer.get();
    const std::string cache = st ? str(byte_size_text(static_cast<uint64_t>(st->n_slots()) * st->slot_bytes()), " (",
                                       st->n_slots(), " slots)")
                                 : "";
    const RoutingSource routing = model.routing_replay() ? model.routing_replay()->source() : RoutingSource{};
    // The bound: the disk's read rate now, and a streamer that reads nothing for the compute.
    const bool bound = st && opt->bound == "on";
    ReadRate disk;
    std::shared_ptr<StreamingProvider> fake;
    if (bound) {
      // About 1 GB, at most 3 s: a second of reads settles the rate of an SSD.
      disk = measure_read_rate(*s.model.pack, st->kind(), st->options().io_depth, uint64_t{1} << 30, 3.0);
      StreamerOptions fo = st->options();
      fo.cache_bytes = 0;
      fo.slots = st->n_slots();
      fo.fake_experts = true;
      fo.host_cache_bytes = 0;
      fo.host_cache_preload = false;
      fake = make_streamer(s.model.pack, st->kind(), info.n_expert_used, *s.backend, fo);
    }
    const std::string disk_text =
        str(fixed(disk.bytes_per_second / 1e9, 2), " GB/s: ", disk.direct ? "O_DIRECT" : "buffered (O_DIRECT refused)",
            " reads of ", byte_size_text(disk.record_bytes), " records at depth ", disk.depth, ", ",
            fixed(static_cast<double>(disk.bytes) / 1e9, 2), " GB in ", fixed(disk.seconds, 2), " s");
    if (opt->output == "md") {
      std::string top;
      if (routing.replayed) top += str("routing: replayed from ", routing.trace, " (", routing.mapping, ": ", routing.rule, ")\n");
      if (bound) top += str("disk: ", disk_text, "\n");
      if (routing.replayed || bound) top += "\n";
      const char* head = !st ? (routing.replayed ? " routing |" : "")
                         : bound ? " expert cache | routing | hit rate | read GB/s | MB/token | IO bound t/s | compute bound t/s | of bound |"
                                 : " expert cache | routing | hit rate | read GB/s |";
      const char* rule = !st ? (routing.replayed ? " --- |" : "")
                         : bound ? " --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
                                 : " --- | --- | ---: | ---: |";
      stdout_write(str(top, "| model | size | params | backend | threads | test | t/s |", head,
                       "\n| ----- | ---: | -----: | ------- | ------: | ---: | --: |", rule, "\n"));
    }
    nlohmann::json rows = nlohmann::json::array();
    uint64_t salt = 1;
    bool fake_warm = false;
    for (const Test& t : tests) {
      run_once(s, st, t, salt++);  // warm-up: caches, graphs, the expert cache's first fill
      std::vector<double> tps;
      double hit = 0, read = 0, seconds = 0;
      for (int64_t r = 0; r < opt->reps; ++r) {
        const Sample x = run_once(s, st, t, salt++);
        tps.push_back(static_cast<double>(t.timed_tokens()) / x.seconds);
        hit += x.hit_rate;
        read += x.read_bytes;
        seconds += x.seconds;
      }
      const double mean = std::accumulate(tps.begin(), tps.end(), 0.0) / static_cast<double>(tps.size());
      double var = 0;
      for (double v : tps) var += (v - mean) * (v - mean);
      const double sd = tps.size() > 1 ? std::sqrt(var / static_cast<double>(tps.size() - 1)) : 0;
      const double reps = static_cast<double>(opt->reps);
      // The bound: IO (the disk's rate over the bytes a token) and compute (no reads).
      const double bytes_per_token = read / reps / static_cast<double>(t.timed_tokens());
      const double io_tps = bytes_per_token > 0 ? disk.bytes_per_second / bytes_per_token : INFINITY;
      double compute_tps = 0, bound_tps = 0;
      if (bound) {
        if (!fake_warm) compute_bound_seconds(s, fake, t, salt++);  // the fake streamer's warm-up, once
        fake_warm = true;
        compute_tps = static_cast<double>(t.timed_tokens()) / compute_bound_seconds(s, fake, t, salt++);
        bound_tps = std::min(io_tps, compute_tps);
      }
      if (opt->output == "md") {  // every row written and checked as it comes (a full disk is an error)
        char line[512];
        std::snprintf(line, sizeof line, "| %s | %s | %s | %s | %d | %s | %.2f ± %.2f |", name.c_str(), size.c_str(), params,
                      s.backend->name().c_str(), threads, t.name().c_str(), mean, sd);
        std::string row = line;
        if (!st && routing.replayed) row += str(" ", routing.short_label(), " |");
        if (st) {
          std::snprintf(line, sizeof line, " %s | %s | %.3f | %.2f |", cache.c_str(), routing.short_label().c_str(),
                        hit / reps, read / seconds / 1e9);
          row += line;
        }
        if (bound) {
          std::snprintf(line, sizeof line, " %.2f | %s | %.2f | %.2fx |", bytes_per_token / 1e6,
                        std::isfinite(io_tps) ? fixed(io_tps, 2).c_str() : "-", compute_tps, bound_tps / mean);
          row += line;
        }
        stdout_write(row + "\n");
      }
      nlohmann::json row = {{"model", name}, {"size_bytes", model_bytes(s.model)}, {"n_params", info.n_params},
                            {"backend", s.backend->name()}, {"threads", threads}, {"test", t.name()},
                            {"n_prompt", t.prompt}, {"n_gen", t.generate}, {"n_depth", t.depth},
                            {"repetitions", opt->reps}, {"avg_ts", mean}, {"stddev_ts", sd}, {"samples_ts", tps}};
      if (st || routing.replayed) row["routing"] = routing.to_json();
      if (st) {
        row["expert_cache_slots"] = st->n_slots();
        row["hit_rate"] = hit / reps;
        row["read_bytes_per_second"] = read / seconds;
        row["bytes_read_per_token"] = bytes_per_token;
      }
      if (bound) {
        row["disk_read_bytes_per_second"] = disk.bytes_per_second;
        row["disk_read_direct"] = disk.direct;
        row["disk_read_record_bytes"] = disk.record_bytes;
        row["disk_read_depth"] = disk.depth;
        row["io_bound_ts"] = std::isfinite(io_tps) ? nlohmann::json(io_tps) : nlohmann::json(nullptr);
        row["compute_bound_ts"] = compute_tps;
        row["bound_ts"] = bound_tps;
        row["of_bound"] = bound_tps / mean;
      }
      rows.push_back(std::move(row));
    }
    if (opt->output == "json") stdout_write(rows.dump(2) + "\n");
  });
}

}  // namespace sluice::cli
