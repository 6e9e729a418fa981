// `sluice serve`'s HTTP server against hostile requests, in process on 127.0.0.1: bodies whose
// JSON nests deeply or holds huge numbers of values, and whatever a request asks of memory
// before its prompt is known to fit. Every one is a 4xx with OpenAI's error object, bounded in
// time and memory, and the server answers honest requests afterwards.
#include <gtest/gtest.h>

#include <thread>

#include "tests/tools/server/server_util.h"
#include "tests/tools/cli/cli_util.h"
#include "tests/tools/server/raw_http.h"

using namespace sluice;
using namespace sluice::test;
using nlohmann::json;

namespace {

void expect_api_error(const RawResponse& r, int status, const std::string& part) {
  EXPECT_EQ(r.status, status) << r.head << r.body;
  const json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find(part), std::string::npos) << r.body;
}

// The server still completes an honest request.
void expect_alive(const Served& s) {
  const RawResponse r =
      raw_exchange(s.port, post_json("/v1/completions", R"({"prompt": "The old man", "max_tokens": 2})"));
  EXPECT_EQ(r.status, 200) << r.body;
}

}  // namespace

// 16,000 levels of arrays in an ignored field overflowed the worker's stack in the recursive
// UTF-8 check (a crash of the whole server); any depth beyond the bound is a 400 now.
TEST(ServerHostile, DeeplyNestedJsonIsA400) {
  server::ServerOptions so;
  so.max_body_bytes = 1 << 20;
  Served s(so);
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    const std::string body = R"({"prompt":"a","max_tokens":1,"x":)" + std::string(16000, '[') + std::string(16000, ']') + "}";
    expect_api_error(raw_exchange(s.port, post_json(path, body)), 400, "deeper than 128 levels");
    const std::string objects = R"({"x":)" + [] {
      std::string o;
      for (int i = 0; i < 20000; ++i) o += R"({"a":)";
      return o + "1" + std::string(20000, '}');
    }() + "}";
    expect_api_error(raw_exchange(s.port, post_json(path, objects)), 400, "deeper than 128 levels");
  }
  // 128 levels are fine (the field is ignored).
  const std::string ok = R"({"prompt":"a","max_tokens":1,"x":)" + std::string(127, '[') + std::string(127, ']') + "}";
  EXPECT_EQ(raw_exchange(s.port, post_json("/v1/completions", ok)).status, 200);
  expect_alive(s);
}

// ~200,000 empty chat messages (7.5 MB) took 378 MB a request before the prompt was found too
// long; now the body's size in values and the message count are refused before parsing and
// rendering, four at once within a bounded peak.
TEST(ServerHostile, HugeMessageListsAreRefusedWithinBoundedMemory) {
  server::ServerOptions so;
  so.max_body_bytes = 16 << 20;  // the bodies are refused for their values, not their size
  Served s(so);
  std::string many = R"({"messages":[)";
  for (int i = 0; i < 200000; ++i) many += std::string(i ? "," : "") + R"({"role":"user","content":""})";
  many += "]}";
  std::string fewer = R"({"messages":[)";  // within the value bound, beyond the context's 96 tokens
  for (int i = 0; i < 20000; ++i) fewer += std::string(i ? "," : "") + R"({"role":"user","content":""})";
  fewer += "]}";
  const uint64_t before = self_status_kb("VmRSS:") * 1024;
  self_reset_peak_rss();
  std::vector<RawResponse> got(8);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < got.size(); ++i)
    clients.emplace_back([&, i] { got[i] = raw_exchange(s.port, post_json("/v1/chat/completions", i % 2 ? fewer : many), 60); });
  for (auto& t : clients) t.join();
  const uint64_t peak = self_status_kb("VmHWM:") * 1024;
  for (size_t i = 0; i < got.size(); ++i) {
    if (i % 2) expect_api_error(got[i], 400, "messages");
    else expect_api_error(got[i], 400, "JSON values");
  }
  // 8 bodies of up to 7.5 MB are held while they arrive (60 MB); parsing and rendering add
  // a bounded amount per worker.
  EXPECT_LT(peak - std::min(peak, before), uint64_t{200} << 20) << "peak " << (peak >> 20) << " MiB, before "
                                                                  << (before >> 20) << " MiB";
  expect_alive(s);
}

// One body limit whatever the framing: a chunked body past it is a 413 (it was read whole, 200
// MiB); a POST without a length is a 411 (it was read to the connection's end); a compressed
// body is a 415 (gzip inflated 1000:1); an oversized or negative Content-Length is answered at
// once (it was skipped for 30 s).
TEST(ServerHostile, OneBodyLimitWhateverTheFraming) {
  Served s;  // 64 KiB bodies
  {
    RawConn c(s.port);
    std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n";
    ASSERT_TRUE(c.send(req));
    const std::string chunk = std::string("2000\r\n") + std::string(0x2000, ' ') + "\r\n";
    for (int i = 0; i < 12 && c.send(chunk); ++i) {
    }
    const auto rs = parse_responses(c.read(10, 1));
    ASSERT_EQ(rs.size(), 1u);
    expect_api_error(rs[0], 413, "larger than 65536 bytes");
  }
  expect_api_error(raw_exchange(s.port, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                        "application/json\r\n\r\n{\"prompt\": \"a\"}"),
                   411, "Content-Length");
  expect_api_error(raw_exchange(s.port, post_json("/v1/completions", std::string("\x1f\x8b\x08\0\0\0\0\0", 8),
                                                  "Content-Encoding: gzip\r\n")),
                   415, "gzip");
  for (const char* length : {"18446744073709551616", "99999999999999999999999", "70000"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const RawResponse r = raw_exchange(s.port, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                               "application/json\r\nContent-Length: " + std::string(length) + "\r\n\r\n{",
                                       5);
    expect_api_error(r, 413, "larger than");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0) << length;
  }
  for (const char* length : {"-1", "12abc", "1, 2"})
    expect_api_error(raw_exchange(s.port, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " +
                                              std::string(length) + "\r\n\r\n{",
                                  5),
                     400, "Content-Length");
  // A chunked body within the limit is read and answered like any other.
  const std::string body = R"({"prompt": "The old man", "max_tokens": 2})";
  const RawResponse ok = raw_exchange(s.port, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                              "application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n" +
                                                  body.substr(0, 5) + "\r\n" +
                                                  [&] {
                                                    char h[16];
                                                    std::snprintf(h, sizeof h, "%zx", body.size() - 5);
                                                    return std::string(h);
                                                  }() + "\r\n" + body.substr(5) + "\r\n0\r\n\r\n");
  EXPECT_EQ(ok.status, 200) << ok.body;
  expect_alive(s);
}

// Headers are bounded in line length, total size and count (200 MiB of 8 KB header lines on
// GET /health were read and 461 MB stayed resident).
TEST(ServerHostile, HeadersAreBounded) {
  Served s;
  {
    RawConn c(s.port);
    c.send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    const std::string line = "X-Pad: " + std::string(8000, 'a') + "\r\n";
    for (int i = 0; i < 2000 && c.send(line); ++i) {
    }
    const auto rs = parse_responses(c.read(10, 1));
    ASSERT_EQ(rs.size(), 1u);
    expect_api_error(rs[0], 431, "larger than 32768 bytes");
  }
  expect_api_error(raw_exchange(s.port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + std::string(9000, 'b') +
                                            "\r\n\r\n"),
                   431, "longer than 8192");
  std::string many = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (int i = 0; i < 150; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
  expect_api_error(raw_exchange(s.port, many + "\r\n"), 431, "more than 100 header fields");
  expect_api_error(raw_exchange(s.port, "GET /" + std::string(9000, 'p') + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), 414,
                   "request line");
  expect_api_error(raw_exchange(s.port, "GET /health HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n"), 505, "HTTP version");
  expect_api_error(raw_exchange(s.port, "GET /health HTTP/1.1\r\n\r\n"), 400, "Host");
  expect_alive(s);
}

// Three GET /health in one write got one answer; every pipelined request is answered, in order.
TEST(ServerHostile, PipelinedRequestsAreAllAnswered) {
  Served s;
  RawConn c(s.port);
  const std::string health = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_TRUE(c.send(health + health + "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" +
                     post_json("/v1/completions", R"({"prompt": "The old man", "max_tokens": 3, "temperature": 0})") +
                     health));
  const auto rs = parse_responses(c.read(30, 5));
  ASSERT_EQ(rs.size(), 5u);
  for (const RawResponse& r : rs) EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(rs[0].body)["status"], "ok");
  EXPECT_EQ(json::parse(rs[2].body)["object"], "list");
  EXPECT_EQ(json::parse(rs[3].body)["object"], "text_completion");
  EXPECT_EQ(json::parse(rs[4].body)["status"], "ok");
  // The connection stays usable.
  ASSERT_TRUE(c.send(health));
  EXPECT_EQ(parse_responses(c.read(10, 1)).size(), 1u);
}

// 1e999 was a 500 quoting the JSON library; [1.0, 2] was "several prompts"; top_p 1e-320 was
// reported in the engine's words; a POST route's other methods were 404.
TEST(ServerHostile, FieldErrorsAndMethodsSpeakOfTheRequest) {
  Served s;
  for (const char* field : {"max_tokens", "temperature", "top_p", "seed", "x"})
    expect_api_error(raw_exchange(s.port, post_json("/v1/completions", std::string(R"({"prompt": "a", ")") + field +
                                                                           R"(": 1e999})")),
                     400, "not valid JSON: number overflow");
  expect_api_error(raw_exchange(s.port, post_json("/v1/completions", R"({"prompt": [1.0, 2]})")), 400,
                   "token ids must hold integers");
  expect_api_error(raw_exchange(s.port, post_json("/v1/completions", R"({"prompt": "a", "top_p": 1e-320})")), 400,
                   "'top_p' is 1e-320");
  for (const char* method : {"PUT", "DELETE", "OPTIONS", "GET", "PATCH"}) {
    const RawResponse r = raw_exchange(s.port, std::string(method) + " /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                                     "Content-Length: 0\r\n\r\n");
    expect_api_error(r, 405, "not allowed");
    EXPECT_EQ(r.header("Allow"), "POST") << method;
  }
  const RawResponse r = raw_exchange(s.port, "POST /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n");
  expect_api_error(r, 405, "not allowed");
  EXPECT_EQ(r.header("Allow"), "GET, HEAD");
  expect_api_error(raw_exchange(s.port, "GET /nowhere HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), 404, "no such route");
}

// A content part, tool, tool choice or Anthropic block whose "type" was a number ended the
// server (json's value("type", "") throws type_error; found by fuzz_openai_body).
TEST(ServerHostile, ATypeOfAnotherKindIsA400) {
  Served s;
  expect_api_error(raw_exchange(s.port, post_json("/v1/chat/completions",
                                                  R"({"messages": [{"role": "user", "content": [{"type": 1e-320, "text": "Hi"}]}]})")),
                   400, "only text parts are supported");
  expect_api_error(raw_exchange(s.port, post_json("/v1/chat/completions",
                                                  R"({"messages": [{"role": "user", "content": "Hi"}],
                                                      "tools": [{"type": 7, "function": {"name": "f"}}]})")),
                   400, "tools[0] must be");
  expect_api_error(raw_exchange(s.port, post_json("/v1/chat/completions",
                                                  R"({"messages": [{"role": "user", "content": "Hi"}],
                                                      "tool_choice": {"type": [1], "function": {"name": "f"}}})")),
                   400, "'tool_choice' must be");
  expect_api_error(raw_exchange(s.port, post_json("/v1/messages",
                                                  R"({"max_tokens": 4, "system": [{"type": {}, "text": "x"}],
                                                      "messages": [{"role": "user", "content": "Hi"}]})")),
                   400, "must be a text block");
  EXPECT_EQ(raw_exchange(s.port, post_json("/v1/completions", R"({"prompt": "a", "max_tokens": 1})")).status, 200);
}

// A keyless server answered any Host and parsed text/plain bodies as JSON: a page elsewhere
// could reach it (cross-site posts, DNS rebinding). Now: Host must name this machine, an
// Origin must be the server's own, POST bodies must be application/json, unless --api-key is
// set or --allow-host / --allow-origin widen it.
TEST(ServerHostile, HostOriginAndMediaTypeWithoutAKey) {
  const std::string body = R"({"prompt": "a", "max_tokens": 1})";
  const auto post = [&](int port, const std::string& headers, const std::string& type = "application/json") {
    return raw_exchange(port, "POST /v1/completions HTTP/1.1\r\n" + headers + "Content-Type: " + type +
                                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  };
  {
    Served s;
    const std::string port = std::to_string(s.port);
    expect_api_error(post(s.port, "Host: attacker.example:" + port + "\r\n"), 403, "Host header");
    expect_api_error(raw_exchange(s.port, "GET /v1/models HTTP/1.1\r\nHost: rebound.example\r\n\r\n"), 403, "Host header");
    expect_api_error(post(s.port, "Host: 127.0.0.1:" + port + "\r\nOrigin: http://attacker.example\r\n"), 403,
                     "attacker.example");
    expect_api_error(post(s.port, "Host: 127.0.0.1:" + port + "\r\nOrigin: null\r\n"), 403, "not allowed");
    expect_api_error(post(s.port, "Host: 127.0.0.1:" + port + "\r\n", "text/plain"), 415, "application/json");
    expect_api_error(post(s.port, "Host: 127.0.0.1:" + port + "\r\n", "application/x-www-form-urlencoded"), 415,
                     "application/json");
    for (const std::string& host : std::vector<std::string>{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port, "10.1.2.3"})
      EXPECT_EQ(post(s.port, "Host: " + host + "\r\n").status, 200) << host;
    // The server's own page.
    EXPECT_EQ(post(s.port, "Host: localhost:" + port + "\r\nOrigin: http://localhost:" + port + "\r\n").status, 200);
    EXPECT_EQ(post(s.port, "Host: 127.0.0.1\r\n", "application/json; charset=utf-8").status, 200);
  }
  {
    server::ServerOptions so;
    so.allow_hosts = {"sluice.lan"};
    so.allow_origins = {"http://app.example"};
    Served s(so);
    EXPECT_EQ(post(s.port, "Host: sluice.lan\r\n").status, 200);
    const RawResponse r = post(s.port, "Host: 127.0.0.1\r\nOrigin: http://app.example\r\n");
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.header("Access-Control-Allow-Origin"), "http://app.example");
    const RawResponse pre = raw_exchange(s.port, "OPTIONS /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: "
                                                 "http://app.example\r\nAccess-Control-Request-Method: POST\r\n\r\n");
    EXPECT_EQ(pre.status, 204);
    EXPECT_NE(pre.header("Access-Control-Allow-Methods").find("POST"), std::string::npos);
    expect_api_error(post(s.port, "Host: 127.0.0.1\r\nOrigin: http://other.example\r\n"), 403, "not allowed");
  }
  {
    server::ServerOptions so;
    so.api_key = "k";
    Served s(so);
    EXPECT_EQ(post(s.port, "Host: anything.example\r\nOrigin: http://elsewhere.example\r\nAuthorization: Bearer k\r\n",
                   "text/plain")
                  .status,
              200);
  }
}
