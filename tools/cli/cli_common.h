// Pieces shared by the subcommands: token-list parsing, model loading with the common
// options, and the error wrapper that turns any failure into one line on stderr.
#pragma once

#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "cli_args.h"
#include "core/paths.h"
#include "experts/stats.h"
#include "experts/streamer.h"
#include "models/load.h"

namespace sluice::cli {

struct ModelOptions {
  std::string model;             // --model DIR (HF checkpoint or pack)
  int threads = 0;                // --threads N (0: all cores)
  std::string backend = "auto";   // --backend cpu|cuda|cuda:N|auto
  std::string kv_cache = "auto";  // --kv-cache auto|f32|bf16: the attention caches' dtype
  std::string expert_kind;        // --expert-kind KIND (packs only; empty: the pack's default)
  int64_t ubatch = 512;           // --ubatch N: prompt tokens per forward pass (prefill chunks)

  // Expert streaming (packs only): on when --expert-cache or --expert-slots is given.
  std::string expert_cache;       // --expert-cache SIZE
  int32_t expert_slots = 0;       // --expert-slots N
  std::string policy;             // --policy NAME (default markov)
  std::string io;                 // --io direct|buffered (default direct)
  int io_depth = 0;               // --io-depth N (default 8)
  std::string host_cache;         // --host-cache SIZE
  std::string lookahead;          // --lookahead on|off (default off)
  double cut = 0;                 // --cut W (0: off)
  std::string miss_kind;          // --miss-kind KIND
  std::string stats;              // --stats FILE
  bool verify_reads = false;      // --verify-reads
  std::string wait;               // --wait spin|block (CUDA streaming; default spin)
  double wait_timeout = 0;        // --wait-timeout SECONDS (CUDA streaming; default 30)
  bool fake_experts = false;      // --fake-experts (developer: skip expert reads)
  bool host_cache_preload = false;  // --host-cache-preload (benchmarks, CUDA)
  std::string ple_cache;          // --ple-cache: the row cache of each PLE n-gram table of a pack
  std::string profile;            // --profile exact|fast (default exact; fast: profile_fast_* below)
  bool deadline_worst_case = false;  // --deadline-worst-case (measurement: every miss is late)
  CLI::Option* cut_option = nullptr;  // given explicitly: overrides what --profile fast sets
  // Benchmarks (run and bench only): every MoE layer's routing from a recorded trace.
  std::string replay_routing;     // --replay-routing TRACE
  std::string replay_map;         // --replay-map auto|ids|fit (default auto)
};

// --profile fast: a late miss whose weight is below 0.4 x its token's uniform share (the row's
// top-k weight over k) is cut (StreamerOptions::cut_share), chosen by measurement on the two
// trained models (docs/profile.md): top-2 (the demo) at 0.2 measures 0.0035 nats/token mean
// KL (0.0067 with every miss late), top-8 (the routing model) at 0.05 measures 0.0007 with
// every miss late, where the top-2 model's absolute 0.2 measured 0.386: an absolute cut does
// not carry across top-k. --miss-kind q2 and --lookahead on made decode from disk slower on
// the CPU (their extra reads compete with the demand misses), so the profile leaves them off;
// given explicitly they combine with it.
inline constexpr double kProfileFastCutShare = 0.4;

void add_model_options(CLI::App& cmd, ModelOptions& opt);

// "3,17,42" -> {3, 17, 42}; anything else is an invalid-argument error.
std::vector<int32_t> parse_token_list(const std::string& text);
// --dense of convert and synth: bf16, f32, int8 or q4; anything else is a one-line
// Error(invalid_argument) naming the choices.
DType parse_dense_option(const std::string& text);

// --prompt TEXT and --tokens IDS, one or the other (run, logits).
struct PromptOptions {
  std::string prompt, tokens;
  CLI::Option* prompt_option = nullptr;
  CLI::Option* tokens_option = nullptr;
};
void add_prompt_options(CLI::App& cmd, PromptOptions& opt);

// Before loading the model: one of the two was given (`command` starts the message).
void require_prompt(const PromptOptions& opt, std::string_view command);

// The prompt as token ids: --tokens, else --prompt encoded by the model's tokenizer. An empty
// --prompt is the model's bos token alone (generation from nothing), or an error without one.
std::vector<int32_t> prompt_tokens(const LoadedModel& m, const PromptOptions& opt);

// Sets up the thread pool and loads the model on the chosen backend (streaming its experts
// when the options ask for it; with --replay-routing, the replay set on the model and its
// description printed on stderr).
struct Session {
  std::unique_ptr<Backend> backend;
  LoadedModel model;
};
Session open_session(const ModelOptions& opt);

// logits, perplexity and serve: --replay-routing is refused (one line naming `command`):
// what they compute is the model's own routing.
void check_no_replay(const ModelOptions& opt, std::string_view command);

// The streaming options of the command line (nullopt when streaming is off); a streaming
// option without --expert-cache / --expert-slots is an error.
std::optional<StreamerOptions> streamer_options(const ModelOptions& opt);

// After a streamed run: lands the reads still in flight, fills in the run's tokens and
// seconds, writes --stats FILE, and returns the figures (nullopt without streaming).
struct RunTokens {
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  KlCheckStats kl_check;  // --kl-check (off unless asked for)
};
std::optional<RunStats> finish_streaming(const ModelOptions& opt, Session& s, const RunTokens& tokens);

// --kl-check N before the run: off for N = 0; 0 by construction (by_construction) when no
// lossy option is on (no streaming, or streaming without --cut / --miss-kind); otherwise on.
// Refuses (one line) what it cannot check: --fake-experts, a backend other than the CPU.
// Before loading: what --kl-check refuses whatever the model (--fake-experts).
void check_kl_check_options(const ModelOptions& opt, int64_t n_steps);
KlCheckStats plan_kl_check(const ModelOptions& opt, const Session& s, int64_t n_steps);
// The exact reference of --kl-check: a second streamer over the same pack with the run's cache
// size, IO and policy, and no --cut, --miss-kind, lookahead or host tier.
std::shared_ptr<StreamingProvider> make_exact_streamer(const Session& s);
// "mean 0.0012 max 0.0450 nats/token KL(exact || lossy) over 8 of 63 decode steps (...)"
std::string kl_check_summary(const KlCheckStats& kl);

// While alive, SIGINT and SIGTERM set flag() instead of ending the process (the long writers,
// convert and synth, poll it and leave nothing behind; run and perplexity stop at a token
// boundary and report what they did); the previous handlers come back after.
class InterruptFlag {
 public:
  InterruptFlag();
  ~InterruptFlag();
  InterruptFlag(const InterruptFlag&) = delete;
  InterruptFlag& operator=(const InterruptFlag&) = delete;
  const std::atomic<bool>* flag() const;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// Progress on stderr: a bar redrawn in place on a terminal (at most 10 times a second),
// plain lines otherwise (at most one every 10 s or 10% of the work).
class Progress {
 public:
  explicit Progress(std::string label);
  // counts: "12/96 records" style text (may be empty); bytes in GB with the rate and ETA.
  void update(const std::string& counts, uint64_t bytes_done, uint64_t bytes_total, double seconds);
  void finish();  // ends the bar's line

 private:
  std::string label_;
  bool tty_;
  double last_ = -1;
  int last_decile_ = -1;
  bool drawn_ = false;
};

}  // namespace sluice::cli
