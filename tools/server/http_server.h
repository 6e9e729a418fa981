// HttpServer: `sluice serve`'s HTTP front end: the OpenAI-compatible routes over a
// BatchEngine, the metrics and the chat page, on HttpTransport (http_transport.h: one thread
// for every connection, bounded in bytes, time and count).
//
//   GET  /                     the chat page (chat_page.h)
//   GET  /health               {"status": "ok"}; 503 while shutting down
//   GET  /v1/models            the one model
//   POST /v1/completions       OpenAI completions (stream: server-sent events)
//   POST /v1/chat/completions  OpenAI chat completions, the prompt made by the model's chat
//                              template (format/chat_template.h); structured output
//                              (structured_output.h), tool calls and reasoning per family
//                              (reply_formats.h)
//   POST /v1/messages[/count_tokens]  Anthropic's Messages API (anthropic_api.h)
//   GET  /metrics              Prometheus text: requests, tokens, queue, sequences, the
//                              prompt cache, the expert cache and its reads (metrics.h)
//   GET  /v1/cache             the page's live panel: per-layer hit rates and rates (JSON)
//
// Every error is OpenAI's error object with its status (400 malformed or invalid bodies, 401
// a wrong API key, 403 a Host or Origin that is not allowed, 404, 405 a route's wrong method,
// 408 a request too slow to arrive, 411, 413 a body over the limit, 415 a body that is not
// application/json or is compressed, 431 headers over the limit, 503 a full queue or a
// shutdown); Anthropic's shape on the /v1/messages routes, the transport's own answers
// included once their request line is read. Requests that arrive are parsed, checked and
// tokenized on a few worker threads; the engine's callbacks write the answers
// (completion_answer.h), so a queued or streaming request holds no thread. A client that goes
// away ends its request at the engine's next step.
//
// Without an API key, a browser page elsewhere must not reach the server (cross-site requests,
// DNS rebinding): the Host header must name this machine (an IP address, localhost, or a name
// in allow_hosts), an Origin header must be the server's own (or in allow_origins), and POST
// bodies must be application/json (a cross-site form or text/plain post cannot be). An API
// key replaces these checks.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/batch_engine.h"
#include "experts/stats.h"
#include "format/chat_template.h"
#include "models/load.h"
#include "openai_api.h"

namespace sluice::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;               // empty: no key required
  std::string model_name;            // what /v1/models and responses call the model
  size_t max_body_bytes = 8 << 20;   // larger bodies (after chunked decoding): 413
  int workers = 2;                   // threads that parse, check and tokenize requests
  size_t max_connections = 0;        // 0: the engine's sequences and queue and 256 more
  std::vector<std::string> allow_hosts;    // Host names accepted besides IPs and localhost; "*": any
  std::vector<std::string> allow_origins;  // Origins accepted besides the server's own; "*": any
  SamplingParams default_sampling;   // the command line's --temperature etc. (requests override)
  // Timeouts of the connections (http_transport.h); tests shorten them.
  std::chrono::milliseconds idle_timeout{5000}, head_timeout{10000}, body_timeout{30000}, write_timeout{30000};
};

class HttpServer {
 public:
  // The model (its tokenizer and template) and the engine must outlive the server.
  HttpServer(LoadedModel& model, BatchEngine& engine, const ServerOptions& options);
  ~HttpServer();

  // Binds host:port; false with a message in *error when the port is taken or the host bad.
  // Port 0 picks a free port (port() says which).
  bool bind(std::string* error);
  int port() const { return port_; }
  // Serves until stop(); returns when every connection closed.
  void run();
  // Stops accepting, ends every request (the engine ends them: each stream gets its final
  // chunk and [DONE]), writes what is still unsent (at most 10 s) and makes run() return;
  // returns once it has (also when the stop came before run()). From any thread but the
  // engine's.
  void stop();
  // Connections open now.
  size_t connections() const;

  // The streamer's statistics, refreshed on the engine thread (BatchEngine's observer).
  void update_cache_stats(const RunStats& stats);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace sluice::server
