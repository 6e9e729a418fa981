// Shared CLI helpers.
#include "cli_common.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>

#include "core/log.h"
#include "core/thread_pool.h"
#include "core/units.h"
#include "experts/routing_replay.h"
#include "experts/simulate.h"

namespace sluice::cli {

namespace {
bool given(const CLI::Option* o) { return o != nullptr && o->count() > 0; }
// --wait-timeout's largest value in seconds (11.6 days): beyond any real wait, and its
// milliseconds fit std::chrono's int64 with room to spare.
constexpr double kWaitTimeoutMax = 1e6;
}  // namespace

void add_model_options(CLI::App& cmd, ModelOptions& opt) {
  cmd.add_option("--model", opt.model, "model directory: an HF checkpoint or a pack (sluice convert)")->required();
  cmd.add_option("--expert-kind", opt.expert_kind,
                 "expert precision of a pack: bf16, int8, q4, q2 or mxfp4 (default: the first of q4, mxfp4, int8, bf16, q2 it holds)");
  add_threads(cmd, opt.threads, "CPU threads");
  add_integer(cmd, "--ubatch", opt.ubatch, IntRange::from(1, 65536),
              "prompt tokens per forward pass: a long prompt is prefilled in chunks of N (default 512, as llama.cpp's ubatch)");
  cmd.add_option("--backend", opt.backend, "cpu, cuda, cuda:N or auto (default: CUDA when available)");
  cmd.add_option("--kv-cache", opt.kv_cache,
                 "dtype of the attention KV cache: f32, bf16 (half the memory) or auto (default: bf16 on CUDA, "
                 "f32 on the CPU)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  // Expert streaming.
  auto* cache = cmd.add_option("--expert-cache", opt.expert_cache,
                               "stream the experts of a pack through a cache of this size (512M, 8G)");
  auto* slots = add_integer(cmd, "--expert-slots", opt.expert_slots, IntRange::at_least(1),
                            "stream through a cache of N expert slots");
  cache->excludes(slots);
  cmd.add_option("--policy", opt.policy, str("expert cache eviction policy: lru, lfu, lrfu, fifo, markov (default ", policy_name(kDefaultPolicy), ")"));
  cmd.add_option("--io", opt.io, "expert reads: direct (O_DIRECT, default) or buffered (page cache)");
  add_integer(cmd, "--io-depth", opt.io_depth, IntRange::from(1, 256), "expert reads in flight (default 8)");
  cmd.add_option("--host-cache", opt.host_cache,
                 "a host tier (records in this machine's RAM) of this size between the expert cache and the pack");
  cmd.add_option("--lookahead", opt.lookahead, "prefetch the next layer's predicted experts: on or off (default off)");
  opt.cut_option = add_real(cmd, "--cut", opt.cut, RealRange::from(0, 1, "0: off"),
           "deadline: cut late misses whose routing weight is below W (default 0: off)");
  cmd.add_option("--miss-kind", opt.miss_kind, "a late miss may use this low-bit copy instead (e.g. q2)");
  cmd.add_option("--stats", opt.stats, "write the streaming statistics as JSON");
  cmd.add_flag("--verify-reads", opt.verify_reads, "check every expert read against its checksum");
  cmd.add_option("--wait", opt.wait, "CUDA streaming: host waits spin (default) or block (sleep between looks)");
  add_real(cmd, "--wait-timeout", opt.wait_timeout, RealRange::above(0, kWaitTimeoutMax, "seconds"),
           "CUDA streaming: seconds any host/device wait may take before the run fails (default 30)");
  cmd.add_flag("--host-cache-preload", opt.host_cache_preload,
               "benchmarks (CUDA): fill the --host-cache tier from the pack at start-up and report read and H2D GB/s");
  cmd.add_flag("--fake-experts", opt.fake_experts,
               "developer: skip expert reads and compute with whatever the slots hold (output is meaningless)");
  cmd.add_option("--ple-cache", opt.ple_cache,
                 "row cache of each PLE n-gram or per-layer embedding table of a pack (default 64M; 0: none)");
  cmd.add_option("--profile", opt.profile,
                 str("streaming profile: exact (default; bit-identical to the resident run) or fast (a late miss "
                     "below ", kProfileFastCutShare, " of its token's uniform routing weight is cut: --cut ",
                     kProfileFastCutShare / 2, " at top-2, ", kProfileFastCutShare / 8,
                     " at top-8; an explicit --cut overrides it)"));
  cmd.add_option("--replay-routing", opt.replay_routing,
                 "benchmarks (run, bench): every MoE layer's routing from this recorded trace (JSON lines, .xz "
                 "too) instead of the model's router, mapped onto the model's shape (docs/streaming.md)");
  cmd.add_option("--replay-map", opt.replay_map,
                 "with --replay-routing: ids (the trace's expert ids), fit (a generator fitted on the trace) or auto "
                 "(default: ids when the expert counts agree and the trace routes at least the model's top-k)");
  cmd.add_flag("--deadline-worst-case", opt.deadline_worst_case,
               "measurement: every miss counts as late at the deadline, so --cut/--miss-kind cost their worst case "
               "whatever the disk's speed");
}

void check_no_replay(const ModelOptions& opt, std::string_view command) {
  SLUICE_CHECK(opt.replay_routing.empty() && opt.replay_map.empty(), Status::invalid_argument, "--replay-routing: sluice ",
               command, " computes with the model's own routing (a replayed routing is for the benchmarks: sluice run "
               "and sluice bench)");
}

namespace {
// --replay-routing: the trace mapped onto the model, set on it; its description on stderr.
void set_replay(const ModelOptions& opt, Session& s) {
  SLUICE_CHECK(opt.replay_map.empty() || !opt.replay_routing.empty(), Status::invalid_argument,
               "--replay-map needs --replay-routing TRACE");
  if (opt.replay_routing.empty()) return;
  const std::optional<ReplayMapping> mapping = replay_mapping_from_name(opt.replay_map.empty() ? "auto" : opt.replay_map);
  SLUICE_CHECK(mapping, Status::invalid_argument, "--replay-map: '", opt.replay_map, "' (auto, ids or fit)");
  const ModelInfo& info = s.model.model->info();
  SLUICE_CHECK(!info.moe_layers.empty() && info.n_expert > 0, Status::invalid_argument, "--replay-routing: ",
               s.model.dir.string(), " (", info.family, ") has no routed experts to replay a routing on");
  const Trace trace = read_trace(opt.replay_routing);
  const ReplayShape shape{static_cast<int64_t>(info.moe_layers.size()), info.n_expert, info.n_expert_used};
  auto replay = std::make_shared<RoutingReplay>(
      map_routing_trace(trace, std::filesystem::path(opt.replay_routing).filename().string(), shape, *mapping));
  s.model.model->set_routing_replay(replay);
  std::fprintf(stderr, "sluice: %s\n", replay->label().c_str());
  if (!replay->table().fit.empty()) std::fprintf(stderr, "sluice: routing fit: %s\n", replay->table().fit.c_str());
}
}  // namespace

std::optional<StreamerOptions> streamer_options(const ModelOptions& opt) {
  SLUICE_CHECK(opt.profile.empty() || opt.profile == "exact" || opt.profile == "fast", Status::invalid_argument,
               "--profile: '", opt.profile, "' (exact or fast)");
  const bool on = !opt.expert_cache.empty() || opt.expert_slots > 0;
  if (!on) {
    const std::pair<bool, const char*> extras[] = {
        {!opt.policy.empty(), "--policy"},       {!opt.io.empty(), "--io"},
        {opt.io_depth > 0, "--io-depth"},        {!opt.host_cache.empty(), "--host-cache"},
        {!opt.lookahead.empty(), "--lookahead"}, {opt.cut > 0, "--cut"},
        {!opt.miss_kind.empty(), "--miss-kind"}, {!opt.stats.empty(), "--stats"},
        {opt.verify_reads, "--verify-reads"},    {!opt.wait.empty(), "--wait"},
        {opt.wait_timeout > 0, "--wait-timeout"}, {opt.fake_experts, "--fake-experts"},
        {opt.profile == "fast", "--profile fast"}, {opt.deadline_worst_case, "--deadline-worst-case"}};
    for (const auto& [given, name] : extras)
      SLUICE_CHECK(!given, Status::invalid_argument, name,
                   " is an expert streaming option: also give --expert-cache SIZE or --expert-slots N");
    return std::nullopt;
  }
  StreamerOptions so;
  if (!opt.stats.empty()) expect_output_file(opt.stats, "--stats", "a file for the streaming statistics (JSON)");
  if (!opt.expert_cache.empty()) {
    so.cache_bytes = parse_byte_size(opt.expert_cache, "--expert-cache");
    SLUICE_CHECK(so.cache_bytes > 0, Status::invalid_argument, "--expert-cache must be larger than 0");
  }
  so.slots = opt.expert_slots;
  if (!opt.policy.empty()) {
    std::optional<PolicyKind> p = policy_from_name(opt.policy);
    SLUICE_CHECK(p && *p != PolicyKind::belady, Status::invalid_argument, "--policy: unknown policy '", opt.policy,
                 "' (lru, lfu, lrfu, fifo, markov; belady is for sluice simulate only)");
    so.policy = *p;
  }
  if (!opt.io.empty()) {
    SLUICE_CHECK(opt.io == "direct" || opt.io == "buffered", Status::invalid_argument, "--io: '", opt.io,
                 "' (direct or buffered)");
    so.io_mode = opt.io == "direct" ? IoMode::direct : IoMode::buffered;
  }
  if (opt.io_depth > 0) so.io_depth = opt.io_depth;
  if (!opt.host_cache.empty()) so.host_cache_bytes = parse_byte_size(opt.host_cache, "--host-cache");
  if (!opt.lookahead.empty()) {
    SLUICE_CHECK(opt.lookahead == "on" || opt.lookahead == "off", Status::invalid_argument, "--lookahead: '",
                 opt.lookahead, "' (on or off)");
    so.lookahead = opt.lookahead == "on";
  }
  so.cut = opt.cut;
  if (!opt.miss_kind.empty()) {
    so.miss_kind = expert_kind_from_name(opt.miss_kind);
    SLUICE_CHECK(so.miss_kind, Status::invalid_argument, "--miss-kind: unknown kind '", opt.miss_kind,
                 "' (kinds: bf16, int8, q4, q2, mxfp4)");
  }
  if (opt.profile == "fast" && !given(opt.cut_option)) so.cut_share = kProfileFastCutShare;  // an explicit --cut stays
  so.deadline_worst_case = opt.deadline_worst_case;
  so.verify_reads = opt.verify_reads;
  if (!opt.wait.empty()) {
    SLUICE_CHECK(opt.wait == "spin" || opt.wait == "block", Status::invalid_argument, "--wait: '", opt.wait,
                 "' (spin or block)");
    so.wait_mode = opt.wait == "spin" ? WaitMode::spin : WaitMode::block;
  }
  if (opt.wait_timeout > 0)
    so.wait_timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.wait_timeout * 1000 + 0.5));
  so.fake_experts = opt.fake_experts;
  so.host_cache_preload = opt.host_cache_preload;
  SLUICE_CHECK(!so.host_cache_preload || so.host_cache_bytes > 0, Status::invalid_argument,
               "--host-cache-preload needs --host-cache SIZE");
  if (so.fake_experts) LOG_WARN("--fake-experts: expert reads are skipped; the output is meaningless (a speed bound only)");
  return so;
}

std::optional<RunStats> finish_streaming(const ModelOptions& opt, Session& s, const RunTokens& tokens) {
  if (!s.model.streamer) return std::nullopt;
  StreamingProvider& st = *s.model.streamer;
  if (!st.drain(st.options().io_timeout)) LOG_WARN("expert reads still in flight after the run; statistics omit them");
  RunStats r = st.stats();
  r.prefill_tokens = static_cast<uint64_t>(tokens.prefill_tokens);
  r.decode_tokens = static_cast<uint64_t>(tokens.decode_tokens);
  r.prefill_seconds = tokens.prefill_seconds;
  r.decode_seconds = tokens.decode_seconds;
  r.kl_check = tokens.kl_check;
  if (const RoutingReplay* replay = s.model.model->routing_replay()) r.routing = replay->source();
  if (!opt.stats.empty()) r.write_json(opt.stats);
  return r;
}

void check_kl_check_options(const ModelOptions& opt, int64_t n_steps) {
  SLUICE_CHECK(n_steps <= 0 || !opt.fake_experts, Status::invalid_argument,
               "--kl-check cannot measure --fake-experts: its experts are never read, so no step is exact");
}

KlCheckStats plan_kl_check(const ModelOptions& opt, const Session& s, int64_t n_steps) {
  KlCheckStats kl;
  if (n_steps <= 0) return kl;
  kl.on = true;
  check_kl_check_options(opt, n_steps);
  if (!s.model.streamer || !s.model.streamer->options().lossy()) {
    kl.by_construction = true;  // every step is the exact one: nothing to compare
    return kl;
  }
  SLUICE_CHECK(s.model.model->decode_step_rerunnable(), Status::invalid_argument, "--kl-check: the ",
               s.model.model->info().family,
               " family's decode step cannot run twice at one position, so the exact step cannot run beside the "
               "lossy one");
  return kl;
}

std::shared_ptr<StreamingProvider> make_exact_streamer(const Session& s) {
  // The same cache size, so the checked steps stay about as fast as the run's; nothing that
  // changes a result (--cut, --miss-kind) and nothing that would read ahead in the background
  // while the lossy step runs (lookahead, the host tier's reads).
  const StreamingProvider& main = *s.model.streamer;
  StreamerOptions so = main.options();
  so.cache_bytes = 0;
  so.slots = main.n_slots();
  so.cut = 0;
  so.cut_share = 0;
  so.miss_kind.reset();
  so.lookahead = false;
  so.host_cache_bytes = 0;
  so.host_cache_preload = false;
  so.deadline_worst_case = false;
  so.fake_experts = false;
  return make_streamer(s.model.pack, *s.model.expert_kind, s.model.model->info().n_expert_used, *s.backend, so);
}

std::string kl_check_summary(const KlCheckStats& kl) {
  if (kl.by_construction)
    return "0 nats/token by construction: no lossy option (--cut, --miss-kind) is on, so every step is the exact "
           "one; nothing checked";
  char line[256];
  std::snprintf(line, sizeof line,
                "mean %.6f max %.6f nats/token KL(exact || lossy) over %lld of %lld decode steps (exact passes %.2f s, "
                "not in the tok/s)",
                kl.mean_nats, kl.max_nats, static_cast<long long>(kl.steps), static_cast<long long>(kl.decode_steps),
                kl.seconds);
  return line;
}

DType parse_dense_option(const std::string& text) {
  std::optional<DType> t = dense_dtype_from_name(text);
  SLUICE_CHECK(t, Status::invalid_argument, "--dense: '", text.substr(0, 64), "' is not bf16, f32, int8 or q4");
  return *t;
}

std::vector<int32_t> parse_token_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int32_t v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    SLUICE_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size() && v >= 0,
                 Status::invalid_argument, "--tokens: '", item, "' is not a token id (expected e.g. 3,17,42)");
    ids.push_back(v);
    pos = comma + 1;
  }
  return ids;
}

void add_prompt_options(CLI::App& cmd, PromptOptions& opt) {
  opt.prompt_option = cmd.add_option("--prompt", opt.prompt, "prompt text (\"\": the bos token alone)");
  opt.tokens_option = cmd.add_option("--tokens", opt.tokens, "prompt as token ids, e.g. 3,17,42");
  opt.prompt_option->excludes(opt.tokens_option);
}

void require_prompt(const PromptOptions& opt, std::string_view command) {
  SLUICE_CHECK(opt.prompt_option->count() > 0 || opt.tokens_option->count() > 0, Status::invalid_argument, command,
               " needs --prompt or --tokens");
}

std::vector<int32_t> prompt_tokens(const LoadedModel& m, const PromptOptions& opt) {
  if (opt.tokens_option->count() > 0) return parse_token_list(opt.tokens);
  if (opt.prompt.empty()) {
    const std::optional<int32_t> bos = m.bos_id();
    SLUICE_CHECK(bos.has_value(), Status::invalid_argument, "--prompt is empty and ", m.dir.string(),
                 " has no bos token to start from: give some text, or --tokens");
    return {*bos};
  }
  SLUICE_CHECK(m.tokenizer.has_value(), Status::invalid_argument, "--prompt needs a tokenizer.json in ",
               m.dir.string(), "; pass --tokens instead");
  std::vector<int32_t> ids = m.tokenizer->encode(opt.prompt, m.tokenizer->add_bos());
  SLUICE_CHECK(!ids.empty(), Status::invalid_argument, "the prompt encodes to no tokens");
  return ids;
}

Session open_session(const ModelOptions& opt) {
  expect_directory(opt.model, "--model", "a directory with config.json and *.safetensors, or a pack");
  if (!opt.replay_routing.empty()) expect_input_file(opt.replay_routing, "--replay-routing", "a routing trace (JSON lines)");
  if (opt.threads > 0) ThreadPool::set_global_threads(opt.threads);
  LoadOptions lo;
  if (!opt.expert_kind.empty()) {
    lo.expert_kind = expert_kind_from_name(opt.expert_kind);
    SLUICE_CHECK(lo.expert_kind, Status::invalid_argument, "--expert-kind: unknown kind '", opt.expert_kind,
                 "' (kinds: bf16, int8, q4, q2, mxfp4)");
  }
  lo.streaming = streamer_options(opt);
  if (!opt.ple_cache.empty()) lo.ngram_tables.cache_bytes = parse_byte_size(opt.ple_cache, "--ple-cache");
  if (lo.streaming) {  // the tables' rows are read like the experts
    lo.ngram_tables.io_mode = lo.streaming->io_mode;
    lo.ngram_tables.verify_reads = lo.streaming->verify_reads;
    lo.ngram_tables.io_timeout = lo.streaming->io_timeout;
  }
  Session s;
  s.backend = make_backend(opt.backend);
  // The host tier lives in this machine's memory whatever the backend: it must fit what is
  // available (the CPU backend's measure: MemAvailable within any cgroup limit).
  if (lo.streaming && lo.streaming->host_cache_bytes > 0) {
    const std::optional<uint64_t> avail =
        s.backend->name() == "cpu" ? s.backend->memory_available() : make_cpu_backend()->memory_available();
    SLUICE_CHECK(!avail || lo.streaming->host_cache_bytes <= *avail, Status::out_of_memory, "--host-cache ",
                 opt.host_cache, " is more than the ", byte_size_text(*avail), " of memory available");
  }
  // f32 or bf16 as named (checked by the option), or auto: the backend's (Backend::auto_kv_dtype).
  s.backend->set_kv_dtype(opt.kv_cache == "auto" ? s.backend->auto_kv_dtype() : *dtype_from_name(opt.kv_cache));
  s.model = load_model(opt.model, *s.backend, lo);
  set_replay(opt, s);
  return s;
}

namespace {
std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted.store(true); }
}  // namespace

InterruptFlag::InterruptFlag() {
  g_interrupted.store(false);
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sa.sa_flags = SA_RESTART;  // a write blocked on a pipe or FIFO resumes instead of failing with EINTR
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
}

InterruptFlag::~InterruptFlag() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

const std::atomic<bool>* InterruptFlag::flag() const { return &g_interrupted; }

Progress::Progress(std::string label) : label_(std::move(label)), tty_(::isatty(2) == 1) {}

void Progress::update(const std::string& counts, uint64_t bytes_done, uint64_t bytes_total, double seconds) {
  const double frac = bytes_total ? static_cast<double>(bytes_done) / static_cast<double>(bytes_total) : 1.0;
  const double rate = seconds > 0 ? static_cast<double>(bytes_done) / seconds : 0;  // bytes/s
  const double eta = rate > 0 ? static_cast<double>(bytes_total - std::min(bytes_done, bytes_total)) / rate : 0;
  char eta_text[32];
  std::snprintf(eta_text, sizeof eta_text, "%d:%02d", static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
  // GB for large jobs, MB below 1 GB.
  const double unit = bytes_total >= 1000000000 ? 1e9 : 1e6;
  const char* u = unit == 1e9 ? "GB" : "MB";
  const std::string c = counts.empty() ? "" : " " + counts + ",";
  char line[320];
  if (tty_) {
    if (last_ >= 0 && seconds - last_ < 0.1 && bytes_done < bytes_total) return;
    constexpr int width = 28;
    const int filled = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, ' ');
    std::snprintf(line, sizeof line, "\r%s [%s] %3.0f%%%s %.2f/%.2f %s, %.2f GB/s, ETA %s\x1b[K", label_.c_str(),
                  bar.c_str(), frac * 100, c.c_str(), bytes_done / unit, bytes_total / unit, u, rate / 1e9, eta_text);
    std::fputs(line, stderr);
    drawn_ = true;
  } else {
    const int decile = static_cast<int>(frac * 10);
    if (last_ >= 0 && seconds - last_ < 10 && decile == last_decile_ && bytes_done < bytes_total) return;
    last_decile_ = decile;
    std::snprintf(line, sizeof line, "%s: %3.0f%%%s %.2f/%.2f %s, %.2f GB/s, ETA %s\n", label_.c_str(), frac * 100,
                  c.c_str(), bytes_done / unit, bytes_total / unit, u, rate / 1e9, eta_text);
    std::fputs(line, stderr);
  }
  last_ = seconds;
  std::fflush(stderr);
}

void Progress::finish() {
  if (tty_ && drawn_) std::fputs("\n", stderr);
  drawn_ = false;
}

}  // namespace sluice::cli
