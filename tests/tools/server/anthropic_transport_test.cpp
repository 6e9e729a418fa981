// The Anthropic Messages routes over the server's own connection layer, in process on
// 127.0.0.1: the bounds and checks every route passes (the transport's 411, 413, 415, the
// JSON bounds, Host, Origin, media type, 405 with Allow) answered in Anthropic's error shape;
// a streamed message that ends its connection after its chunked end; and a client that closes
// its connection, streaming or not, cancels its message at the engine's next step.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "tests/tools/server/raw_http.h"
#include "tests/tools/server/server_util.h"

using namespace sluice;
using namespace sluice::test;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kMessage = R"({"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})";

// An answer with `status` and Anthropic's error object of `type`, its message holding `part`.
void expect_anthropic_error(const RawResponse& r, int status, const std::string& type, const std::string& part) {
  EXPECT_EQ(r.status, status) << r.head << r.body;
  const json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.value("type", "") == "error" && j.contains("error")) << r.body;
  EXPECT_EQ(j["error"].value("type", ""), type) << r.body;
  EXPECT_NE(j["error"].value("message", "").find(part), std::string::npos) << r.body;
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The demo model (trained: it writes long replies) with a ChatML-style chat template.
std::filesystem::path demo_chat_model() {
  const std::filesystem::path dir = pack_test_dir("anthropic-demo");
  const std::filesystem::path demo = source_dir() / "models" / "demo";
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
    std::filesystem::copy_file(demo / f, dir / f, std::filesystem::copy_options::overwrite_existing);
  json cfg = json::parse(std::ifstream(demo / "tokenizer_config.json"));
  cfg["chat_template"] =
      "{%- for message in messages %}{{- message.role + ': ' + message.content + '\\n' }}{%- endfor %}"
      "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}";
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  return dir;
}

}  // namespace

TEST(AnthropicTransport, EveryCheckAnswersInAnthropicsShape) {
  Served s;  // 64 KiB bodies, no API key
  const std::string port = std::to_string(s.port);
  for (const char* path : {"/v1/messages", "/v1/messages/count_tokens"}) {
    const std::string p = path;
    // The transport's own answers, once the request line named the route.
    expect_anthropic_error(raw_exchange(s.port, "POST " + p + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                                "application/json\r\nContent-Length: 70000\r\n\r\n{", 5),
                           413, "request_too_large", "larger than 65536 bytes");
    expect_anthropic_error(raw_exchange(s.port, "POST " + p + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                                "application/json\r\n\r\n" + kMessage),
                           411, "invalid_request_error", "Content-Length");
    expect_anthropic_error(raw_exchange(s.port, post_json(p, std::string("\x1f\x8b\x08\0\0\0\0\0", 8),
                                                          "Content-Encoding: gzip\r\n")),
                           415, "invalid_request_error", "gzip");
    {
      RawConn c(s.port);
      ASSERT_TRUE(c.send("POST " + p + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n"));
      const std::string chunk = std::string("2000\r\n") + std::string(0x2000, ' ') + "\r\n";
      for (int i = 0; i < 12 && c.send(chunk); ++i) {
      }
      const auto rs = parse_responses(c.read(10, 1));
      ASSERT_EQ(rs.size(), 1u);
      expect_anthropic_error(rs[0], 413, "request_too_large", "larger than 65536 bytes");
    }
    // The server's checks: the JSON's bounds and numbers, Host, Origin, media type, methods.
    const std::string deep = R"({"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}], "metadata": )" +
                             std::string(5000, '[') + std::string(5000, ']') + "}";
    expect_anthropic_error(raw_exchange(s.port, post_json(p, deep)), 400, "invalid_request_error", "deeper than 128 levels");
    expect_anthropic_error(raw_exchange(s.port, post_json(p, R"({"max_tokens": 1e999, "messages": []})")), 400,
                           "invalid_request_error", "not valid JSON: number overflow");
    std::string many = R"({"max_tokens": 2, "messages": [)";
    for (int i = 0; i < 200; ++i) many += std::string(i ? "," : "") + R"({"role": "user", "content": ""})";
    expect_anthropic_error(raw_exchange(s.port, post_json(p, many + "]}")), 400, "invalid_request_error",
                           "the context holds 96 tokens");
    const std::string post_head = "POST " + p + " HTTP/1.1\r\nContent-Length: " + std::to_string(kMessage.size()) + "\r\n";
    expect_anthropic_error(raw_exchange(s.port, post_head + "Host: attacker.example:" + port +
                                                    "\r\nContent-Type: application/json\r\n\r\n" + kMessage),
                           403, "permission_error", "Host header");
    expect_anthropic_error(raw_exchange(s.port, post_head + "Host: 127.0.0.1\r\nOrigin: http://attacker.example\r\n"
                                                            "Content-Type: application/json\r\n\r\n" + kMessage),
                           403, "permission_error", "attacker.example");
    expect_anthropic_error(raw_exchange(s.port, post_head + "Host: 127.0.0.1\r\nContent-Type: text/plain\r\n\r\n" + kMessage),
                           415, "invalid_request_error", "application/json");
    for (const char* method : {"GET", "PUT", "DELETE"}) {
      const RawResponse r = raw_exchange(s.port, std::string(method) + " " + p + " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                                                  "Content-Length: 0\r\n\r\n");
      expect_anthropic_error(r, 405, "not_found_error", "not allowed");
      EXPECT_EQ(r.header("Allow"), "POST") << method << " " << p;
    }
  }
  // Before the request line is whole the route is unknown: OpenAI's shape, as for any path.
  const RawResponse line = raw_exchange(s.port, "POST /v1/messages" + std::string(9000, 'x') + " HTTP/1.1\r\n\r\n");
  EXPECT_EQ(line.status, 414);
  EXPECT_TRUE(json::parse(line.body, nullptr, false).contains("error")) << line.body;
  // Honest requests still pass.
  const RawResponse ok = raw_exchange(s.port, post_json("/v1/messages", kMessage));
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(json::parse(ok.body)["type"], "message");
  EXPECT_EQ(ok.header("Connection"), "keep-alive");
  const RawResponse count = raw_exchange(s.port, post_json("/v1/messages/count_tokens", kMessage));
  ASSERT_EQ(count.status, 200) << count.body;
  EXPECT_GT(json::parse(count.body)["input_tokens"].get<int>(), 0);
}

// A streamed message is chunked, says Connection: close and closes its connection after its
// chunked end, its events ending with message_delta (the stop reason of the same message not
// streamed) and message_stop.
TEST(AnthropicTransport, AStreamEndsAndClosesItsConnection) {
  Served s;
  const std::string request = R"({"max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}])";
  const RawResponse whole = raw_exchange(s.port, post_json("/v1/messages", request + "}"));
  ASSERT_EQ(whole.status, 200) << whole.body;
  const std::string stop_reason = json::parse(whole.body)["stop_reason"].get<std::string>();
  RawConn c(s.port);
  const auto t0 = Clock::now();
  ASSERT_TRUE(c.send(post_json("/v1/messages", request + R"(, "stream": true})")));
  const std::string got = c.read(30);  // to the close
  EXPECT_LT(since(t0), 20) << "the connection stayed open after the stream";
  const auto rs = parse_responses(got, true);
  ASSERT_EQ(rs.size(), 1u) << got;
  EXPECT_EQ(rs[0].status, 200);
  EXPECT_EQ(rs[0].header("Connection"), "close");
  EXPECT_EQ(rs[0].header("Content-Type"), "text/event-stream");
  EXPECT_NE(got.find("\r\n0\r\n\r\n"), std::string::npos) << "no chunked end";
  const std::string& body = rs[0].body;
  EXPECT_EQ(body.rfind("event: message_start\n", 0), 0u) << body;
  EXPECT_NE(body.find("event: ping\n"), std::string::npos);
  const size_t delta = body.find("event: message_delta\n");
  ASSERT_NE(delta, std::string::npos) << body;
  EXPECT_NE(body.find("\"stop_reason\":\"" + stop_reason + "\"", delta), std::string::npos) << stop_reason << ": " << body;
  EXPECT_TRUE(body.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")) << body;
}

// A client that closes its connection while its message runs (streamed or not) cancels it:
// its sequence comes back within a few steps.
TEST(AnthropicTransport, AClosedMessageIsCancelledStreamingOrNot) {
  Served s({}, 4, 64, demo_chat_model(), 512);
  for (bool stream : {false, true})
    expect_closed_requests_cancelled(
        s, "/v1/messages",
        [&](int) {
          return json{{"messages", {{{"role", "user"}, {"content", "The old man walked"}}}}, {"max_tokens", 450},
                      {"temperature", 0.7}, {"stream", stream}}
              .dump();
        },
        8, stream ? "streaming" : "not streaming");
}
