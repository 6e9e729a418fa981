// The server for agents and apps, in process on 127.0.0.1 over the fixture qwen3_moe with a
// Hermes-style template that shows tools: the `openai` and `@anthropic-ai/sdk` npm clients
// (sdk_clients.mjs: JSON-schema replies checked with ajv, forced tool calls, Anthropic
// messages streamed and not, a tool_use / tool_result round trip, count_tokens), and every
// malformed schema, tool list, message block and header answered with its 4xx in the API's
// own error shape.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/batch_engine.h"
#include "models/load.h"
#include "server/http_server.h"
#include "tests/tools/server/server_util.h"

using namespace sluice;
using namespace sluice::test;
using nlohmann::json;

namespace {

constexpr const char* kTemplate =
    "{%- if tools %}{{- '<|im_start|>system\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}"
    "{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}{%- for message in messages %}"
    "{%- if message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message.tool_calls %}{{- '<|im_start|>assistant\\n' + message.content }}{%- for tc in message.tool_calls %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' + tc.function.arguments + "
    "'}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

struct AgentServer {
  std::unique_ptr<Backend> be = make_cpu_backend();
  LoadedModel model;
  std::unique_ptr<BatchEngine> engine;
  std::unique_ptr<server::HttpServer> http;
  std::thread thread;
  int port = 0;

  AgentServer() {
    // The fixture with a context of 512 positions (its rotary embedding has no limit), room
    // for tools, a call and its result.
    const std::filesystem::path dir = server_test_model("agent-model", kTemplate);
    json cfg = json::parse(std::ifstream(dir / "config.json"));
    cfg["max_position_embeddings"] = 512;
    std::ofstream(dir / "config.json") << cfg.dump();
    model = load_model(dir, *be);
    BatchEngineOptions eo;
    eo.n_parallel = 4;
    eo.n_ctx = 512;
    engine = std::make_unique<BatchEngine>(*model.model, eo);
    server::ServerOptions so;
    so.port = 0;
    so.model_name = "fixture";
    so.api_key = "sekret";
    http = std::make_unique<server::HttpServer>(model, *engine, so);
    std::string err;
    EXPECT_TRUE(http->bind(&err)) << err;
    port = http->port();
    thread = std::thread([this] { http->run(); });
  }
  ~AgentServer() {
    http->stop();
    thread.join();
  }
  httplib::Result post(const std::string& path, const std::string& body, const httplib::Headers& h) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(std::chrono::seconds(60));
    return c.Post(path.c_str(), h, body, "application/json");
  }
};

const httplib::Headers kBearer = {{"Authorization", "Bearer sekret"}};
const httplib::Headers kXKey = {{"x-api-key", "sekret"}, {"anthropic-version", "2023-06-01"}};

// An answer with status and, in Anthropic's shape or OpenAI's, a message holding `needle`.
void expect_api_error(const httplib::Result& r, int status, const std::string& needle, bool anthropic) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, status) << r->body;
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  if (anthropic) {
    EXPECT_EQ(j.value("type", ""), "error") << r->body;
    ASSERT_TRUE(j.contains("error") && j["error"].contains("type") && j["error"].contains("message")) << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r->body;
  } else {
    ASSERT_TRUE(j.contains("error") && j["error"].contains("message")) << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r->body;
  }
}

}  // namespace

TEST(AgentApi, OpenAIAndAnthropicClients) {
  AgentServer s;
  std::string err;
  const std::string out = run_node_script("sdk_clients.mjs", {{"BASE_URL", str("http://127.0.0.1:", s.port)}, {"API_KEY", "sekret"}}, &err);
  ASSERT_FALSE(out.empty()) << err;
  const json j = json::parse(out);
  // JSON-schema replies: every one that ended (not cut by max_tokens) validates with ajv.
  EXPECT_EQ(j["schema_failures"].size(), 0u) << j["schema_failures"].dump(2);
  int ended = 0;
  for (const json& r : j["schema_replies"]) ended += r["finish"] == "stop";
  EXPECT_GE(ended, 8) << j["schema_replies"].dump(2);
  // A named function: the reply is its call.
  EXPECT_EQ(j["openai_call_finish"], "tool_calls") << out;
  EXPECT_EQ(j["openai_call"]["function"]["name"], "look") << out;
  EXPECT_TRUE(json::parse(j["openai_call"]["function"]["arguments"].get<std::string>()).contains("w")) << out;
  // Anthropic: a message, its stream's events in order, the same text.
  const json& plain = j["anthropic_plain"];
  EXPECT_EQ(plain["type"], "message");
  EXPECT_EQ(plain["role"], "assistant");
  EXPECT_EQ(plain["stop_reason"], "max_tokens");
  EXPECT_EQ(plain["usage"]["output_tokens"], 8);
  ASSERT_EQ(plain["content"].size(), 1u) << plain.dump();
  EXPECT_EQ(j["anthropic_streamed"], plain["content"][0]["text"]);
  const json& ev = j["anthropic_events"];
  ASSERT_GE(ev.size(), 6u) << ev.dump();
  EXPECT_EQ(ev[0], "message_start");
  EXPECT_EQ(ev[ev.size() - 1], "message_stop");
  EXPECT_EQ(ev[ev.size() - 2], "message_delta");
  EXPECT_EQ(ev[ev.size() - 3], "content_block_stop");
  EXPECT_NE(std::find(ev.begin(), ev.end(), "content_block_start"), ev.end());
  // tool_choice any: a tool_use block; the round trip with its tool_result is answered.
  const json& call = j["anthropic_call"];
  EXPECT_EQ(call["stop_reason"], "tool_use") << call.dump();
  const json& use = call["content"].back();
  EXPECT_EQ(use["type"], "tool_use") << call.dump();
  EXPECT_EQ(use["name"], "look");
  EXPECT_TRUE(use["input"].contains("w")) << call.dump();
  ASSERT_TRUE(j.contains("anthropic_followup")) << out;
  EXPECT_EQ(j["anthropic_followup"]["type"], "message");
  EXPECT_GT(j["anthropic_followup"]["usage"]["input_tokens"].get<int>(), call["usage"]["input_tokens"].get<int>());
  // The SDK's stream helper assembles the streamed tool_use (input_json_delta) into its input.
  const json& fin = j["anthropic_stream_final"];
  EXPECT_EQ(fin["stop_reason"], "tool_use") << fin.dump();
  EXPECT_EQ(fin["content"].back()["type"], "tool_use") << fin.dump();
  EXPECT_TRUE(fin["content"].back()["input"].contains("w")) << fin.dump();
  EXPECT_EQ(j["count"]["input_tokens"], plain["usage"]["input_tokens"]);
  EXPECT_EQ(j["bad_status"], 400);
  EXPECT_EQ(j["bad_error"]["type"], "error") << out;
  EXPECT_EQ(j["bad_error"]["error"]["type"], "invalid_request_error") << out;
}

TEST(AgentApi, MalformedInputIsA4xxInTheApisShape) {
  AgentServer s;
  const std::string user = R"([{"role": "user", "content": "Hi"}])";
  auto chat = [&](const std::string& extra) {
    return s.post("/v1/chat/completions", R"({"messages": )" + user + ", " + extra + "}", kBearer);
  };
  expect_api_error(chat(R"("response_format": {"type": "xml"})"), 400, "'response_format.type'", false);
  expect_api_error(chat(R"("response_format": "json")"), 400, "'response_format'", false);
  expect_api_error(chat(R"("response_format": {"type": "json_schema"})"), 400, "json_schema", false);
  expect_api_error(chat(R"("response_format": {"type": "json_schema", "json_schema": {"schema": 3}})"), 400, "schema", false);
  expect_api_error(chat(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": true}}})"),
                   400, "'uniqueItems'", false);
  expect_api_error(chat(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}})"),
                   400, "points at nothing", false);
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])";
  expect_api_error(chat(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "g"}})"), 400, "'g'", false);
  expect_api_error(chat(R"("tool_choice": "required")"), 400, "'tools' is empty", false);
  expect_api_error(chat(tools + R"(, "tool_choice": {"type": "function"})"), 400, "'tool_choice'", false);
  expect_api_error(chat(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}])"), 400, "parameters", false);
  expect_api_error(chat(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"not": {}}}}}}], "tool_choice": "required")"),
                   400, "'not'", false);
  expect_api_error(chat(R"("reasoning_format": "loud")"), 400, "'reasoning_format'", false);

  auto msg = [&](const std::string& body, const httplib::Headers& h = kXKey) { return s.post("/v1/messages", body, h); };
  expect_api_error(msg("{not json"), 400, "not valid JSON", true);
  expect_api_error(msg(R"({"messages": [{"role": "user", "content": "x"}]})"), 400, "max_tokens", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": []})"), 400, "messages", true);
  expect_api_error(msg(R"({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]})"), 400, "max_tokens", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]})"), 400, "role", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]})"), 400, "'image'", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]})"),
                   400, "assistant", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]})"), 400, "tool_use_id", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": 3}]}]})"),
                   400, "input", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]})"), 400, "input_schema", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "w"}]})"),
                   400, "server tools", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "sometimes"}})"), 400, "tool_choice", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}})"), 400, "tools is empty", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5})"), 400, "temperature", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "stop_sequences": [""]})"), 400, "stop_sequences", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "frobnicate": 1})"), 400, "'frobnicate'", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "system": [{"type": "image"}]})"), 400, "system", true);
  expect_api_error(msg(R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "string", "format": "uri"}}}}], "tool_choice": {"type": "any"}})"),
                   400, "'format'", true);
  expect_api_error(msg("{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}"), 400, "not valid JSON", true);
  // Headers: a wrong key, no key; a bearer token works too; unknown routes and other methods in
  // Anthropic's shape.
  const std::string ok = R"({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})";
  expect_api_error(msg(ok, {{"x-api-key", "wrong"}}), 401, "API key", true);
  expect_api_error(msg(ok, {}), 401, "API key", true);
  auto r = msg(ok, kBearer);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  expect_api_error(s.post("/v1/messages/nothing", ok, kXKey), 404, "no such route", true);
  httplib::Client c("127.0.0.1", s.port);
  const auto get = c.Get("/v1/messages", kXKey);
  expect_api_error(get, 405, "not allowed", true);
  EXPECT_EQ(get->get_header_value("Allow"), "POST");
  expect_api_error(s.post("/v1/messages/count_tokens", R"({"messages": 3})", kXKey), 400, "messages", true);
  // The OpenAI routes take x-api-key as well.
  auto oa = s.post("/v1/chat/completions", R"({"max_tokens": 2, "messages": )" + user + "}", {{"x-api-key", "sekret"}});
  ASSERT_TRUE(oa);
  EXPECT_EQ(oa->status, 200) << oa->body;
}
