// Shared by the server tests: the fixture model with a chat template added, the server in
// process on a free port, server-sent events' data lines, node scripts run against a server,
// and the greedy text the Generator gives a prompt.
#pragma once

#include <httplib.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/batch_engine.h"
#include "models/load.h"
#include "server/http_server.h"

namespace sluice::test {

// A copy of the qwen3_moe fixture whose tokenizer_config.json has a ChatML-style chat
// template (the shape of Qwen's; the fixture ships none).
std::filesystem::path server_test_model();
// The same fixture with another chat template, in its own directory `name`.
std::filesystem::path server_test_model(const std::string& name, const std::string& chat_template);
// The template's text for those messages (system, user) with the generation prompt.
std::string chatml_prompt(const std::string& system, const std::string& user);

// The server over a model on the CPU, on its own thread and a free port of 127.0.0.1; stopped
// when it goes.
struct Served {
  std::unique_ptr<Backend> be;
  LoadedModel model;
  std::unique_ptr<BatchEngine> engine;
  std::unique_ptr<server::HttpServer> http;
  std::thread thread;
  int port = 0;

  // The engine's options as given; so's port is replaced by a free one, an empty model name
  // by "fixture".
  Served(const std::filesystem::path& model_dir, const BatchEngineOptions& eo, server::ServerOptions so = {});
  // The fixture's server of most tests: bodies up to 64 KiB, contexts of n_ctx tokens.
  explicit Served(server::ServerOptions so = {}, int parallel = 4, size_t max_queue = 64,
                  const std::filesystem::path& model_dir = server_test_model(), int64_t n_ctx = 96);
  ~Served();
  httplib::Client client() const;  // read timeout 60 s
};

// The data lines of a server-sent event stream, in order.
std::vector<std::string> sse_data(const std::string& body);

// The greedy continuation the Generator (`sluice run`) gives the ids, as text.
std::string greedy_text(const LoadedModel& m, const std::vector<int32_t>& ids, int64_t n, int64_t n_ctx);

// Runs a node script of tests/server with the npm modules of the build (copied next to them,
// since ES modules ignore NODE_PATH) and the environment given; its stdout, or "" with
// *error set when node failed or is missing.
std::string run_node_script(const std::string& script, const std::map<std::string, std::string>& env,
                            std::string* error);

}  // namespace sluice::test
