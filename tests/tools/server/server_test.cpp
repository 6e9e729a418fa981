// `sluice serve`'s HTTP server, in process on 127.0.0.1 (a free port) over the fixture
// qwen3_moe with a chat template added: the routes, completions and chat with and without
// server-sent events (greedy text equal to the Generator's for the same prompt), stop strings,
// usage, every malformed input answered with its 4xx and OpenAI's error object, the API key;
// on the demo model (models/demo, trained), 64 concurrent streaming clients beside 1,000
// requests whose clients vanish at random points (their sequences come back, the others are
// answered correctly: the engine's own counters).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "engine/batch_engine.h"
#include "format/chat_template.h"
#include "models/load.h"
#include "server/http_server.h"
#include "tests/tools/server/server_util.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;
using nlohmann::json;

namespace {

std::string greedy_for(const LoadedModel& m, const std::string& prompt, int64_t n) {
  return greedy_text(m, m.tokenizer->encode(prompt, m.tokenizer->add_bos()), n, 96);
}

void expect_error(const httplib::Result& r, int status, const std::string& part) {
  ASSERT_TRUE(r) << "no answer";
  EXPECT_EQ(r->status, status) << r->body;
  json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_NE(j["error"]["message"].get<std::string>().find(part), std::string::npos) << r->body;
}

}  // namespace

TEST(Server, RoutesAndErrors) {
  Served s;
  auto c = s.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(json::parse(m->body)["data"][0]["id"], "fixture");
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_NE(page->body.find("<title>sluice</title>"), std::string::npos);
  expect_error(c.Get("/nowhere"), 404, "no such route");
  expect_error(c.Post("/v1/completions", "{not json", "application/json"), 400, "not valid JSON");
  expect_error(c.Post("/v1/completions", "[1, 2]", "application/json"), 400, "JSON object");
  expect_error(c.Post("/v1/completions", R"({"max_tokens": 4})", "application/json"), 400, "'prompt' is required");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": "4"})", "application/json"), 400,
               "'max_tokens' must be an integer");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": -1})", "application/json"), 400, "max_tokens");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "temperature": 9})", "application/json"), 400, "temperature");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "n": 2})", "application/json"), 400, "'n' above 1");
  expect_error(c.Post("/v1/completions", R"({"prompt": ["a", "b"]})", "application/json"), 400, "several prompts");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "stop": [1]})", "application/json"), 400, "'stop'");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "stream_options": {"include_usage": true}})", "application/json"),
               400, "'stream'");
  expect_error(c.Post("/v1/completions", "{\"prompt\": \"\xff\xfe\"}", "application/json"), 400, "not valid JSON");
  expect_error(c.Post("/v1/chat/completions", R"({"messages": []})", "application/json"), 400, "messages");
  expect_error(c.Post("/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})", "application/json"),
               400, "role");
  expect_error(c.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "tools": 5})",
                      "application/json"),
               400, "'tools' must be a list");
  // A prompt longer than the context (96 tokens).
  std::string longp(2000, 'a');
  for (size_t i = 1; i < longp.size(); i += 2) longp[i] = ' ';
  expect_error(c.Post("/v1/completions", json{{"prompt", longp}}.dump(), "application/json"), 400, "context");
  expect_error(c.Post("/v1/completions", json{{"prompt", "a b"}, {"max_tokens", 500}}.dump(), "application/json"), 400,
               "exceed the context");
  // A body over the limit (64 KiB here).
  expect_error(c.Post("/v1/completions", json{{"prompt", std::string(100000, 'x')}}.dump(), "application/json"), 413,
               "larger than");
  EXPECT_EQ(s.engine->counters().live_sequences, 0);
}

// response_format applies to /v1/completions as to chat: the reply is the schema's JSON.
TEST(Server, CompletionsTakeAResponseFormat) {
  Served s;
  auto c = s.client();
  const json schema = json::parse(R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
                                      "required": ["ok", "n"], "additionalProperties": false})");
  for (const json& format : {json{{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}},
                             json{{"type", "json_object"}}}) {
    SCOPED_TRACE(format.dump());
    auto r = c.Post("/v1/completions",
                    json{{"prompt", "The answer is"}, {"max_tokens", 48}, {"temperature", 0}, {"response_format", format}}.dump(),
                    "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json reply = json::parse(r->body);
    const std::string text = reply["choices"][0]["text"];
    const json value = json::parse(text, nullptr, false);
    if (reply["choices"][0]["finish_reason"] == "stop") {
      ASSERT_TRUE(value.is_object()) << text;
      if (format["type"] == "json_schema") {
        EXPECT_TRUE(value["ok"].is_boolean()) << text;
        EXPECT_TRUE(value["n"] == 1 || value["n"] == 2 || value["n"] == 3) << text;
        EXPECT_EQ(value.size(), 2u) << text;
      }
    } else {
      EXPECT_EQ(reply["choices"][0]["finish_reason"], "length");
      EXPECT_EQ(text.rfind('{', 0), 0u) << "not the start of a JSON object: " << text;
    }
  }
}

TEST(Server, ApiKey) {
  server::ServerOptions so;
  so.api_key = "sekrit";
  Served s(so);
  auto c = s.client();
  expect_error(c.Get("/v1/models"), 401, "API key");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a"})", "application/json"), 401, "API key");
  EXPECT_EQ(c.Get("/health")->status, 200);  // open without a key
  httplib::Headers bad{{"Authorization", "Bearer wrong"}};
  expect_error(c.Get("/metrics", bad), 401, "API key");
  httplib::Headers good{{"Authorization", "Bearer sekrit"}};
  auto r = c.Get("/v1/models", good);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(Server, CompletionsEqualTheGenerator) {
  Served s;
  auto c = s.client();
  const std::string prompt = "The old man walked";
  const std::string want = greedy_for(s.model, prompt, 12);
  // One answer.
  auto r = c.Post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], want);
  const std::string reason = j["choices"][0]["finish_reason"];
  EXPECT_TRUE(reason == "length" || reason == "stop");
  EXPECT_EQ(j["usage"]["total_tokens"].get<int>(), j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());
  // The same as server-sent events, with the usage chunk.
  auto st = c.Post("/v1/completions",
                   json{{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true},
                        {"stream_options", {{"include_usage", true}}}}
                       .dump(),
                   "application/json");
  ASSERT_TRUE(st);
  ASSERT_EQ(st->status, 200);
  EXPECT_NE(st->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  const auto events = sse_data(st->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json e = json::parse(events[i]);
    if (e["choices"].empty()) {
      EXPECT_EQ(i + 2, events.size()) << "the usage chunk comes last";
      EXPECT_EQ(e["usage"]["completion_tokens"], j["usage"]["completion_tokens"]);
      continue;
    }
    text += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, want);
  // Token ids as the prompt give the same text.
  json ids = json::array();
  for (int32_t t : s.model.tokenizer->encode(prompt, s.model.tokenizer->add_bos())) ids.push_back(t);
  auto r2 = c.Post("/v1/completions", json{{"prompt", ids}, {"max_tokens", 12}, {"temperature", 0}}.dump(), "application/json");
  ASSERT_TRUE(r2);
  EXPECT_EQ(json::parse(r2->body)["choices"][0]["text"], want);
}

TEST(Server, StopStringsCutTheText) {
  Served s;
  auto c = s.client();
  const std::string prompt = "The old man walked";
  const std::string full = greedy_for(s.model, prompt, 20);
  ASSERT_GE(full.size(), 8u);
  const std::string stop = full.substr(full.size() / 2, 3);
  const std::string want = full.substr(0, full.find(stop));
  for (bool stream : {false, true}) {
    auto r = c.Post("/v1/completions",
                    json{{"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0}, {"stop", {stop}}, {"stream", stream}}.dump(),
                    "application/json");
    ASSERT_TRUE(r);
    std::string text;
    if (!stream) {
      json j = json::parse(r->body);
      text = j["choices"][0]["text"];
      EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    } else {
      for (const std::string& e : sse_data(r->body))
        if (e != "[DONE]") text += json::parse(e)["choices"][0]["text"].get<std::string>();
    }
    EXPECT_EQ(text, want) << "stop " << json(stop).dump() << (stream ? " (stream)" : "");
  }
}

TEST(Server, ChatThroughTheTemplate) {
  Served s;
  auto c = s.client();
  const json msgs = json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hello"}}});
  const std::string prompt = chatml_prompt("Be brief.", "Hello");
  // The template's text, tokenized without an extra bos, gives the Generator's greedy text.
  const std::string want = greedy_text(s.model, s.model.tokenizer->encode(prompt, false), 10, 96);
  auto r = c.Post("/v1/chat/completions", json{{"messages", msgs}, {"max_tokens", 10}, {"temperature", 0}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], want);
  auto st = c.Post("/v1/chat/completions",
                   json{{"messages", msgs}, {"max_tokens", 10}, {"temperature", 0}, {"stream", true}}.dump(),
                   "application/json");
  ASSERT_TRUE(st);
  const auto events = sse_data(st->body);
  ASSERT_GE(events.size(), 2u);
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json d = json::parse(events[i])["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
  }
  EXPECT_EQ(text, want);
}

TEST(Server, ConcurrentStreamsAndVanishingClients) {
  constexpr int kStreamingClients = 64;
  Served s({}, 8, 128, source_dir() / "models" / "demo");
  const std::string prompt = "The old man walked";
  const std::string want = greedy_for(s.model, prompt, 16);
  // 64 streaming clients at once (8 sequences, the rest queued): every one gets the text.
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreamingClients; ++i)
    clients.emplace_back([&] {
      const auto t0 = std::chrono::steady_clock::now();
      auto c = s.client();
      auto r = c.Post("/v1/completions",
                      json{{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}, {"stream", true}}.dump(),
                      "application/json");
      if (!r || r->status != 200) {
        ADD_FAILURE() << "status " << (r ? r->status : -1) << (r ? r->body : httplib::to_string(r.error())) << " after "
                      << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return;
      }
      std::string text;
      try {  // an error event or a cut body fails this client, not the whole binary (std::terminate)
        for (const std::string& e : sse_data(r->body))
          if (e != "[DONE]") text += json::parse(e)["choices"][0]["text"].get<std::string>();
      } catch (const std::exception& x) {
        ADD_FAILURE() << "a stream that is not the completion's events: " << x.what() << "\n" << r->body;
        return;
      }
      if (text == want) ++ok;
      else ADD_FAILURE() << "got " << json(text).dump() << " want " << json(want).dump();
    });
  // Meanwhile 1,000 requests from 20 threads whose clients close the socket after a random
  // number of bytes (a third before any answer; the others mid-stream).
  std::vector<std::thread> vanishing;
  for (int th = 0; th < 20; ++th) {
    vanishing.emplace_back([&, th] {
      std::mt19937 rng(static_cast<uint32_t>(th + 1));
      for (int i = 0; i < 50; ++i) {
        const int after = static_cast<int>(rng() % 3 == 0 ? 0 : rng() % 1500);
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(s.port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
          ::close(fd);
          continue;
        }
        const std::string body =
            json{{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0.8}, {"seed", i}, {"stream", true}}.dump();
        const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
                                "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
        (void)!::write(fd, req.data(), req.size());
        char buf[64];
        int got = 0;
        while (got < after) {
          const ssize_t n = ::read(fd, buf, sizeof buf);
          if (n <= 0) break;
          got += static_cast<int>(n);
        }
        ::close(fd);
      }
    });
  }
  for (auto& t : clients) t.join();
  for (auto& t : vanishing) t.join();
  EXPECT_EQ(ok.load(), kStreamingClients);
  // Every vanished client's sequence comes back (the transport notices the close at once).
  BatchEngineCounters c;
  const auto settle_by = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  for (;;) {
    c = s.engine->counters();
    if (c.live_sequences == 0 && c.queued == 0 && c.requests_done == c.requests_submitted) break;
    if (std::chrono::steady_clock::now() > settle_by) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(c.live_sequences, 0);
  EXPECT_EQ(c.slots_in_use, 0);
  EXPECT_EQ(c.queued, 0);
  EXPECT_EQ(c.requests_done, c.requests_submitted);
  EXPECT_GT(c.requests_cancelled, 0u) << "no disconnect was noticed mid-stream";
  std::printf("vanishing clients: %llu requests submitted, %llu cancelled by disconnects, %llu done\n",
              static_cast<unsigned long long>(c.requests_submitted), static_cast<unsigned long long>(c.requests_cancelled),
              static_cast<unsigned long long>(c.requests_done));
  // The server still answers.
  auto r = s.client().Post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}}.dump(),
                           "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], want);
  // The metrics say so too.
  auto m = s.client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("sluice_active_sequences 0"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("# TYPE sluice_generated_tokens_total counter"), std::string::npos);
}

namespace {

// A Hermes-style template (the shape of Qwen's): tools in the system turn, calls as
// <tool_call> blocks, tool results as user turns.
constexpr const char* kToolTemplate =
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}"
    "{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- endif %}{%- for message in messages %}"
    "{%- if message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message.tool_calls %}{{- '<|im_start|>assistant\\n' + message.content }}{%- for tc in message.tool_calls %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' + tc.function.arguments + "
    "'}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

// Small: the fixture holds 256 positions of a byte-level tokenizer.
const char* const kWeatherTools = R"([{"type": "function", "function": {"name": "weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";

}  // namespace

// Chat with tools: the tools and the tool turns reach the template (the reply is the greedy
// continuation of exactly that rendering, in the client's key order), streamed or not;
// tool_choice "required" makes a call (grammar); malformed tools and calls on a user turn are
// 400s; a template that does not show tools refuses them (and tool_choice "none" ignores them).
TEST(Server, ChatWithTools) {
  server::ServerOptions so;
  const std::filesystem::path dir = server_test_model("server-tools-model", kToolTemplate);
  Served s(so, 4, 64, dir, 256);
  auto c = s.client();
  const auto tools = nlohmann::ordered_json::parse(kWeatherTools);
  const auto conversations = std::vector<nlohmann::ordered_json>{
      nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Paris?"}])"),
      nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"}])"),
  };
  const ChatTemplate tmpl = load_chat_template(dir)->tmpl;
  for (const auto& msgs : conversations) {
    ChatRenderOptions ro;
    ro.extra_ordered["tools"] = tools;
    const std::vector<int32_t> ids = s.model.tokenizer->encode(tmpl.render_json(msgs, ro), false);
    const std::string want = greedy_text(s.model, ids, 8, 256);
    nlohmann::ordered_json body = {{"messages", msgs}, {"tools", tools}, {"max_tokens", 8}, {"temperature", 0}};
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());
    EXPECT_EQ(j["choices"][0]["message"]["content"], want);
    body["stream"] = true;
    auto st = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(st);
    std::string text;
    for (const std::string& e : sse_data(st->body)) {
      if (e == "[DONE]") continue;
      const json d = json::parse(e)["choices"][0]["delta"];
      if (d.contains("content")) text += d["content"].get<std::string>();
    }
    EXPECT_EQ(text, want);
  }
  const json user = json::array({{{"role", "user"}, {"content", "Hi"}}});
  // tool_choice "required": the grammar makes even this random model call the tool (its
  // argument bounded, so that the call fits the fixture's context).
  const json bounded = json::parse(R"([{"type": "function", "function": {"name": "weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}])");
  for (const bool stream : {false, true}) {
    auto r = c.Post("/v1/chat/completions",
                    json{{"messages", user}, {"tools", bounded}, {"tool_choice", "required"},
                         {"max_tokens", 80}, {"temperature", 0}, {"stream", stream}, {"parallel_tool_calls", false}}
                        .dump(),
                    "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json call;
    std::string finish;
    if (!stream) {
      const json j = json::parse(r->body)["choices"][0];
      ASSERT_TRUE(j["message"].contains("tool_calls")) << r->body;
      call = j["message"]["tool_calls"][0];
      finish = j["finish_reason"];
    } else {
      for (const std::string& e : sse_data(r->body)) {
        if (e == "[DONE]") continue;
        const json ch = json::parse(e)["choices"][0];
        if (ch["delta"].contains("tool_calls")) call = ch["delta"]["tool_calls"][0];
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
      }
    }
    EXPECT_EQ(finish, "tool_calls") << r->body;
    EXPECT_EQ(call["function"]["name"], "weather") << r->body;
    EXPECT_TRUE(json::parse(call["function"]["arguments"].get<std::string>()).is_object()) << r->body;
  }
  expect_error(c.Post("/v1/chat/completions", json{{"messages", user}, {"tools", json::array({{{"type", "web"}}})}}.dump(),
                      "application/json"),
               400, "tools[0]");
  expect_error(c.Post("/v1/chat/completions",
                      json{{"messages", json::array({{{"role", "user"}, {"content", "x"}, {"tool_calls", json::array()}}})}}
                          .dump(),
                      "application/json"),
               400, "only an assistant message makes tool calls");

  Served plain;  // ChatML without tools
  auto p = plain.client();
  expect_error(p.Post("/v1/chat/completions", json{{"messages", user}, {"tools", json::parse(kWeatherTools)}}.dump(),
                      "application/json"),
               400, "does not show tools");
  auto none = p.Post("/v1/chat/completions",
                     json{{"messages", user}, {"tools", json::parse(kWeatherTools)}, {"tool_choice", "none"},
                          {"max_tokens", 4}}
                         .dump(),
                     "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 200) << none->body;
}
