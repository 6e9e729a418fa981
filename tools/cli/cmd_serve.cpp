// sluice serve: the OpenAI-compatible HTTP server (tools/server/http_server.h) over one model
// and a BatchEngine of --parallel sequences. Ctrl-C or SIGTERM stops accepting, ends the
// requests in flight (their answers end cleanly) and exits 0.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include "cli_common.h"
#include "core/units.h"
#include "engine/batch_engine.h"
#include "server/http_server.h"

namespace sluice::cli {

namespace {

// The context of one sequence by default: the model's, at most 4096 tokens (what a server's
// clients mostly need; --ctx asks for more).
constexpr int64_t kDefaultServeContext = 4096;
// Requests that may wait for a sequence. Each holds a connection (a descriptor) and its prompt,
// no thread.
constexpr int64_t kMaxQueue = 10000;

// Raises the soft limit on open descriptors to the hard one and checks that `needed` fit.
void ensure_descriptors(uint64_t needed, int64_t max_queue) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  if (lim.rlim_cur < lim.rlim_max && lim.rlim_cur < needed) {
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, std::max<rlim_t>(needed, lim.rlim_cur));
    ::setrlimit(RLIMIT_NOFILE, &lim);
    ::getrlimit(RLIMIT_NOFILE, &lim);
  }
  SLUICE_CHECK(lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= needed, Status::invalid_argument, "--max-queue ",
               max_queue, " needs ", needed, " open files (a connection each); the limit is ", lim.rlim_cur,
               " (ulimit -n)");
}

// --prompt-cache auto: 2 GiB (a few agent conversations of 8-16k tokens at the 64-190 KB of
// KV a token of the large MoE models), at most an eighth of the memory left once the
// sequences' states are allocated, so that activations and the expert cache keep the rest.
constexpr uint64_t kDefaultPromptCache = uint64_t{2} << 30;

// The prompt cache's budget from --prompt-cache ("auto", a size, 0), checked against the
// memory left after the sequences' states (`states` bytes) where the backend can tell.
uint64_t prompt_cache_budget(const std::string& text, uint64_t states, std::optional<uint64_t> avail) {
  const uint64_t left = avail ? *avail - std::min(*avail, states) : UINT64_MAX;
  if (text == "auto") return std::min(kDefaultPromptCache, avail ? left / 8 : kDefaultPromptCache);
  const uint64_t bytes = parse_byte_size(text, "--prompt-cache");
  SLUICE_CHECK(bytes <= left, Status::out_of_memory, "--prompt-cache ", text, ": ", bytes, " bytes, but only ", left,
               " bytes are available beside the sequences' states (ask for less, or 0 for no prompt cache)");
  return bytes;
}

// The prompt cache in the start-up line: "2.00 GiB", "2.00 GiB + 8.00 GiB of host RAM", "off".
std::string prompt_cache_text(const PromptCacheCounters& c) {
  if (c.budget_bytes == 0) return "off";
  std::string text = byte_size_text(c.budget_bytes);
  if (c.host_budget_bytes > 0) text += " + " + byte_size_text(c.host_budget_bytes) + " of host RAM";
  return text;
}

}  // namespace

void register_serve(CLI::App& app) {
  struct Options {
    ModelOptions model;
    std::string host = "127.0.0.1";
    int64_t port = 8080;
    int parallel = 4;
    int64_t n_ctx = 0;
    int64_t max_queue = 64;
    std::string api_key;
    std::vector<std::string> allow_hosts, allow_origins;
    float temperature = 1.0f, top_p = 1.0f;
    int32_t top_k = 0;
    uint64_t seed = 0;
    std::string prompt_cache = "auto";
    std::string prompt_cache_host = "0";
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("serve", "an OpenAI-compatible HTTP server (completions, chat, SSE, metrics)");
  add_model_options(*cmd, opt->model);
  cmd->add_option("--host", opt->host, "address to listen on (default 127.0.0.1)");
  add_integer(*cmd, "--port", opt->port, IntRange::from(0, 65535), "TCP port (default 8080; 0: any free port)");
  add_integer(*cmd, "--parallel", opt->parallel, IntRange::from(1, 64),
              "sequences decoded together in one batched step (default 4)");
  add_integer(*cmd, "--ctx", opt->n_ctx, IntRange::at_least(0, "0: the model's, at most 4096"),
              "context of each sequence in tokens (default: the model's, at most 4096)");
  add_integer(*cmd, "--max-queue", opt->max_queue, IntRange::from(0, kMaxQueue),
              "requests that may wait for a sequence; more get 503 (default 64)");
  cmd->add_option("--api-key", opt->api_key, "require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on /v1/* and /metrics");
  cmd->add_option("--allow-host", opt->allow_hosts,
                  "without --api-key: a Host name accepted besides IP addresses and localhost (repeat or "
                  "comma-separate; '*': any)")
      ->delimiter(',');
  cmd->add_option("--allow-origin", opt->allow_origins,
                  "a web page origin (scheme://host:port) that may call the API from a browser, with CORS "
                  "(repeat or comma-separate; '*': any)")
      ->delimiter(',');
  add_real(*cmd, "--temperature", opt->temperature, RealRange::at_least(0, "0 is greedy"),
           "default sampling temperature of requests that give none (default 1, as OpenAI)");
  add_real(*cmd, "--top-p", opt->top_p, RealRange::above(0, 1), "default nucleus mass (default 1)");
  add_integer(*cmd, "--top-k", opt->top_k, IntRange::at_least(0, "0 keeps every token"), "default top-k (default 0: all)");
  add_seed(*cmd, "--seed", opt->seed, "default seed of requests that give none (default 0)");
  cmd->add_option("--prompt-cache", opt->prompt_cache,
                  "memory for prompt prefixes kept beside the sequences, so that a prompt starts after the longest "
                  "prefix held (512M, 2G; 0: off; default auto: 2G, at most an eighth of the free memory)");
  cmd->add_option("--prompt-cache-host", opt->prompt_cache_host,
                  "host RAM for prompt prefixes evicted from --prompt-cache, moved back when a prompt resumes from "
                  "one (8G; default 0: none)");
  cmd->callback([opt] {
    SLUICE_CHECK(opt->model.stats.empty(), Status::invalid_argument,
                 "--stats: sluice serve writes no statistics file (GET /metrics reports the expert cache live)");
    check_no_replay(opt->model, "serve");
    Session s = open_session(opt->model);
    Model& model = *s.model.model;
    SLUICE_CHECK(s.model.tokenizer.has_value(), Status::invalid_argument, "sluice serve needs a tokenizer.json in ",
                 s.model.dir.string());
    const int64_t limit = model.info().n_ctx_train > 0 ? model.info().n_ctx_train : kDefaultServeContext;
    const int64_t n_ctx = opt->n_ctx > 0 ? opt->n_ctx : std::min(limit, kDefaultServeContext);
    model.check_context(n_ctx, str("--ctx ", n_ctx));
    // Every sequence's state is allocated at start: check they fit before allocating them.
    const uint64_t per = model.context_bytes(n_ctx);
    const std::optional<uint64_t> avail = s.backend->memory_available();
    if (avail)
      SLUICE_CHECK(per <= *avail / static_cast<uint64_t>(opt->parallel), Status::out_of_memory, "--parallel ",
                   opt->parallel, " sequences of --ctx ", n_ctx, " need ", opt->parallel, " x ", per,
                   " bytes of context state; ", *avail, " bytes are available (ask for fewer or shorter sequences)");

    BatchEngineOptions eo;
    eo.n_parallel = opt->parallel;
    eo.n_ctx = n_ctx;
    eo.ubatch = opt->model.ubatch;
    eo.max_queue = static_cast<size_t>(opt->max_queue);
    eo.n_vocab_sampled = s.model.tokenizer->vocab_size();
    eo.prompt_cache_bytes = prompt_cache_budget(opt->prompt_cache, per * static_cast<uint64_t>(opt->parallel), avail);
    eo.prompt_cache_host_bytes = parse_byte_size(opt->prompt_cache_host, "--prompt-cache-host");
    BatchEngine engine(model, eo);

    server::ServerOptions so;
    so.host = opt->host;
    so.port = static_cast<int>(opt->port);
    so.api_key = opt->api_key;
    so.model_name = s.model.dir.filename().string();
    if (so.model_name.empty()) so.model_name = s.model.dir.parent_path().filename().string();
    so.allow_hosts = opt->allow_hosts;
    so.allow_origins = opt->allow_origins;
    so.default_sampling = {opt->temperature, opt->top_p, opt->top_k, opt->seed};
    so.max_connections = static_cast<size_t>(opt->parallel + opt->max_queue) + 256;
    ensure_descriptors(so.max_connections + 64, opt->max_queue);
    server::HttpServer http(s.model, engine, so);
    // The streamer's statistics for /metrics and the page, read on the engine thread.
    if (StreamingProvider* st = s.model.streamer.get()) {
      auto last = std::make_shared<std::chrono::steady_clock::time_point>();
      engine.set_step_observer([st, last, &http] {
        const auto now = std::chrono::steady_clock::now();
        if (now - *last < std::chrono::milliseconds(200)) return;
        *last = now;
        http.update_cache_stats(st->stats());
      });
    }
    std::string error;
    SLUICE_CHECK(http.bind(&error), Status::invalid_argument, error);
    InterruptFlag interrupt;
    std::fprintf(stderr,
                 "sluice serve: listening on http://%s:%d (%s, %d parallel sequences of %lld tokens, prompt cache %s)\n",
                 so.host.c_str(), http.port(), so.model_name.c_str(), opt->parallel, static_cast<long long>(n_ctx),
                 prompt_cache_text(engine.counters().prompt_cache).c_str());
    std::fflush(stderr);
    std::atomic<bool> listening{true};
    std::thread watcher([&] {
      while (listening && !interrupt.flag()->load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      http.stop();
    });
    http.run();
    listening = false;
    watcher.join();
    SLUICE_CHECK(interrupt.flag()->load(), Status::io, "the server stopped listening on ", so.host, ":", http.port());
    const BatchEngineCounters c = engine.counters();
    std::fprintf(stderr, "sluice serve: stopped after %llu requests (%llu tokens generated)\n",
                 static_cast<unsigned long long>(c.requests_done), static_cast<unsigned long long>(c.generated_tokens));
  });
}

}  // namespace sluice::cli
