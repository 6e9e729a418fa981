// `sluice serve`'s connections under hostile and vanishing clients, in process on 127.0.0.1:
// clients that trickle their head or send nothing hold no thread and are timed out while
// /health answers; the queue holds requests, not threads; a client that closes a request,
// streaming or not, ends it at once; a stop ends every stream with its final chunk and [DONE].
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

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// GET /health on a new connection: its status and the seconds it took (status 0: none in 5 s).
std::pair<int, double> health(int port) {
  const auto t0 = Clock::now();
  const RawResponse r = raw_exchange(port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 5);
  return {r.status, since(t0)};
}

}  // namespace

// 80 connections trickling a header byte every few seconds kept /health unanswered for 45 s,
// and 200 idle ones each held one of the server's 76 threads. Now no connection holds a
// thread: /health answers in well under a second throughout, the tricklers get 408 at the head
// deadline, idle connections close at the idle timeout, and the thread count stays put.
TEST(ServerConnections, SlowAndIdleClientsHoldNoThread) {
  server::ServerOptions so;
  so.head_timeout = std::chrono::milliseconds(2000);
  so.idle_timeout = std::chrono::milliseconds(1500);
  Served s(so);
  const size_t threads_before = self_thread_count();
  std::vector<std::unique_ptr<RawConn>> slow, idle;
  for (int i = 0; i < 150; ++i) {
    slow.push_back(std::make_unique<RawConn>(s.port));
    idle.push_back(std::make_unique<RawConn>(s.port));
    ASSERT_GE(slow.back()->fd, 0);
    ASSERT_GE(idle.back()->fd, 0);
    slow.back()->send("GET /health HTTP/1.1\r\n");
  }
  const auto t0 = Clock::now();
  double worst = 0;
  while (since(t0) < 1.2) {  // trickle a byte each 200 ms while asking for /health
    for (auto& c : slow) c->send("X");
    const auto [status, seconds] = health(s.port);
    EXPECT_EQ(status, 200);
    worst = std::max(worst, seconds);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_LT(worst, 1.0) << "/health took " << worst << " s beside 300 slow and idle connections";
  EXPECT_LE(self_thread_count(), threads_before + 1) << "connections took threads";
  // The tricklers get 408 at their head deadline; the idle ones are closed.
  size_t timed_out = 0, closed = 0;
  for (auto& c : slow) {
    const auto rs = parse_responses(c->read(4, 1));
    timed_out += rs.size() == 1 && rs[0].status == 408;
  }
  for (auto& c : idle) closed += c->closed_within(3);
  EXPECT_EQ(timed_out, slow.size());
  EXPECT_EQ(closed, idle.size());
  EXPECT_LT(since(t0), 8.0);
  EXPECT_EQ(health(s.port).first, 200);
}

// --max-queue 40000 made 32,287 threads (one per possible connection); now the queue holds
// requests and the threads are the engine's and a few workers, whatever the queue's size.
TEST(ServerConnections, TheQueueHoldsRequestsNotThreads) {
  const size_t before = self_thread_count();
  {
    Served s({}, 2, 5000);
    EXPECT_LE(self_thread_count(), before + 6) << "threads for a queue of 5000";
    // 40 clients at once on 2 sequences: the rest wait in the queue without a thread each.
    std::vector<std::thread> clients;
    std::atomic<int> ok{0};
    for (int i = 0; i < 40; ++i)
      clients.emplace_back([&] {
        const RawResponse r = raw_exchange(
            s.port, post_json("/v1/completions", R"({"prompt": "The old man", "max_tokens": 4, "stream": true})"), 60);
        ok += r.status == 200 && r.body.find("data: [DONE]") != std::string::npos;
      });
    size_t peak = 0;
    for (int i = 0; i < 20; ++i) {
      peak = std::max(peak, self_thread_count());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (auto& t : clients) t.join();
    EXPECT_EQ(ok.load(), 40);
    EXPECT_LE(peak, before + 6 + 40) << "the server took threads per request (the clients have one each)";
  }
}

// A client that closed a request that does not stream was not noticed: 20 requests of 1,000
// tokens closed at once still generated every token. Now each ends at the engine's next step.
TEST(ServerConnections, AClosedRequestIsCancelledStreamingOrNot) {
  Served s({}, 4, 64, source_dir() / "models" / "demo", 512);
  for (bool stream : {false, true})
    expect_closed_requests_cancelled(
        s, "/v1/completions",
        [&](int i) {
          return json{{"prompt", "The old man walked slowly"}, {"max_tokens", 480}, {"temperature", 0.7}, {"seed", i},
                      {"stream", stream}}
              .dump();
        },
        8, stream ? "streaming" : "not streaming");
}

// On a stop (SIGTERM), an active stream once in ~300 ended without its final chunk and [DONE].
// Now every stream in flight ends with both and the chunked end, in every round.
TEST(ServerConnections, AStopEndsEveryStreamWithItsFinalChunk) {
  for (int round = 0; round < 6; ++round) {
    auto s = std::make_unique<Served>(server::ServerOptions{}, 4, 64, source_dir() / "models" / "demo", 512);
    std::vector<std::unique_ptr<RawConn>> conns;
    for (int i = 0; i < 8; ++i) {
      conns.push_back(std::make_unique<RawConn>(s->port));
      conns.back()->send(post_json("/v1/completions",
                                   json{{"prompt", "The old man"}, {"max_tokens", 400}, {"stream", true}}.dump()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + 60 * round));
    const auto t_stop = Clock::now();
    double stop_seconds = 0;
    std::thread stopper([&] {
      s->http->stop();
      stop_seconds = since(t_stop);
    });
    for (size_t i = 0; i < conns.size(); ++i) {
      const std::string got = conns[i]->read(20);  // to the close
      const auto rs = parse_responses(got, true);
      if (rs.empty()) {  // the stop came before the request was queued: a 503, or nothing yet read
        EXPECT_TRUE(got.empty() || got.find(" 503 ") != std::string::npos) << got;
        continue;
      }
      const RawResponse& r = rs[0];
      if (r.status == 503) continue;
      ASSERT_EQ(r.status, 200) << r.head;
      EXPECT_NE(got.find("\r\n0\r\n\r\n"), std::string::npos) << "round " << round << ": no chunked end";
      EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n")) << "round " << round << ": " << r.body.substr(r.body.size() - std::min<size_t>(r.body.size(), 300));
      // "stop" for a stream the stop ended, "length" for one that reached max_tokens first (a
      // fast machine generates the 400 tokens within the later rounds' wait).
      EXPECT_TRUE(r.body.find("\"finish_reason\":\"stop\"") != std::string::npos ||
                  r.body.find("\"finish_reason\":\"length\"") != std::string::npos)
          << "round " << round << ": no final chunk with a finish_reason";
    }
    stopper.join();
    EXPECT_LT(stop_seconds, 1.5) << "round " << round;
  }
}
