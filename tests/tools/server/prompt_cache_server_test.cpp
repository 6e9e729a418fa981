// The prompt cache through `sluice serve`'s HTTP server (in process, on a free port, a real
// HTTP client): a ten-turn chat on the demo model (models/demo with a ChatML template), each
// turn resending the history, answered alike with and without the cache, streamed and not;
// usage.prompt_tokens_details.cached_tokens on /v1/chat/completions and /v1/completions (also
// in the streamed usage chunk) and their sum in /metrics; a bad --prompt-cache or
// --prompt-cache-host is a one-line error of the command line.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "tests/tools/cli/cli_child.h"
#include "tests/tools/server/server_util.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;
using nlohmann::json;

namespace {

// The demo model with a ChatML template (it ships none).
fs::path demo_chat_model() {
  const fs::path dir = pack_test_dir("demo-chat-model");
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
    fs::copy_file(source_dir() / "models" / "demo" / f, dir / f, fs::copy_options::overwrite_existing);
  json cfg = json::parse(std::ifstream(source_dir() / "models" / "demo" / "tokenizer_config.json"));
  cfg["chat_template"] =
      "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
      "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  return dir;
}

// The server over the demo model with a prompt cache of `cache_bytes` (0: none).
std::unique_ptr<Served> serve_demo(uint64_t cache_bytes) {
  BatchEngineOptions eo;
  eo.n_parallel = 2;
  eo.n_ctx = 768;
  eo.ubatch = 64;
  eo.prompt_cache_bytes = cache_bytes;
  server::ServerOptions so;
  so.model_name = "demo";
  return std::make_unique<Served>(demo_chat_model(), eo, so);
}

// One answer's text and usage, from a JSON body or an event stream (text from the deltas,
// usage from the last chunk before [DONE]).
struct Answer {
  std::string text;
  json usage;
};

Answer post(httplib::Client& c, const std::string& route, json body, bool stream) {
  const bool chat = route == "/v1/chat/completions";
  if (stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  auto r = c.Post(route, body.dump(), "application/json");
  Answer a;
  if (!r || r->status != 200) {
    ADD_FAILURE() << route << ": " << (r ? r->body : "no answer");
    return a;
  }
  if (!stream) {
    const json j = json::parse(r->body);
    a.text = chat ? j["choices"][0]["message"]["content"].get<std::string>() : j["choices"][0]["text"].get<std::string>();
    a.usage = j["usage"];
    return a;
  }
  const auto events = sse_data(r->body);
  EXPECT_EQ(events.back(), "[DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    if (e["choices"].empty()) {
      a.usage = e["usage"];
      continue;
    }
    const json& ch = e["choices"][0];
    if (chat && ch["delta"].contains("content")) a.text += ch["delta"]["content"].get<std::string>();
    if (!chat) a.text += ch["text"].get<std::string>();
  }
  return a;
}

int64_t cached_of(const Answer& a) { return a.usage["prompt_tokens_details"]["cached_tokens"].get<int64_t>(); }

// Ten turns of a chat, each resending the whole history; odd turns streamed.
std::vector<Answer> ten_turns(Served& s) {
  auto c = s.client();
  json messages = json::array({{{"role", "system"}, {"content", "You tell short stories about the sea."}}});
  std::vector<Answer> out;
  for (int turn = 1; turn <= 10; ++turn) {
    messages.push_back({{"role", "user"}, {"content", "Go on with part " + std::to_string(turn) + " of the story."}});
    out.push_back(post(c, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}},
                       turn % 2 == 1));
    messages.push_back({{"role", "assistant"}, {"content", out.back().text}});
  }
  return out;
}

// The value of a sample in Prometheus text, or -1.
double metric(const std::string& text, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("\n" + name + " ([0-9.e+]+)\n"))) return -1;
  return std::stod(m[1]);
}

}  // namespace

TEST(ServerPromptCache, TenTurnChatAnsweredAlike) {
  std::vector<Answer> plain, cached;
  plain = ten_turns(*serve_demo(0));
  auto served = serve_demo(64 << 20);
  Served& s = *served;
  cached = ten_turns(s);
  int64_t sum = 0;
  for (size_t t = 0; t < plain.size(); ++t) {
    SCOPED_TRACE(str("turn ", t + 1));
    EXPECT_EQ(cached[t].text, plain[t].text);
    EXPECT_FALSE(plain[t].text.empty());
    EXPECT_EQ(cached_of(plain[t]), 0);
    EXPECT_EQ(cached[t].usage["prompt_tokens"], plain[t].usage["prompt_tokens"]);
    const int64_t n = cached_of(cached[t]);
    if (t == 0) {
      EXPECT_EQ(n, 0);
    } else {
      // At least the previous turn's prompt: the history is a prefix of the new prompt up to
      // the reply's text at least.
      EXPECT_GE(n, plain[t - 1].usage["prompt_tokens"].get<int64_t>());
      EXPECT_LT(n, cached[t].usage["prompt_tokens"].get<int64_t>());
    }
    sum += n;
  }
  auto c = s.client();
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(metric(m->body, "sluice_prompt_tokens_cached_total"), static_cast<double>(sum));
  EXPECT_EQ(metric(m->body, "sluice_prompt_cache_requests_total\\{result=\"hit\"\\}"), 9);
  EXPECT_EQ(metric(m->body, "sluice_prompt_cache_bytes\\{state=\"budget\"\\}"), static_cast<double>(64 << 20));
}

TEST(ServerPromptCache, CompletionsReportCachedTokens) {
  auto served = serve_demo(64 << 20);
  auto c = served->client();
  const std::string first = "The old man walked slowly down to the harbour, where the boats";
  const Answer a = post(c, "/v1/completions", {{"prompt", first}, {"max_tokens", 8}, {"temperature", 0}}, false);
  EXPECT_EQ(cached_of(a), 0);
  // The same text and more, streamed: its usage chunk counts the tokens resumed.
  const std::string second = first + a.text + " and the sea";
  const Answer b = post(c, "/v1/completions", {{"prompt", second}, {"max_tokens", 8}, {"temperature", 0}}, true);
  const int64_t n = cached_of(b);
  EXPECT_GE(n, a.usage["prompt_tokens"].get<int64_t>() - 1);  // the first prompt (its last token may merge)
  EXPECT_LT(n, b.usage["prompt_tokens"].get<int64_t>());
  // The same prompt again: all but its last token.
  const Answer again = post(c, "/v1/completions", {{"prompt", second}, {"max_tokens", 8}, {"temperature", 0}}, false);
  EXPECT_EQ(again.text, b.text);
  EXPECT_EQ(cached_of(again), again.usage["prompt_tokens"].get<int64_t>() - 1);
}

TEST(ServerPromptCache, BadSizeIsAOneLineError) {
  for (const std::string option : {"--prompt-cache", "--prompt-cache-host"}) {
    const ChildResult r = run_sluice_child({"serve", "--model", demo_chat_model().string(), "--port", "0", option, "lots"});
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("sluice: error: " + option + ": 'lots' is not a size"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}
