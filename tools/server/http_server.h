// HttpServer: `sluice serve`'s HTTP front end on cpp-httplib: the OpenAI-compatible routes
// over a BatchEngine, the metrics and the chat page.
//
//   GET  /                     the chat page (chat_page.h)
//   GET  /health               {"status": "ok"}; 503 while shutting down
//   GET  /v1/models            the one model
//   POST /v1/completions       OpenAI completions (stream: server-sent events)
//   POST /v1/chat/completions  OpenAI chat completions, the prompt made by the model's chat
//                              template (format/chat_template.h)
//   GET  /metrics              Prometheus text: requests, tokens, queue, sequences, the
//                              prompt cache, the expert cache and its reads (metrics.h)
//   GET  /v1/cache             the page's live panel: per-layer hit rates and rates (JSON)
//
// Every error is OpenAI's error object with its status (400 malformed or invalid bodies, 401
// a wrong API key, 404, 405, 413 a body over the limit, 503 a full queue or a shutdown). A
// streaming client that goes away frees its sequence at the engine's next step (a failed
// write, or a keep-alive comment every 250 ms while the request waits).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "engine/batch_engine.h"
#include "experts/stats.h"
#include "format/chat_template.h"
#include "models/load.h"
#include "openai_api.h"

namespace httplib {
class Server;
}

namespace sluice::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;               // empty: no key required
  std::string model_name;            // what /v1/models and responses call the model
  size_t max_body_bytes = 8 << 20;   // larger bodies: 413
  int http_threads = 0;              // 0: enough for every sequence and queued request
  SamplingParams default_sampling;   // the command line's --temperature etc. (requests override)
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
  // Serves until stop(); returns when the listener closed.
  void run();
  // Stops accepting, lets the responses in progress end (the engine ends their requests),
  // and makes run() return; returns once it has (also when the stop came before run()'s
  // listen loop began). From any thread but a request handler's.
  void stop();

  // The streamer's statistics, refreshed on the engine thread (BatchEngine's observer).
  void update_cache_stats(const RunStats& stats);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace sluice::server
