// The hostile-client load test, on 127.0.0.1 and bounded in time: while 100 slow clients
// (a header byte every 500 ms), 100 idle connections, nested-JSON bodies and oversized bodies
// (chunked past the limit, and an absurd Content-Length) hit the server, 8 honest streaming
// clients finish with the same text as alone, /health answers each time in under a second,
// and the server's memory and threads stay within stated bounds.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/models/fixture_util.h"
#include "tests/tools/server/server_util.h"
#include "tests/tools/cli/cli_util.h"
#include "tests/tools/server/raw_http.h"

using namespace sluice;
using namespace sluice::test;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// The SSE text of a completion stream.
std::string stream_text(const std::string& body) {
  std::string text;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string e = body.substr(at + 6, end - at - 6);
    at = end;
    if (e == "[DONE]") continue;
    const json j = json::parse(e, nullptr, false);
    if (j.is_object() && j.contains("choices") && !j["choices"].empty()) text += j["choices"][0]["text"].get<std::string>();
  }
  return text;
}

}  // namespace

TEST(ServerLoad, HonestClientsFinishBesideHostileOnes) {
  constexpr int kSlow = 100, kIdle = 100, kHonest = 8;
  constexpr auto kHostileFor = std::chrono::seconds(8);
  // Bounds: the server's threads are the engine's, 2 workers and the connection thread, and
  // its memory beyond the model what 64 KiB bodies and a few hundred connections need.
  constexpr size_t kServerThreadSlack = 2;
  constexpr uint64_t kRssGrowthKb = 256 << 10;  // 256 MiB
  server::ServerOptions so;
  so.head_timeout = std::chrono::milliseconds(3000);
  so.idle_timeout = std::chrono::milliseconds(3000);
  Served s(so, 8, 64, source_dir() / "models" / "demo", 256);
  const std::string prompt = "The old man walked";
  const std::string want = greedy_text(s.model, s.model.tokenizer->encode(prompt, s.model.tokenizer->add_bos()), 32, 256);
  const size_t threads_before = self_thread_count();
  const uint64_t rss_before = self_status_kb("VmRSS:");
  self_reset_peak_rss();  // VmHWM from here

  std::atomic<bool> stop{false};
  std::vector<std::thread> test_threads;
  // 100 slow clients: one thread trickles a header byte to each every 500 ms, reconnecting the
  // ones the server timed out.
  test_threads.emplace_back([&] {
    std::vector<std::unique_ptr<RawConn>> conns;
    for (int i = 0; i < kSlow; ++i) conns.push_back(std::make_unique<RawConn>(s.port));
    for (auto& c : conns) c->send("POST /v1/completions HTTP/1.1\r\n");
    while (!stop) {
      for (auto& c : conns)
        if (!c->send("X")) {
          c = std::make_unique<RawConn>(s.port);
          c->send("POST /v1/completions HTTP/1.1\r\n");
        }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  // 100 idle connections, reopened when the server closes them.
  test_threads.emplace_back([&] {
    std::vector<std::unique_ptr<RawConn>> conns;
    for (int i = 0; i < kIdle; ++i) conns.push_back(std::make_unique<RawConn>(s.port));
    while (!stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      for (auto& c : conns)
        if (c->closed_within(0.001)) c = std::make_unique<RawConn>(s.port);
    }
  });
  // Nested JSON and oversized bodies, one after another.
  std::atomic<int> hostile_answered{0}, hostile_wrong{0};
  test_threads.emplace_back([&] {
    const std::string nested = R"({"prompt":"a","x":)" + std::string(16000, '[') + std::string(16000, ']') + "}";
    const std::string chunk = std::string("4000\r\n") + std::string(0x4000, 'x') + "\r\n";
    while (!stop) {
      const RawResponse a = raw_exchange(s.port, post_json("/v1/completions", nested), 10);
      RawConn c(s.port);
      c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "Transfer-Encoding: chunked\r\n\r\n");
      for (int i = 0; i < 64 && c.send(chunk); ++i) {
      }
      const auto b = parse_responses(c.read(10, 1));
      const RawResponse d = raw_exchange(s.port, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                                 "application/json\r\nContent-Length: 18446744073709551615\r\n\r\n",
                                         10);
      hostile_answered += 3;
      hostile_wrong += (a.status != 400) + (b.empty() || b[0].status != 413) + (d.status != 413);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the hostile clients are in place

  // /health every 250 ms throughout.
  std::atomic<double> worst_health{0};
  std::atomic<int> health_failures{0};
  test_threads.emplace_back([&] {
    while (!stop) {
      const auto t0 = Clock::now();
      const RawResponse r = raw_exchange(s.port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 5);
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (r.status != 200) ++health_failures;
      if (dt > worst_health) worst_health = dt;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  });
  std::vector<std::string> texts(kHonest);
  std::vector<std::thread> honest;
  const auto started = Clock::now();
  for (int i = 0; i < kHonest; ++i)
    honest.emplace_back([&, i] {
      const RawResponse r = raw_exchange(
          s.port, post_json("/v1/completions",
                            json{{"prompt", prompt}, {"max_tokens", 32}, {"temperature", 0}, {"stream", true}}.dump()),
          60);
      texts[static_cast<size_t>(i)] = r.status == 200 ? stream_text(r.body) : "status " + std::to_string(r.status);
    });
  size_t peak_threads = 0;
  while (Clock::now() - started < kHostileFor) {
    peak_threads = std::max(peak_threads, self_thread_count());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : honest) t.join();
  stop = true;
  for (auto& t : test_threads) t.join();
  const uint64_t rss_peak = self_status_kb("VmHWM:");

  for (int i = 0; i < kHonest; ++i) EXPECT_EQ(texts[static_cast<size_t>(i)], want) << "honest client " << i;
  EXPECT_EQ(health_failures.load(), 0);
  EXPECT_LT(worst_health.load(), 1.0) << "/health took " << worst_health.load() << " s under load";
  EXPECT_GT(hostile_answered.load(), 0);
  EXPECT_EQ(hostile_wrong.load(), 0);
  const size_t own_threads = test_threads.size() + kHonest;
  EXPECT_LE(peak_threads, threads_before + own_threads + kServerThreadSlack)
      << "the server added threads under load (" << threads_before << " before)";
  EXPECT_LT(rss_peak, rss_before + kRssGrowthKb) << "peak RSS " << rss_peak / 1024 << " MiB, before "
                                                 << rss_before / 1024 << " MiB";
  std::printf("load: /health worst %.3f s; peak threads %zu (before %zu); peak RSS %llu MiB (before %llu MiB); "
              "%d hostile requests answered\n",
              worst_health.load(), peak_threads, threads_before, static_cast<unsigned long long>(rss_peak / 1024),
              static_cast<unsigned long long>(rss_before / 1024), hostile_answered.load());
}
