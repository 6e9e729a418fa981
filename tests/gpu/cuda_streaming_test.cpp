// Expert streaming on the GPU (backends/cuda/cuda_streamer.h), against the CPU backend's
// streaming of the same pack as the oracle:
//  - every decoder fixture, q4 experts, caches of top_k, top_k + 1, half and all slots,
//    lookahead off and on: the device makes the same routing decisions as the CPU (ids equal,
//    weights within 1e-5), teacher-forced logits (decode steps through the handshake, the
//    prefill through the handshake or the grouped path) within 1e-3 of the CPU's, the same
//    greedy continuation, consistent statistics and no pin left after a forward;
//  - a prefill on the grouped path (its union beyond the cache) gives the resident prefill's
//    logits bit for bit;
//  - the fixtures saved in bf16 (qwen3_moe_yarn, olmoe) streamed at the bf16 kind give
//    transformers' logits within 1e-3 (f32 activations, reordered sums);
//  - a host tier, blocking waits, --miss-kind with the worst-case deadline, and
//    --fake-experts run to the end (the last with the slots' bytes as they are);
//  - errors: a corrupted record (verification on) is an error naming the record, raised on
//    the model thread within seconds (no hang), and the streamer stays failed; tables the
//    host publishes after the wait timeout are an error naming the layer (the device's own
//    wait gives up), not a hang or a silent answer; a cache below top_k slots is a start-up
//    error that states the minimum.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "tests/gpu/cuda_family_checks.h"
#include "backends/cuda/moe_kernels.h"
#include "core/router_scoring.h"
#include "core/switches.h"
#include "experts/cuda/cuda_streamer.h"
#include "engine/generator.h"
#include "experts/streamer.h"
#include "format/npy.h"
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

LoadedModel load(const fs::path& pack, Backend& be, DType kind, std::optional<StreamerOptions> so) {
  LoadOptions lo;
  lo.expert_kind = kind;
  lo.streaming = std::move(so);
  return load_model(pack, be, lo);
}

// Routing decisions in the order they were made: (model layer, ids, weights).
struct Decisions {
  std::vector<int64_t> layers;
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> weights;
  void add(const RoutingEvent& ev) {
    layers.push_back(ev.layer);
    ids.push_back(ev.routing->ids);
    weights.push_back(ev.routing->weights);
  }
};

void observe(LoadedModel& m, Decisions& d) {
  if (auto* cs = dynamic_cast<CudaStreamer*>(m.streamer.get()))
    cs->set_routing_observer([&d](const RoutingEvent& ev) { d.add(ev); });
  else
    m.model->set_routing_observer([&d](const RoutingEvent& ev) { d.add(ev); });
}

// Decode steps one token at a time, then one teacher-forced forward over all tokens; the
// logits of both, [n * V] each.
std::pair<std::vector<float>, std::vector<float>> run_logits(Model& m, const std::vector<int32_t>& ids) {
  const int64_t V = m.info().n_vocab;
  std::vector<float> decode;
  {
    auto state = m.new_state(static_cast<int64_t>(ids.size()));
    for (int32_t id : ids) {
      std::vector<float> l(static_cast<size_t>(V));
      m.forward(std::span<const int32_t>(&id, 1), *state, l, false);
      decode.insert(decode.end(), l.begin(), l.end());
    }
  }
  std::vector<float> prefill(ids.size() * static_cast<size_t>(V));
  auto state = m.new_state(static_cast<int64_t>(ids.size()));
  m.forward(ids, *state, prefill, true);
  return {decode, prefill};
}

void expect_consistent(StreamingProvider& st, uint64_t stride, bool host_tier) {
  ASSERT_TRUE(st.drain(std::chrono::seconds(10)));
  const RunStats r = st.stats();
  for (const std::string& e : r.consistency_errors(stride)) ADD_FAILURE() << e;
  const LayerStats t = r.totals();
  EXPECT_GT(t.routed, 0u);
  EXPECT_EQ(t.hits + t.misses, t.unique);
  if (!host_tier) {
    EXPECT_EQ(r.io_reads, t.misses + t.prefetch_requests);
  } else {
    EXPECT_LE(r.io_reads, t.misses + t.prefetch_requests);
  }
  EXPECT_GT(r.h2d_bytes, 0u);
  st.residency().check_invariants();
  for (int32_t s = 0; s < st.n_slots(); ++s) EXPECT_EQ(st.residency().pins(s), 0) << "slot " << s;
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

// Streams every fixture of `fixtures` from its q4 pack on the GPU and on the CPU with caches
// of k, k + 1, half and all slots, lookahead off and on: the same routing decisions, the
// same greedy tokens, logits within 1e-3 (families the device kernels do not compute are
// routed on the host and take the streamer's host-routed path). Returns the largest logit
// difference.
float expect_same_as_the_cpu(const std::vector<std::string>& fixtures, int& runs) {
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  float worst = 0;
  for (const std::string& fixture : fixtures) {
    const fs::path& pack = fixture_pack(fixture);
    const std::vector<int32_t> ids = fixture_ids(fixture);
    const std::vector<int32_t> prompt = read_reference(fixture).prompt_ids;
    std::shared_ptr<Pack> p = Pack::open(pack, false);
    const int32_t all = static_cast<int32_t>(p->manifest().n_records());
    const uint64_t stride = p->kind(DType::q4).record_stride;
    const int32_t k = static_cast<int32_t>(load(pack, *cpu, DType::q4, std::nullopt).model->info().n_expert_used);
    for (int32_t slots : {k, k + 1, std::max(k, all / 2), all}) {
      for (bool lookahead : {false, true}) {
        SCOPED_TRACE(str(fixture, " slots ", slots, " lookahead ", lookahead));
        StreamerOptions so;
        so.slots = slots;
        so.lookahead = lookahead;
        so.wait_timeout = std::chrono::seconds(10);
        LoadedModel mc = load(pack, *cpu, DType::q4, so);
        LoadedModel mg = load(pack, *gpu, DType::q4, so);
        EXPECT_TRUE(dynamic_cast<CudaStreamer*>(mg.streamer.get()));
        // Plain SwiGLU experts without biases route on the device; so do every family's (gpt-oss's
        // biases included) but with SLUICE_CUDA_HOST_ROUTED=1.
        EXPECT_EQ(mg.model->expert_provider()->routes_on_device(ExpertMath{}, RouterSpec{}),
                  !p->kind(DType::q4).has_biases() || !switches::on(Switch::cuda_host_routed));
        ExpertMath clamped;
        clamped.activation = ExpertActivation::swiglu_clamped;
        EXPECT_EQ(mg.model->expert_provider()->routes_on_device(clamped, RouterSpec{}),
                  !switches::on(Switch::cuda_host_routed));
        Decisions dc, dg;
        observe(mc, dc);
        observe(mg, dg);
        const auto [cd, cp] = run_logits(*mc.model, ids);
        const auto [gd, gp] = run_logits(*mg.model, ids);
        EXPECT_EQ(dg.ids.size(), dc.ids.size()) << "routing decisions";
        for (size_t i = 0; i < std::min(dc.ids.size(), dg.ids.size()); ++i) {
          if (dg.layers[i] != dc.layers[i] || dg.ids[i] != dc.ids[i]) {
            ADD_FAILURE() << "decision " << i << " (layer " << dc.layers[i] << ") differs";
            break;
          }
          EXPECT_LE(max_abs_diff(dg.weights[i], dc.weights[i]), 1e-5f) << "decision " << i;
        }
        const float d1 = max_abs_diff(gd, cd), d2 = max_abs_diff(gp, cp);
        EXPECT_LE(d1, 1e-3f) << "decode logits";
        EXPECT_LE(d2, 1e-3f) << "teacher-forced logits";
        worst = std::max({worst, d1, d2});
        EXPECT_EQ(greedy(*mg.model, prompt, 8), greedy(*mc.model, prompt, 8));
        expect_consistent(*mg.streamer, stride, false);
        if (lookahead && slots > k + 1) {
          const LayerStats t = mg.streamer->stats().totals();
          EXPECT_GT(t.prefetch_requests + t.prefetch_already, 0u) << "lookahead predicted nothing";
        }
        ++runs;
      }
    }
  }
  return worst;
}

TEST(CudaStreaming, SameRoutingAndTokensAsTheCpu) {
  int runs = 0;
  const float worst = expect_same_as_the_cpu(decoder_fixtures(), runs);
  std::printf("cuda streaming: %d runs; routing equal to the CPU's; logits max |gpu - cpu| %.3g\n", runs,
              static_cast<double>(worst));
}

// gpt-oss (biases, clamped SwiGLU, a router bias, sliding layers), Llama 4 (input-scaled
// experts, sigmoid top-1 and top-2, a shared expert, dense layers between MoE layers) and
// Gemma 4 (GeGLU experts with per-expert scales beside the MLP, PLE, KV sharing): routed on the
// host, their experts computed by the backend's ops on the slots (host_routed.cpp).
TEST(CudaStreaming, HostRoutedFamiliesSameRoutingAndTokensAsTheCpu) {
  const HostRouted host_routed;
  int runs = 0;
  const float worst = expect_same_as_the_cpu(host_routed_fixtures(), runs);
  std::printf("cuda streaming, host-routed families: %d runs; routing equal to the CPU's; logits max |gpu - cpu| %.3g\n",
              runs, static_cast<double>(worst));
}

TEST(CudaStreaming, HybridFamiliesSameRoutingAndTokensAsTheCpu) {
  // Gated DeltaNet, QSA, hyper-connections and PLE layers around the streamed experts.
  int runs = 0;
  const float worst = expect_same_as_the_cpu(hybrid_expert_fixtures(), runs);
  std::printf("cuda streaming, hybrid families: %d runs; routing equal to the CPU's; logits max |gpu - cpu| %.3g\n",
              runs, static_cast<double>(worst));
}

// DeepSeek-V3 (latent attention), GLM-4.5 and MiniMax-M2: the group-limited sigmoid top-k with
// each layer's correction bias on the device (router_group_topk.cu), for the step's routing
// and lookahead's prediction alike.
TEST(CudaStreaming, GiantFamiliesSameRoutingAndTokensAsTheCpu) {
  int runs = 0;
  const float worst = expect_same_as_the_cpu(giant_fixtures(), runs);
  std::printf("cuda streaming, giant families: %d runs; routing equal to the CPU's; logits max |gpu - cpu| %.3g\n",
              runs, static_cast<double>(worst));
}

// The body of the test below over `fixtures`: the number of (fixture, cache size, source)
// runs compared. Sources: the disk (a group's misses land while its first waves compute) and
// a host tier that holds every record (all of a group's misses land at its plan).
int expect_grouped_prefill_bit_for_bit(const std::vector<std::string>& fixtures) {
  auto gpu = make_cuda_backend(0);
  int compared = 0;
  for (const bool host_tier : {false, true}) {
    for (const std::string& fixture : fixtures) {
      const fs::path& pack = fixture_pack(fixture);
      std::vector<int32_t> ids = fixture_ids(fixture);
      const std::vector<int32_t> once = ids;
      while (ids.size() < 96) ids.insert(ids.end(), once.begin(), once.end());
      ids.resize(96);
      LoadedModel resident = load(pack, *gpu, DType::q4, std::nullopt);
      const ModelInfo& info = resident.model->info();
      if (static_cast<int64_t>(ids.size()) * info.n_expert_used < cuda::kMoeGroupedPairsPerExpert * info.n_expert) continue;
      const int64_t V = info.n_vocab;
      std::vector<float> want(ids.size() * static_cast<size_t>(V));
      resident.model->forward(ids, *resident.model->new_state(96), want, true);
      const int32_t k = static_cast<int32_t>(info.n_expert_used);
      const int32_t all = static_cast<int32_t>(Pack::open(pack, false)->manifest().n_records());
      for (int32_t slots : {k, 2 * k + 1, all}) {
        SCOPED_TRACE(str(fixture, " slots ", slots, host_tier ? ", host tier" : ", from disk"));
        StreamerOptions so;
        so.slots = slots;
        so.wait_timeout = std::chrono::seconds(10);
        if (host_tier) {
          so.host_cache_bytes = static_cast<uint64_t>(all) * Pack::open(pack, false)->kind(DType::q4).record_stride;
          so.host_cache_preload = true;
        }
        LoadedModel streamed = load(pack, *gpu, DType::q4, so);
        std::vector<float> got(want.size());
        streamed.model->forward(ids, *streamed.model->new_state(96), got, true);
        EXPECT_EQ(floats_differing(got, want), 0u)
            << "logits differing from the resident prefill's (max |diff| " << max_abs_diff(got, want) << ")";
        const uint64_t steps = streamed.streamer->stats().totals().steps;
        if (slots < all) EXPECT_GT(steps, static_cast<uint64_t>(info.n_layer)) << "no grouping";
        else EXPECT_LE(steps, static_cast<uint64_t>(info.n_layer)) << "one group a MoE layer";
        ++compared;
      }
    }
  }
  return compared;
}

// A prefill whose union exceeds the cache takes the streamer's grouped path: each group of
// rows is computed in waves as its experts land. With many pairs an expert those rows go
// through the grouped kernels as the resident prefill's do, so the logits are the resident
// model's bit for bit, at every cache size (many groups at k slots, fewer at more), from disk
// and from a host tier. An exact prompt chunk whose union fits (every record cached) takes it
// too, as one group a layer.
TEST(CudaStreaming, GroupedPrefillIsTheResidentPrefillBitForBit) {
  EXPECT_GT(expect_grouped_prefill_bit_for_bit(cuda_expert_fixtures()), 0)
      << "no fixture has enough pairs an expert for the grouped kernels";
}

// gpt-oss's, Gemma 4's and Llama 4's experts routed on the device (the default;
// SLUICE_CUDA_HOST_ROUTED=1 routes them on the host: biases, the clamped SwiGLU and GeGLU in the streamer's table entries,
// Gemma 4's per-expert scales and Llama 4's sigmoid scoring in the device top-k, Llama 4's
// inputs scaled a row per pair; the decode kernels' two phases and the grouped prefill): the
// CPU streamer's routing decisions and greedy tokens at every cache size, the resident
// prefill's logits bit for bit on the grouped path, and gpt-oss's mxfp4 kind streamed
// through 4 slots against the CPU's run of the same pack.
TEST(CudaStreaming, FamiliesDeviceRoutedBehindTheSwitch) {
  std::vector<std::string> fixtures = gpt_oss_fixtures();
  for (const std::string& f : gemma4_fixtures()) fixtures.push_back(f);
  for (const std::string& f : llama4_fixtures()) fixtures.push_back(f);
  int runs = 0;
  const float worst = expect_same_as_the_cpu(fixtures, runs);
  std::printf("cuda streaming, gpt-oss, Gemma 4 and Llama 4 routed on the device: %d runs; routing equal to the CPU's; logits "
              "max |gpu - cpu| %.3g\n",
              runs, static_cast<double>(worst));
  EXPECT_GT(expect_grouped_prefill_bit_for_bit(fixtures), 0) << "no fixture's prefill took the grouped path";
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  const fs::path& pack = fixture_pack("gpt_oss_mxfp4");
  const std::vector<int32_t> ids = fixture_ids("gpt_oss_mxfp4");
  StreamerOptions so;
  so.slots = 4;
  so.wait_timeout = std::chrono::seconds(10);
  LoadedModel mc = load(pack, *cpu, DType::mxfp4, so), mg = load(pack, *gpu, DType::mxfp4, so);
  const auto [cd, cp] = run_logits(*mc.model, ids);
  const auto [gd, gp] = run_logits(*mg.model, ids);
  EXPECT_LE(max_abs_diff(gd, cd), 1e-3f) << "mxfp4 decode logits";
  EXPECT_LE(max_abs_diff(gp, cp), 1e-3f) << "mxfp4 teacher-forced logits";
}

TEST(CudaStreaming, Bf16FixturesMatchTransformers) {
  auto gpu = make_cuda_backend(0);
  for (const std::string fixture : {"qwen3_moe_yarn", "olmoe"}) {
    const std::vector<int32_t> ids = fixture_ids(fixture);
    NpyArray want = read_npy(fixture_dir(fixture) / "logits_full.npy");
    StreamerOptions so;
    so.slots = 4;
    LoadedModel m = load(fixture_pack(fixture), *gpu, DType::bf16, so);
    const auto [decode, prefill] = run_logits(*m.model, ids);
    const float d1 = max_abs_diff(decode, want.data), d2 = max_abs_diff(prefill, want.data);
    std::printf("cuda streaming %s bf16: max |logit - transformers| decode %.3g, prefill %.3g\n", fixture.c_str(),
                static_cast<double>(d1), static_cast<double>(d2));
    EXPECT_LE(d1, 1e-3f) << fixture;
    EXPECT_LE(d2, 1e-3f) << fixture;
    // One reference object: its prompt and continuation outlive the comparison.
    const FixtureReference ref = read_reference(fixture);
    const size_t n_cont = std::min<size_t>(8, ref.continuation_ids.size());
    EXPECT_EQ(greedy(*m.model, ref.prompt_ids, static_cast<int64_t>(n_cont)),
              std::vector<int32_t>(ref.continuation_ids.begin(), ref.continuation_ids.begin() + n_cont));
  }
}

// The mixtral fixture's q4 pack with 3 slots, streamed on the CPU: the oracle of the tests below.
struct MixtralThreeSlots {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
  fs::path pack = fixture_pack("mixtral");
  std::vector<int32_t> ids = fixture_ids("mixtral");
  StreamerOptions base;
  std::vector<float> cd, cp;
  uint64_t stride = 0;
  MixtralThreeSlots() {
    base.slots = 3;
    LoadedModel mc = load(pack, *cpu, DType::q4, base);
    std::tie(cd, cp) = run_logits(*mc.model, ids);
    stride = Pack::open(pack, false)->kind(DType::q4).record_stride;
  }
  // base with `slots` slots, reading from a preloaded host tier that holds every record (every
  // fill lands at its plan) or from disk.
  StreamerOptions with(int32_t slots, bool preloaded_tier) const {
    StreamerOptions so = base;
    so.slots = slots;
    if (preloaded_tier) {
      so.host_cache_bytes = 1 << 30;
      so.host_cache_preload = true;
    }
    return so;
  }
};

TEST(CudaStreaming, HostTierAndBlockingWaits) {
  MixtralThreeSlots t;
  StreamerOptions so = t.base;
  so.host_cache_bytes = 1 << 30;
  so.wait_mode = WaitMode::block;
  LoadedModel mg = load(t.pack, *t.gpu, DType::q4, so);
  const auto [gd, gp] = run_logits(*mg.model, t.ids);
  EXPECT_LE(max_abs_diff(gd, t.cd), 1e-3f);
  EXPECT_LE(max_abs_diff(gp, t.cp), 1e-3f);
  expect_consistent(*mg.streamer, t.stride, true);
  EXPECT_GT(mg.streamer->stats().totals().host_hits, 0u) << "the second pass should be served from the tier";
}

// One way to stream the mixtral fixture in the tests below: its options, whether its decode
// layers must take the path under test, and its name.
struct Way {
  StreamerOptions so;
  bool takes = false;
  std::string name;
};

// The mixtral fixture streamed each way: every run's decode and teacher-forced logits within
// 1e-3 of the CPU streamer's at 3 slots and its streamer consistent, and every run's decode
// logits the first run's bit for bit (a pair's result depends only on its row and its expert,
// and the layer is combined in rank order, so neither where a record came from nor when it
// landed changes a bit). taken() counts the decode MoE layers of this process that took the
// path under test: each run whose `takes` is set must add some.
void expect_every_way_the_same_bits(const MixtralThreeSlots& t, const std::vector<Way>& ways, int64_t (*taken)(),
                                    const char* path) {
  std::vector<float> first;
  for (const Way& w : ways) {
    SCOPED_TRACE(w.name);
    const int64_t before = taken();
    LoadedModel mg = load(t.pack, *t.gpu, DType::q4, w.so);
    const auto [gd, gp] = run_logits(*mg.model, t.ids);
    if (w.takes) {
      EXPECT_GT(taken(), before) << "no decode layer took " << path;
    }
    EXPECT_LE(max_abs_diff(gd, t.cd), 1e-3f);
    EXPECT_LE(max_abs_diff(gp, t.cp), 1e-3f);
    expect_consistent(*mg.streamer, t.stride, true);
    if (first.empty()) {
      first = gd;
      continue;
    }
    ASSERT_EQ(gd.size(), first.size());
    EXPECT_EQ(floats_differing(gd, first), 0u) << "decode logits differing from " << ways.front().name << "'s (max |diff| "
                                               << max_abs_diff(gd, first) << ")";
  }
}

// The copies beside phase 1: a preloaded host tier answers every miss at the plan, so each
// miss is copied by leading blocks of phase 1's gate/up launch and computed in phase 2. The
// same bits as from disk, where most misses land after the plan and phase 2's copy kernel
// copies them.
TEST(CudaStreaming, CopiesBesidePhaseOneSameBitsAsFromDisk) {
  MixtralThreeSlots t;
  expect_every_way_the_same_bits(t, {{t.with(3, true), true, "3 slots, host tier"}, {t.with(3, false), false, "3 slots, from disk"}},
                                 &CudaStreamer::decode_copies_beside, "the copies beside phase 1");
}

// Phase 2 settled at the plan: with a preloaded host tier every miss is ready at its plan, so
// phase 2's list goes out with phase 1's and the device's phase-2 handshake takes it from
// device memory without waiting for the host. The same bits as from disk (where layers settle
// only when nothing missed and the host answers misses_ready), at 3 slots (most layers miss)
// and with room for every expert.
TEST(CudaStreaming, SettledAtThePlanSameBitsAsFromDisk) {
  MixtralThreeSlots t;
  expect_every_way_the_same_bits(t,
                                 {{t.with(3, true), true, "3 slots, host tier"},
                                  {t.with(3, false), false, "3 slots, from disk"},
                                  {t.with(64, true), true, "64 slots, host tier"}},
                                 &CudaStreamer::decode_settled_at_plan, "phase 2 settled at the plan");
}

// A layer of hits taken on the device: when every routed expert's record is in the host's
// slot map, the phase-1 handshake builds the tables from it without waiting for the host. With
// room for every expert every decode layer after the first pass hits; with lookahead the
// device waits for the host's lists instead (they carry the prefetches' copies). The same bits
// every way, from the preloaded host tier and from disk, and at 3 slots (few layers hit).
TEST(CudaStreaming, HitsOnDeviceSameBitsAsTheHostsTables) {
  MixtralThreeSlots t;
  std::vector<Way> ways;
  for (const bool host_tier : {true, false}) {
    StreamerOptions look = t.with(64, host_tier);
    look.lookahead = true;
    ways.push_back({t.with(64, host_tier), true, str("64 slots", host_tier ? ", host tier" : ", from disk")});
    ways.push_back({look, false, str("64 slots, lookahead", host_tier ? ", host tier" : ", from disk")});
  }
  ways.push_back({t.with(3, true), false, "3 slots, host tier"});
  expect_every_way_the_same_bits(t, ways, &CudaStreamer::decode_hits_on_device, "the hits on the device");
}

// One down + combine after phase 2: the phases compute the gate/up products alone, and the
// fused down + combine over the pairs phase 2's table holds follows. The same bits at 3 slots
// (most layers miss) and with room for every expert, from the preloaded host tier (the copies
// beside phase 1) and from disk. Then with the worst-case deadline (every miss late), which
// either cuts every miss (cut pairs count as zero) or computes each from its q2 copy (mixed
// kinds: the per-pair down and the combine by the table instead of the fused kernel): those
// runs read from a preloaded host tier, where a late miss's full read lands at its plan, so
// the run is a function of the routing (from disk it lands whenever the read ends, and the
// next layers' hits with it; KlCheckAgainstASecondStreamer below): two runs the same bits.
TEST(CudaStreaming, OneDownAfterPhaseTwoSameBitsEveryWay) {
  MixtralThreeSlots t;
  std::vector<Way> ways;
  for (int32_t slots : {3, 64})
    for (bool host_tier : {true, false})
      ways.push_back({t.with(slots, host_tier), true, str(slots, " slots", host_tier ? ", host tier" : ", from disk")});
  expect_every_way_the_same_bits(t, ways, &CudaStreamer::decode_one_down, "one down + combine after phase 2");
  for (const bool low_bit : {false, true}) {
    SCOPED_TRACE(low_bit ? "every miss from its q2 copy" : "every miss cut");
    StreamerOptions so = t.with(3, true);
    so.deadline_worst_case = true;
    if (low_bit) {
      so.miss_kind = DType::q2;
    } else {
      so.cut = 1.0;
    }
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      LoadedModel m = load(t.pack, *t.gpu, DType::q4, so);
      const std::vector<float> d = run_logits(*m.model, t.ids).first;
      ASSERT_TRUE(m.streamer->drain(std::chrono::seconds(10)));
      const LayerStats st = m.streamer->stats().totals();
      EXPECT_GT(low_bit ? st.low_bit : st.cut, 0u);
      for (float v : d) ASSERT_TRUE(std::isfinite(v));
      if (run == 1) {
        ASSERT_EQ(d.size(), first.size());
        EXPECT_EQ(floats_differing(d, first), 0u) << "two runs of one configuration differ: not a function of the "
                                                  << "routing (max |diff| " << max_abs_diff(d, first) << ")";
      }
      first = d;
    }
  }
}

TEST(CudaStreaming, MissKindWithTheWorstCaseDeadline) {
  MixtralThreeSlots t;
  StreamerOptions so = t.base;
  so.miss_kind = DType::q2;
  so.cut = 1.0;
  so.deadline_worst_case = true;
  LoadedModel mg = load(t.pack, *t.gpu, DType::q4, so);
  const auto [gd, gp] = run_logits(*mg.model, t.ids);
  ASSERT_TRUE(mg.streamer->drain(std::chrono::seconds(10)));
  const LayerStats s = mg.streamer->stats().totals();
  EXPECT_GT(s.low_bit, 0u);
  EXPECT_GT(s.cut, 0u);
  for (float v : gd) ASSERT_TRUE(std::isfinite(v));
}

// --kl-check on CUDA: a second CUDA streamer computes the checked steps exactly. The mixtral fixture, 3 slots, 12 greedy
// tokens: without a lossy option the two streamers agree bit for bit (KL exactly 0 over every
// step); with every miss taking its q2 copy (the worst-case deadline) the check measures a
// positive divergence and leaves the lossy run's tokens as they are without it.
// What a lossy step computes depends on the cache it starts from: a miss of the step before
// whose full read (issued in the background after its q2 copy) landed is a hit, one still in
// flight is pending and takes its q2 copy again. On CUDA those reads land while the device
// runs, so the lossy tokens depend on timing, and the exact pass of a checked step gives them
// time to land (Generator::checked_step's "one bias"; without what follows the tokens parted
// at the 8th). So both lossy runs start every step from a settled cache: no greedy step
// enqueued ahead (GenerateOptions::steps_ahead false) and the streamer drained after every
// token. That settles the cache between tokens only: within a token, a layer's background
// reads may still be in flight at the next layer's plan (3 slots for all layers), and with a
// faster streamed step (~100 -> ~47 us of handshake a layer) the lossy tokens parted between
// runs of one binary at the fifth token in 5 of 10 runs. So the lossy runs read from a preloaded host tier: every fill lands at
// its plan, and the lossy step is a function of the routing alone.
TEST(CudaStreaming, KlCheckAgainstASecondStreamer) {
  MixtralThreeSlots t;
  auto generate = [&](bool lossy, int64_t kl_steps) {
    StreamerOptions so = t.with(3, lossy);
    if (lossy) {
      so.miss_kind = DType::q2;
      so.deadline_worst_case = true;
    }
    LoadedModel m = load(t.pack, *t.gpu, DType::q4, so);
    GenerateOptions g;
    g.n_predict = 12;
    g.sampling.temperature = 0;
    g.kl_check_steps = kl_steps;
    g.steps_ahead = false;
    if (kl_steps > 0) g.kl_exact = make_streamer(m.pack, DType::q4, m.model->info().n_expert_used, *t.gpu, t.base);
    std::vector<int32_t> tokens;
    Generator gen(*m.model);
    const GenerateStats st = gen.generate(read_reference("mixtral").prompt_ids, g, [&](int32_t id) {
      tokens.push_back(id);
      EXPECT_TRUE(m.streamer->drain(std::chrono::seconds(10)));
      return true;
    });
    return std::make_pair(tokens, st);
  };
  const auto [exact_tokens, exact] = generate(false, 100);
  EXPECT_EQ(exact.kl.steps, 11);
  EXPECT_EQ(exact.kl.mean_nats, 0.0);
  EXPECT_EQ(exact.kl.max_nats, 0.0);
  const auto [plain_tokens, plain] = generate(true, 0);
  const auto [checked_tokens, checked] = generate(true, 4);
  std::printf("cuda kl-check, q2 misses at the worst-case deadline: mean %.3g max %.3g nats over %lld steps\n",
              checked.kl.mean_nats, checked.kl.max_nats, static_cast<long long>(checked.kl.steps));
  EXPECT_EQ(checked.kl.steps, 4);
  EXPECT_GT(checked.kl.mean_nats, 0.0);
  EXPECT_EQ(checked_tokens, plain_tokens);
}

TEST(CudaStreaming, FakeExpertsRunWithoutReads) {
  MixtralThreeSlots t;
  StreamerOptions so = t.base;
  so.fake_experts = true;
  LoadedModel mg = load(t.pack, *t.gpu, DType::q4, so);
  const auto [gd, gp] = run_logits(*mg.model, t.ids);
  EXPECT_EQ(gd.size(), t.cd.size());
  EXPECT_EQ(mg.streamer->stats().io_reads, 0u);
}

TEST(CudaStreaming, CorruptRecordIsAClearErrorNotAHang) {
  const std::string fixture = "qwen3_moe";
  const std::vector<int32_t> ids = fixture_ids(fixture);
  const fs::path dir = pack_test_dir("cuda-corrupt");
  fs::remove_all(dir);
  fs::copy(fixture_pack(fixture), dir, fs::copy_options::recursive);
  // The first expert of the first MoE layer for the first token, as the CPU routes it.
  int32_t e = -1;
  {
    auto cpu = make_cpu_backend();
    LoadedModel m = load(dir, *cpu, DType::q4, std::nullopt);
    m.model->set_routing_observer([&](const RoutingEvent& ev) {
      if (e < 0) e = ev.routing->ids[0];
    });
    auto state = m.model->new_state(1);
    std::vector<float> l(static_cast<size_t>(m.model->info().n_vocab));
    m.model->forward(std::span<const int32_t>(ids.data(), 1), *state, l, false);
  }
  ASSERT_GE(e, 0);
  std::shared_ptr<Pack> p = Pack::open(dir, false);
  {
    const uint64_t off = p->record_offset(DType::q4, p->record_id(0, e)) + 100;
    std::fstream f(dir / p->kind(DType::q4).file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(off));
    f.put('\x5a');
  }
  auto gpu = make_cuda_backend(0);
  StreamerOptions so;
  so.slots = 2;
  so.verify_reads = true;
  so.wait_timeout = std::chrono::seconds(5);
  LoadedModel m = load(dir, *gpu, DType::q4, so);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string err = error_of([&] { run_logits(*m.model, ids); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t layer = p->manifest().moe_layers[0];
  EXPECT_NE(err.find(str("layer ", layer, ", expert ", e, ", kind q4")), std::string::npos) << err;
  EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << err;
  EXPECT_LT(s, 4.0) << "the error took " << s << " s";
  // The streamer stays failed: the next forward says so at once.
  const std::string again = error_of([&] { run_logits(*m.model, ids); });
  EXPECT_NE(again.find("checksum mismatch"), std::string::npos) << again;
}

// The device's own wait for a phase's tables (docs/streamed-step.md, the handshake kernels) gives
// up after the wait timeout: the forward fails with an error naming the layer, instead of a
// hang or an answer computed without the layer's experts.
TEST(CudaStreaming, LateTablesAreATimedErrorNamingTheLayer) {
  MixtralThreeSlots t;
  StreamerOptions so = t.base;
  so.wait_timeout = std::chrono::milliseconds(300);
  so.test_publish_delay_us = 1'500'000;
  LoadedModel mg = load(t.pack, *t.gpu, DType::q4, so);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string err = error_of([&] { run_logits(*mg.model, t.ids); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t layer = Pack::open(t.pack, false)->manifest().moe_layers[0];
  EXPECT_NE(err.find(str("MoE layer 0 (model layer ", layer, "): the device waited more than 0.3 s")), std::string::npos)
      << err;
  EXPECT_LT(s, 10.0) << "the error took " << s << " s";
  // The streamer stays failed: the next forward says so at once.
  const std::string again = error_of([&] { run_logits(*mg.model, t.ids); });
  EXPECT_NE(again.find("the device waited"), std::string::npos) << again;
}

TEST(CudaStreaming, TooFewSlotsIsAStartupError) {
  auto gpu = make_cuda_backend(0);
  const fs::path& pack = fixture_pack("qwen3_moe_yarn");  // top-3
  StreamerOptions so;
  so.slots = 2;
  const std::string err = error_of([&] { load(pack, *gpu, DType::q4, so); });
  EXPECT_NE(err.find("the minimum is 3 slots"), std::string::npos) << err;
}
