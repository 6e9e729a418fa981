// RunStats: totals, the JSON document (every DESIGN.md figure present, written atomically and
// read back), the summary line, and the consistency checks catching each broken convention.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "experts/stats.h"

namespace fs = std::filesystem;
using namespace sluice;

namespace {

RunStats sample() {
  RunStats r;
  r.layers.resize(2);
  for (int i = 0; i < 2; ++i) {
    LayerStats& l = r.layers[i];
    l.steps = 10;
    l.routed = 40;
    l.unique = 30;
    l.hits = 20 + i;
    l.pending_hits = 2;
    l.misses = 10 - i;
    l.bytes_demand = l.misses * 8192;
    l.prefetch_requests = 4;
    l.bytes_prefetch = 4 * 8192;
    l.prefetch_already = 3;
    l.prefetch_hits = 2;
    l.cut = 1;
    l.low_bit = 1;
    l.demand_wait_seconds = 0.5;
    l.service_wall_seconds = 0.25;
    l.service_cpu_seconds = 0.125;
  }
  r.decode_tokens = 10;
  r.decode_seconds = 2;
  r.prefill_tokens = 5;
  r.prefill_seconds = 0.5;
  r.cache_bytes = 80 << 20;
  r.slots = 80;
  r.slot_bytes = 1 << 20;
  r.policy = "lrfu";
  r.kind = "bf16";
  r.io_mode = "direct";
  r.io_uring = true;
  r.io_depth = 8;
  r.io_reads = 27;
  r.io_bytes = 27 * 8192;
  r.io_busy_seconds = 0.001;
  return r;
}

}  // namespace

TEST(Stats, TotalsAndRates) {
  RunStats r = sample();
  LayerStats t = r.totals();
  EXPECT_EQ(t.unique, 60u);
  EXPECT_EQ(t.hits, 41u);
  EXPECT_EQ(t.misses, 19u);
  EXPECT_DOUBLE_EQ(r.hit_rate(), 41.0 / 60.0);
  EXPECT_DOUBLE_EQ(r.decode_tokens_per_second(), 5.0);
  EXPECT_DOUBLE_EQ(r.prefill_tokens_per_second(), 10.0);
  EXPECT_DOUBLE_EQ(r.read_bytes_per_second(), 27 * 8192 / 0.001);
  EXPECT_TRUE(r.consistency_errors(8192).empty());
  EXPECT_EQ(r.summary(), "decode 5.00 tok/s | expert cache 80.0 MiB (80 slots, lrfu) | hit rate 0.683 | read 0.00 GB at 0.22 GB/s");
}

TEST(Stats, JsonHasEveryFigure) {
  RunStats r = sample();
  fs::path p = fs::temp_directory_path() / ("sluice-stats-test-" + std::to_string(::getpid()) + ".json");
  r.write_json(p);
  std::ifstream f(p);
  nlohmann::json j = nlohmann::json::parse(f);
  fs::remove(p);
  ASSERT_EQ(j["layers"].size(), 2u);
  for (const char* k : {"routed", "unique", "hits", "misses", "bytes_read_demand", "bytes_read_prefetch",
                        "prefetch_requests", "prefetch_already_resident", "prefetch_hits", "cut", "demand_wait_seconds",
                        "prefetch_wait_seconds", "service_wall_seconds", "service_cpu_seconds"})
    EXPECT_TRUE(j["layers"][1].contains(k)) << k;
  EXPECT_EQ(j["layers"][1]["moe_layer"], 1);
  EXPECT_EQ(j["layers"][1]["misses"], 9);
  const auto& run = j["run"];
  for (const char* k : {"prefill_tokens", "prefill_tokens_per_second", "decode_tokens", "decode_tokens_per_second",
                        "read_bytes_per_second", "hit_rate"})
    EXPECT_TRUE(run.contains(k)) << k;
  EXPECT_EQ(run["cache"]["policy"], "lrfu");
  EXPECT_EQ(run["cache"]["slots"], 80);
  EXPECT_EQ(run["io"]["mode"], "direct");
  EXPECT_TRUE(run["options"]["cut"].is_null());
  EXPECT_EQ(run["totals"]["hits"], 41);
  EXPECT_DOUBLE_EQ(run["decode_tokens_per_second"].get<double>(), 5.0);
}

TEST(Stats, ConsistencyChecksCatchEachViolation) {
  auto broken = [](auto&& edit, uint64_t stride = 8192) {
    RunStats r = sample();
    edit(r);
    return r.consistency_errors(stride);
  };
  EXPECT_EQ(broken([](RunStats& r) { r.layers[0].hits += 1; }).size(), 1u);           // hits + misses != unique
  EXPECT_EQ(broken([](RunStats& r) { r.layers[1].bytes_demand += 1; }).size(), 1u);   // bytes != misses x stride
  EXPECT_TRUE(broken([](RunStats& r) { r.layers[1].bytes_demand += 1; }, 0).empty()); // stride unknown: not checked
  EXPECT_EQ(broken([](RunStats& r) { r.layers[0].low_bit = 2; }).size(), 1u);
  EXPECT_EQ(broken([](RunStats& r) { r.io_bytes = 1 << 30; }).size(), 1u);
  std::vector<std::string> e = broken([](RunStats& r) {
    r.layers[1].unique = 100;
    r.layers[1].hits = 90;
    r.layers[1].misses = 10;
    r.layers[1].bytes_demand = 10 * 8192;
  });
  ASSERT_EQ(e.size(), 1u);
  EXPECT_NE(e[0].find("moe layer 1: unique 100 > routed 40"), std::string::npos) << e[0];
}

TEST(Stats, ThreadCpuTimeAdvances) {
  const double t0 = thread_cpu_seconds();
  volatile double x = 0;
  for (int i = 0; i < 2000000; ++i) x = x + i * 1e-9;
  EXPECT_GT(thread_cpu_seconds(), t0);
}
