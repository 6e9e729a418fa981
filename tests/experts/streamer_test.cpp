// The expert streamer on real models:
//  - exactness: on every fixture with experts (the decoder families and the hybrids:
//    qwen3_next, qwen3_5_moe, qwen4_exp with QSA and with PLE, whose n-gram rows come from the
//    pack's table file), for caches of top_k, top_k + 1, half and all slots,
//    lookahead off and on, q4 and bf16 experts, every decode step is bit-identical to the
//    fully resident run of the same pack kind, and teacher-forced logits through the
//    streamed prefill (rows grouped so their union fits the cache) stay within 1e-5;
//  - the statistics of those runs are consistent (hits + misses = unique, bytes read =
//    misses x stride, the IO engine's reads = misses + prefetches), the residency's
//    invariants hold and no pin outlives a step;
//  - the host tier answers misses without changing a bit;
//  - errors: too few slots (the message states the minimum), a corrupted record with
//    verification on, EIO (retried once, then an error naming the record), a truncated
//    expert file, a wrong miss kind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "experts/streamer.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

std::vector<int32_t> fixture_ids(const std::string& fixture) {
  FixtureReference ref = read_reference(fixture);
  std::vector<int32_t> ids = ref.prompt_ids;
  ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
  return ids;
}

LoadedModel load(const fs::path& pack, Backend& be, DType kind, std::optional<StreamerOptions> so = std::nullopt) {
  LoadOptions lo;
  lo.expert_kind = kind;
  lo.streaming = std::move(so);
  return load_model(pack, be, lo);
}

// Logits of each token fed one at a time (decode steps), [n][V].
std::vector<std::vector<float>> decode_logits(Model& m, const std::vector<int32_t>& ids) {
  auto state = m.new_state(static_cast<int64_t>(ids.size()));
  const int64_t V = m.info().n_vocab;
  std::vector<std::vector<float>> out;
  for (int32_t id : ids) {
    std::vector<float> l(static_cast<size_t>(V));
    m.forward(std::span<const int32_t>(&id, 1), *state, l, false);
    out.push_back(std::move(l));
  }
  return out;
}

// Teacher-forced logits of one forward pass over all tokens, [n * V].
std::vector<float> prefill_logits(Model& m, const std::vector<int32_t>& ids) {
  auto state = m.new_state(static_cast<int64_t>(ids.size()));
  std::vector<float> l(ids.size() * static_cast<size_t>(m.info().n_vocab));
  m.forward(ids, *state, l, true);
  return l;
}

// The checks every streamed run must pass after it finished.
void expect_consistent(StreamingProvider& st, uint64_t stride, bool host_tier = false) {
  ASSERT_TRUE(st.drain(std::chrono::seconds(10)));
  RunStats r = st.stats();
  for (const std::string& e : r.consistency_errors(stride)) ADD_FAILURE() << e;
  const LayerStats t = r.totals();
  EXPECT_GT(t.routed, 0u);
  EXPECT_EQ(t.hits + t.misses, t.unique);
  EXPECT_EQ(t.bytes_demand, t.misses * stride);
  if (!host_tier) {
    // Every miss and every prefetch was one read of one stride.
    EXPECT_EQ(r.io_reads, t.misses + t.prefetch_requests);
    EXPECT_EQ(r.io_bytes, (t.misses + t.prefetch_requests) * stride);
  } else {
    EXPECT_EQ(r.io_reads + t.host_hits, t.misses + t.prefetch_requests);
  }
  st.residency().check_invariants();
  for (int32_t s = 0; s < st.n_slots(); ++s) EXPECT_EQ(st.residency().pins(s), 0) << "slot " << s;
}

float max_abs(const std::vector<float>& a, const std::vector<float>& b) { return max_abs_diff(a, b); }

}  // namespace

TEST(StreamerExactness, EveryFixtureEveryCacheSize) {
  auto be = make_cpu_backend();
  float worst_prefill = 0;
  int runs = 0;
  for (const std::string& fixture : expert_fixtures()) {
    const fs::path& pack = fixture_pack(fixture);
    const std::vector<int32_t> ids = fixture_ids(fixture);
    for (DType kind : {DType::q4, DType::bf16}) {
      LoadedModel resident = load(pack, *be, kind);
      const auto want_decode = decode_logits(*resident.model, ids);
      const auto want_prefill = prefill_logits(*resident.model, ids);
      const int32_t k = static_cast<int32_t>(resident.model->info().n_expert_used);
      std::shared_ptr<Pack> p = Pack::open(pack, false);
      const int32_t all = static_cast<int32_t>(p->manifest().n_records());
      const uint64_t stride = p->kind(kind).record_stride;
      for (int32_t slots : {k, k + 1, std::max(k, all / 2), all}) {
        for (bool lookahead : {false, true}) {
          SCOPED_TRACE(str(fixture, " ", expert_kind_name(kind), " slots ", slots, " lookahead ", lookahead));
          StreamerOptions so;
          so.slots = slots;
          so.lookahead = lookahead;
          LoadedModel m = load(pack, *be, kind, so);
          ASSERT_TRUE(m.streamer);
          EXPECT_EQ(m.streamer->n_slots(), slots);
          const auto got = decode_logits(*m.model, ids);
          ASSERT_EQ(got.size(), want_decode.size());
          for (size_t t = 0; t < got.size(); ++t)
            ASSERT_EQ(std::memcmp(got[t].data(), want_decode[t].data(), got[t].size() * sizeof(float)), 0)
                << "decode step " << t << " differs from the resident run (max |diff| "
                << max_abs(got[t], want_decode[t]) << ")";
          const auto pre = prefill_logits(*m.model, ids);
          const float diff = max_abs(pre, want_prefill);
          EXPECT_LE(diff, 1e-5f) << "teacher-forced logits through the streamed prefill";
          worst_prefill = std::max(worst_prefill, diff);
          expect_consistent(*m.streamer, stride);
          if (lookahead && slots > k + 1) {
            const LayerStats t = m.streamer->stats().totals();
            EXPECT_GT(t.prefetch_requests + t.prefetch_already, 0u) << "lookahead predicted nothing";
          }
          ++runs;
        }
      }
    }
  }
  std::printf("streamer exactness: %d streamed runs; decode bit-identical; prefill max |diff| %g\n", runs,
              static_cast<double>(worst_prefill));
}

// Every online policy (markov among them) through the smallest caches, where it decides
// every step, with lookahead's predictions reaching it or not: decode bit-identical to the
// resident run, since what the cache holds never changes the result.
TEST(StreamerExactness, EveryPolicy) {
  auto be = make_cpu_backend();
  const std::string fixture = expert_fixtures().front();
  const fs::path& pack = fixture_pack(fixture);
  const std::vector<int32_t> ids = fixture_ids(fixture);
  LoadedModel resident = load(pack, *be, DType::q4);
  const auto want = decode_logits(*resident.model, ids);
  const auto k = static_cast<int32_t>(resident.model->info().n_expert_used);
  const uint64_t stride = Pack::open(pack, false)->kind(DType::q4).record_stride;
  for (PolicyKind policy : online_policies())
    for (int32_t slots : {k, k + 2})
      for (bool lookahead : {false, true}) {
        SCOPED_TRACE(str(fixture, " ", policy_name(policy), " slots ", slots, " lookahead ", lookahead));
        StreamerOptions so;
        so.slots = slots;
        so.lookahead = lookahead;
        so.policy = policy;
        LoadedModel m = load(pack, *be, DType::q4, so);
        const auto got = decode_logits(*m.model, ids);
        ASSERT_EQ(got.size(), want.size());
        for (size_t t = 0; t < got.size(); ++t)
          ASSERT_EQ(std::memcmp(got[t].data(), want[t].data(), got[t].size() * sizeof(float)), 0)
              << "decode step " << t << " differs from the resident run";
        expect_consistent(*m.streamer, stride);
      }
}

TEST(StreamerStats, CountsOfADecodeRun) {
  // One token per step and a cache of top_k slots: every step's union is exactly top_k.
  auto be = make_cpu_backend();
  const fs::path& pack = fixture_pack("qwen3_moe");
  const std::vector<int32_t> ids = fixture_ids("qwen3_moe");
  StreamerOptions so;
  so.slots = 2;
  LoadedModel m = load(pack, *be, DType::q4, so);
  decode_logits(*m.model, ids);
  ASSERT_TRUE(m.streamer->drain(std::chrono::seconds(10)));
  RunStats r = m.streamer->stats();
  ASSERT_EQ(r.layers.size(), 2u);
  for (const LayerStats& l : r.layers) {
    EXPECT_EQ(l.steps, ids.size());
    EXPECT_EQ(l.routed, ids.size() * 2);
    EXPECT_EQ(l.unique, ids.size() * 2);
    EXPECT_EQ(l.hits + l.misses, l.unique);
    EXPECT_GT(l.misses, 0u);
    EXPECT_EQ(l.prefetch_requests, 0u);
    EXPECT_EQ(l.cut, 0u);
  }
  EXPECT_EQ(r.slots, 2);
  EXPECT_EQ(r.kind, "q4");
  EXPECT_EQ(r.policy, "markov");
  EXPECT_EQ(r.io_mode, "direct");
  EXPECT_TRUE(r.consistency_errors(r.slot_bytes).empty());
  // reset_stats starts a new window.
  m.streamer->reset_stats();
  EXPECT_EQ(m.streamer->stats().totals().unique, 0u);
  EXPECT_EQ(m.streamer->stats().io_reads, 0u);
}

TEST(StreamerStats, HostTierAnswersMissesExactly) {
  auto be = make_cpu_backend();
  const fs::path& pack = fixture_pack("mixtral");
  const std::vector<int32_t> ids = fixture_ids("mixtral");
  LoadedModel resident = load(pack, *be, DType::bf16);
  const auto want = decode_logits(*resident.model, ids);
  StreamerOptions so;
  so.slots = 2;
  so.host_cache_bytes = uint64_t{1} << 20;  // every record of the fixture
  LoadedModel m = load(pack, *be, DType::bf16, so);
  const auto got = decode_logits(*m.model, ids);
  for (size_t t = 0; t < got.size(); ++t)
    ASSERT_EQ(std::memcmp(got[t].data(), want[t].data(), got[t].size() * sizeof(float)), 0) << "step " << t;
  const uint64_t stride = Pack::open(pack, false)->kind(DType::bf16).record_stride;
  expect_consistent(*m.streamer, stride, true);
  const LayerStats t = m.streamer->stats().totals();
  EXPECT_GT(t.host_hits, 0u) << "the host tier answered no miss";
  EXPECT_GT(m.streamer->stats().host_cache_bytes, 0u);
}

TEST(StreamerStats, IoThroughThePageCacheToo) {
  auto be = make_cpu_backend();
  const fs::path& pack = fixture_pack("olmoe");
  const std::vector<int32_t> ids = fixture_ids("olmoe");
  LoadedModel resident = load(pack, *be, DType::q8);
  const auto want = decode_logits(*resident.model, ids);
  StreamerOptions so;
  so.slots = 3;
  so.io_mode = IoMode::buffered;
  so.io_depth = 1;
  so.policy = PolicyKind::lru;
  so.verify_reads = true;
  LoadedModel m = load(pack, *be, DType::q8, so);
  const auto got = decode_logits(*m.model, ids);
  for (size_t t = 0; t < got.size(); ++t)
    ASSERT_EQ(std::memcmp(got[t].data(), want[t].data(), got[t].size() * sizeof(float)), 0) << "step " << t;
  EXPECT_EQ(m.streamer->stats().io_mode, "buffered");
  expect_consistent(*m.streamer, Pack::open(pack, false)->kind(DType::q8).record_stride);
}

TEST(StreamerStats, EverythingAtOnceStaysConsistent) {
  // Deadline, low-bit copies, lookahead, host tier and verification together, real timing:
  // the results may differ from the resident run (cuts), the books may not.
  auto be = make_cpu_backend();
  const fs::path& pack = fixture_pack("qwen3_moe");
  const std::vector<int32_t> ids = fixture_ids("qwen3_moe");
  std::shared_ptr<Pack> p = Pack::open(pack, false);
  for (bool worst : {false, true}) {
    SCOPED_TRACE(worst ? "worst case" : "real timing");
    StreamerOptions so;
    so.slots = 5;
    so.cut = 0.6;
    so.miss_kind = DType::q2;
    so.lookahead = true;
    so.host_cache_bytes = 64 << 10;
    so.verify_reads = true;
    so.deadline_worst_case = worst;
    LoadedModel m = load(pack, *be, DType::q4, so);
    decode_logits(*m.model, ids);
    prefill_logits(*m.model, ids);
    ASSERT_TRUE(m.streamer->drain(std::chrono::seconds(10)));
    const RunStats r = m.streamer->stats();
    for (const std::string& e : r.consistency_errors(p->kind(DType::q4).record_stride,
                                                      p->kind(DType::q2).record_stride))
      ADD_FAILURE() << e;
    const LayerStats t = r.totals();
    // Every read is a miss, a prediction or a low-bit copy the host tier did not answer.
    EXPECT_LE(r.io_reads + t.host_hits, t.misses + t.prefetch_requests + t.low_bit_reads);
    EXPECT_GT(r.io_reads, 0u);
    if (worst) {
      EXPECT_GT(t.cut, 0u);
      EXPECT_GT(t.low_bit, 0u);
    }
    m.streamer->residency().check_invariants();
    for (int32_t s = 0; s < m.streamer->n_slots(); ++s) EXPECT_EQ(m.streamer->residency().pins(s), 0);
  }
}

// The relative cut (--profile fast) is the absolute cut at weight share / k where the router
// renormalizes its top-k (the same cuts, the same bits), and never cuts a top-1 token's only
// expert, whatever the share asked for.
TEST(StreamerDeadline, RelativeCutIsTheAbsoluteCutOverTopK) {
  auto be = make_cpu_backend();
  auto run = [&](const char* fixture, double cut, double share) {
    StreamerOptions so;
    so.slots = fixture == std::string("llama4") ? 1 : 2;
    so.cut = cut;
    so.cut_share = share;
    so.deadline_worst_case = true;
    LoadedModel m = load(fixture_pack(fixture), *be, DType::q4, so);
    auto logits = decode_logits(*m.model, fixture_ids(fixture));
    return std::make_pair(std::move(logits), m.streamer->stats().totals().cut);
  };
  const auto [abs_logits, abs_cut] = run("qwen3_moe", 0.2, 0);  // top-2, renormalized
  const auto [rel_logits, rel_cut] = run("qwen3_moe", 0, 0.4);
  EXPECT_GT(abs_cut, 0u);
  EXPECT_EQ(rel_cut, abs_cut);
  ASSERT_EQ(rel_logits.size(), abs_logits.size());
  for (size_t t = 0; t < abs_logits.size(); ++t)
    ASSERT_EQ(std::memcmp(rel_logits[t].data(), abs_logits[t].data(), abs_logits[t].size() * sizeof(float)), 0)
        << "step " << t;

  LoadedModel resident = load(fixture_pack("llama4"), *be, DType::q4);
  const auto want = decode_logits(*resident.model, fixture_ids("llama4"));
  const auto [one_logits, one_cut] = run("llama4", 0, 1.0);  // top-1
  EXPECT_EQ(one_cut, 0u);
  for (size_t t = 0; t < want.size(); ++t)
    ASSERT_EQ(std::memcmp(one_logits[t].data(), want[t].data(), want[t].size() * sizeof(float)), 0) << "step " << t;
}

// ---- errors ----

TEST(StreamerErrors, TooFewSlotsStatesTheMinimum) {
  auto be = make_cpu_backend();
  const fs::path& pack = fixture_pack("qwen3_moe_yarn");  // top-3
  for (int32_t slots : {1, 2}) {
    StreamerOptions so;
    so.slots = slots;
    try {
      load(pack, *be, DType::q4, so);
      FAIL() << "a cache of " << slots << " slots loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("the minimum is 3 slots"), std::string::npos) << e.what();
    }
  }
  StreamerOptions so;
  so.cache_bytes = 4096;  // bytes: one slot's worth at most
  try {
    load(pack, *be, DType::q4, so);
    FAIL() << "a 4 KiB cache loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the minimum is 3 slots (--expert-slots 3 or --expert-cache"), std::string::npos)
        << e.what();
  }
  so.cache_bytes = 0;
  so.slots = 3;
  EXPECT_NO_THROW(load(pack, *be, DType::q4, so));
}

TEST(StreamerErrors, BadOptions) {
  auto be = make_cpu_backend();
  const fs::path& pack = fixture_pack("qwen3_moe");
  StreamerOptions so;
  so.slots = 4;
  so.miss_kind = DType::q4;
  EXPECT_THROW(load(pack, *be, DType::q4, so), Error);  // the same kind
  so.miss_kind.reset();
  so.cut = 1.5;
  EXPECT_THROW(load(pack, *be, DType::q4, so), Error);
  so.cut = 0;
  so.host_cache_bytes = 100;  // less than one record
  EXPECT_THROW(load(pack, *be, DType::q4, so), Error);
  // Streaming needs a pack.
  so.host_cache_bytes = 0;
  EXPECT_THROW(load_model(fixture_dir("qwen3_moe"), *be, LoadOptions{std::nullopt, so}), Error);
}

namespace {

// A private copy of a fixture pack (its files may be damaged).
fs::path copy_pack(const std::string& fixture, const std::string& name) {
  fs::path dir = pack_test_dir(name);
  fs::remove_all(dir);
  fs::copy(fixture_pack(fixture), dir, fs::copy_options::recursive);
  return dir;
}

// The first expert the first MoE layer routes the first token to.
int32_t first_routed_expert(const fs::path& pack, const std::vector<int32_t>& ids) {
  auto be = make_cpu_backend();
  LoadedModel m = load(pack, *be, DType::q4);
  int32_t first = -1;
  m.model->set_routing_observer([&](const RoutingEvent& ev) {
    if (first < 0) first = ev.routing->ids[0];
  });
  decode_logits(*m.model, {ids[0]});
  return first;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(StreamerErrors, CorruptRecordNamedWhenVerifying) {
  const std::vector<int32_t> ids = fixture_ids("qwen3_moe");
  const fs::path dir = copy_pack("qwen3_moe", "corrupt");
  const int32_t e = first_routed_expert(dir, ids);
  ASSERT_GE(e, 0);
  {
    std::shared_ptr<Pack> p = Pack::open(dir, false);
    const uint64_t off = p->record_offset(DType::q4, p->record_id(0, e)) + 100;
    std::fstream f(dir / p->kind(DType::q4).file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(off));
    f.put('\x5a');
  }
  auto be = make_cpu_backend();
  StreamerOptions so;
  so.slots = 2;
  so.verify_reads = true;
  LoadedModel m = load(dir, *be, DType::q4, so);
  const int64_t layer = Pack::open(dir, false)->manifest().moe_layers[0];
  const std::string err = error_of([&] { decode_logits(*m.model, ids); });
  EXPECT_NE(err.find(str("layer ", layer, ", expert ", e, ", kind q4")), std::string::npos) << err;
  EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << err;
  // Without verification the read is used as it is.
  so.verify_reads = false;
  LoadedModel unverified = load(dir, *be, DType::q4, so);
  EXPECT_NO_THROW(decode_logits(*unverified.model, ids));
}

TEST(StreamerErrors, EioRetriedOnceThenNamed) {
  const std::vector<int32_t> ids = fixture_ids("mixtral");
  const fs::path& pack = fixture_pack("mixtral");
  const int32_t e = first_routed_expert(pack, ids);
  auto be = make_cpu_backend();
  LoadedModel resident = load(pack, *be, DType::q4);
  const auto want = decode_logits(*resident.model, ids);
  // One EIO on every read of the record: the retry succeeds and nothing changes.
  {
    // Reads of one record never overlap (one slot per record), so the answers alternate:
    // the first of each read fails, its retry succeeds.
    std::atomic<int> injected{0};
    std::atomic<bool> fail_next{true};
    StreamerOptions so;
    so.slots = 2;
    so.io_fault_injection = [&](int64_t record, int64_t res) -> int64_t {
      if (record != e) return res;
      const bool fail = fail_next.load();
      fail_next = !fail;
      if (fail) {
        ++injected;
        return -EIO;
      }
      return res;
    };
    LoadedModel m = load(pack, *be, DType::q4, so);
    const auto got = decode_logits(*m.model, ids);
    EXPECT_GT(injected.load(), 0);
    for (size_t t = 0; t < got.size(); ++t)
      ASSERT_EQ(std::memcmp(got[t].data(), want[t].data(), got[t].size() * sizeof(float)), 0) << "step " << t;
  }
  // EIO every time: an error naming the record, no hang.
  StreamerOptions so;
  so.slots = 2;
  so.io_fault_injection = [&](int64_t record, int64_t res) -> int64_t { return record == e ? -EIO : res; };
  LoadedModel m = load(pack, *be, DType::q4, so);
  const std::string err = error_of([&] { decode_logits(*m.model, ids); });
  EXPECT_NE(err.find(str("layer 0, expert ", e, ", kind q4")), std::string::npos) << err;
  EXPECT_NE(err.find("EIO"), std::string::npos) << err;
}

TEST(StreamerErrors, TruncatedExpertFileIsAShortRead) {
  const std::vector<int32_t> ids = fixture_ids("olmoe");
  const fs::path dir = copy_pack("olmoe", "truncated");
  auto be = make_cpu_backend();
  StreamerOptions so;
  so.slots = 2;
  LoadedModel m = load(dir, *be, DType::q4, so);
  // The pack was fine when it opened; its expert file loses every record afterwards.
  fs::resize_file(dir / Pack::open(dir, false)->kind(DType::q4).file, kPackHeaderBytes);
  const std::string err = error_of([&] { decode_logits(*m.model, ids); });
  EXPECT_NE(err.find("kind q4"), std::string::npos) << err;
  EXPECT_NE(err.find("short read"), std::string::npos) << err;
}

// The hook itself, on every family: the shared decoders hand each MoE layer's routing to the
// provider with the layer's index among the MoE layers and the next MoE layer's router.
namespace {

struct RecordingProvider : ExpertProvider {
  std::vector<int64_t> layers;
  std::vector<bool> has_next;
  int64_t rows = 0, cols = 0, k = 0;
  void moe(Backend& be, const MoeLayerCall& c) override {
    layers.push_back(c.moe_layer);
    has_next.push_back(!c.next_router.empty());
    rows = c.h.rows();
    cols = c.h.cols();
    k = c.routing->k;
    EXPECT_EQ(c.out.rows(), c.h.rows());
    EXPECT_EQ(c.routing->n_rows, c.h.rows());
    EXPECT_EQ(c.router->n_expert_used, c.routing->k);
    if (!c.next_router.empty()) {
      EXPECT_EQ(c.next_router.shape[1], c.h.cols());
    }
    be.fill(c.out, 0.0f);
  }
};

}  // namespace

TEST(ExpertProviderHook, EveryFamilyRoutesThroughIt) {
  auto be = make_cpu_backend();
  for (const std::string& fixture : model_fixtures()) {
    SCOPED_TRACE(fixture);
    LoadedModel m = load_model(fixture_dir(fixture), *be);
    const ModelInfo& info = m.model->info();
    if (info.moe_layers.empty()) continue;  // a dense family
    EXPECT_GT(info.n_expert_used, 0);
    auto provider = std::make_shared<RecordingProvider>();
    m.model->set_expert_provider(provider);
    const std::vector<int32_t> ids = {1, 2, 3};
    auto state = m.model->new_state(3);
    std::vector<float> logits(3 * static_cast<size_t>(info.n_vocab));
    m.model->forward(ids, *state, logits, true);
    const size_t n = info.moe_layers.size();
    ASSERT_EQ(provider->layers.size(), n);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(provider->layers[i], static_cast<int64_t>(i));
      EXPECT_EQ(provider->has_next[i], i + 1 < n) << "MoE layer " << i;
    }
    EXPECT_EQ(provider->rows, 3);
    EXPECT_EQ(provider->cols, info.n_embd);
    EXPECT_EQ(provider->k, info.n_expert_used);
  }
}

// Issue 14: the streamed prefill in union-bounded sub-batches, in one bank and pipelined in two
// banks where the cache holds two unions, at every cache size from top_k to 2 top_k + 1, half
// and all: the teacher-forced logits equal the resident run's bit for bit, the prompt is long
// enough that sub-batches split, and two banks (reads of sub-batch i+1 issued while i
// computes) run without a stall, with lookahead's speculative share beside them or without.
TEST(StreamerPrefill, SubBatchesExactAtEveryCacheSize) {
  auto be = make_cpu_backend();
  int runs = 0, split_runs = 0, pipelined_runs = 0;
  for (const std::string& fixture : expert_fixtures()) {
    const fs::path& pack = fixture_pack(fixture);
    // The fixture's tokens three times: every sub-batch of a small cache holds a few rows.
    std::vector<int32_t> ids;
    for (int rep = 0; rep < 3; ++rep) {
      const std::vector<int32_t> f = fixture_ids(fixture);
      ids.insert(ids.end(), f.begin(), f.end());
    }
    LoadedModel resident = load(pack, *be, DType::q4);
    const int64_t n_ctx_max = resident.model->info().n_ctx_train;
    if (n_ctx_max > 0 && static_cast<int64_t>(ids.size()) > n_ctx_max) ids.resize(static_cast<size_t>(n_ctx_max));
    const auto want = prefill_logits(*resident.model, ids);
    const int32_t k = static_cast<int32_t>(resident.model->info().n_expert_used);
    std::shared_ptr<Pack> p = Pack::open(pack, false);
    const int32_t all = static_cast<int32_t>(p->manifest().n_records());
    std::vector<int32_t> sizes;
    for (int32_t s = k; s <= 2 * k + 1; ++s) sizes.push_back(s);
    sizes.push_back(std::max(k, all / 2));
    sizes.push_back(all);
    for (int32_t slots : sizes)
    for (int banks : {1, 2})
    for (bool lookahead : {false, true}) {
      SCOPED_TRACE(str(fixture, " slots ", slots, " of ", all, ", top-k ", k, ", ", ids.size(), " tokens, ", banks,
                       " bank(s), lookahead ", lookahead));
      StreamerOptions so;
      so.slots = slots;
      so.lookahead = lookahead;
      so.prefill_banks = banks;
      LoadedModel m = load(pack, *be, DType::q4, so);
      const auto got = prefill_logits(*m.model, ids);
      ASSERT_EQ(got.size(), want.size());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << "streamed prefill differs from the resident run (max |diff| " << max_abs(got, want) << ")";
      expect_consistent(*m.streamer, p->kind(DType::q4).record_stride);
      const RunStats r = m.streamer->stats();
      EXPECT_EQ(r.prefill.rows, ids.size() * r.layers.size()) << "every prompt token in a sub-batch of every layer";
      EXPECT_EQ(r.decode.steps, 0u);
      if (r.prefill.steps > r.layers.size()) ++split_runs;
      if (r.prefill.overlapped > 0) ++pipelined_runs;
      if (slots < 2 * k || banks == 1) {
        EXPECT_EQ(r.prefill.overlapped, 0u) << "one bank below 2 x top_k slots, or when asked";
      }
      if (slots == k) {
        EXPECT_GT(r.prefill.steps, r.layers.size()) << "a cache of top_k slots must split the prompt";
      }
      if (banks == 2 && slots >= 2 * k && r.prefill.steps > r.layers.size()) {
        EXPECT_GT(r.prefill.overlapped, 0u) << "a split prefill at " << slots << " >= 2 x top_k slots runs two banks";
      }
      ++runs;
    }
  }
  EXPECT_GT(split_runs, 0);
  EXPECT_GT(pipelined_runs, 0);
  std::printf("streamed prefill: %d runs bit-identical to the resident run, %d split into sub-batches, %d pipelined\n",
              runs, split_runs, pipelined_runs);
}
