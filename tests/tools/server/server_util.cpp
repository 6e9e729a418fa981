// Server test helpers (server_util.h).
#include "tests/tools/server/server_util.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
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
  EXPECT_TRUE(http->bind(&err)) << err;
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

server::ServerOptions small_bodies(server::ServerOptions so) {
  so.max_body_bytes = 64 << 10;
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

std::string run_node_script(const std::string& script, const std::map<std::string, std::string>& env,
                            std::string* error) {
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
  cmd += "node " + copy.string() + " >" + out.string() + " 2>" + err.string();
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

}  // namespace sluice::test
