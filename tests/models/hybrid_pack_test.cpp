// Packs of the hybrid families (qwen3_next, qwen3_5, qwen3_5_moe, qwen4_exp):
//  - convert keeps every checkpoint tensor but the vision tower: dense tensors in dense.bin,
//    routed experts as records, PLE n-gram tables in ple.<dtype>.bin; verify passes;
//  - a pack runs like its checkpoint: at the bf16 kind, a bf16 checkpoint's pack (and a dense
//    model's) gives bit-identical logits, so they match transformers' reference within the
//    parity bound; every pack gives the reference's greedy continuation. (qwen3_next is
//    saved in f16: its bf16 experts are rounded, so its logits differ from the reference by
//    the rounding, measured and printed; pack_parity_test.cpp shows the pack computes exactly
//    with the values it stores.)
// Every kind against the checkpoint of its values: pack_parity_test.cpp (expert fixtures).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "engine/generator.h"
#include "tests/models/fixture_util.h"
#include "format/checkpoint.h"
#include "format/json_file.h"
#include "format/npy.h"
#include "format/pack.h"
#include "models/load.h"
#include "models/ple.h"
#include "tests/models/pack_util.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

constexpr float kLogitTolerance = 1e-4f;  // the parity bound against transformers (parity_test.cpp)

LoadOptions bf16_if_experts(const fs::path& pack) {
  LoadOptions lo;
  if (!Pack::open(pack, false)->manifest().kinds.empty()) lo.expert_kind = DType::bf16;
  return lo;
}

class HybridPack : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridPack, KeepsEveryTensorButTheVisionTower) {
  const std::string fixture = GetParam();
  const fs::path& dir = fixture_pack(fixture);
  EXPECT_TRUE(verify_pack(dir).ok);
  std::shared_ptr<Pack> pack = Pack::open(dir, false);
  const PackManifest& m = pack->manifest();
  // Where each checkpoint tensor went.
  std::set<std::string> in_pack;
  for (const std::string& n : pack->dense_names()) in_pack.insert(n);
  if (m.ple)
    for (const PackRowTable& t : m.ple->tables) in_pack.insert(t.sources.begin(), t.sources.end());
  Checkpoint ck = Checkpoint::open(fixture_dir(fixture));
  int64_t vision = 0, experts = 0, tables = 0;
  for (const std::string& name : ck.names()) {
    if (name.rfind("model.visual.", 0) == 0) {
      ++vision;
      EXPECT_FALSE(in_pack.count(name)) << name;
      continue;
    }
    const bool expert = std::any_of(m.expert_prefixes.begin(), m.expert_prefixes.end(),
                                    [&](const std::string& p) { return name.rfind(p, 0) == 0; });
    if (expert) {
      ++experts;
      EXPECT_FALSE(in_pack.count(name)) << name << " is a routed expert, not a dense tensor";
      continue;
    }
    tables += ngram_table_tensor(name).has_value();
    EXPECT_TRUE(in_pack.count(name)) << name << " is missing from the pack";
  }
  const bool multimodal = fixture != "qwen3_next";
  EXPECT_EQ(vision > 0, multimodal) << "the multimodal fixtures carry a vision tower";
  EXPECT_EQ(experts > 0, fixture != "qwen3_5");
  EXPECT_EQ(m.kinds.empty(), fixture == "qwen3_5");
  EXPECT_EQ(tables > 0, fixture == "qwen4_exp_ple");
  EXPECT_EQ(m.ple.has_value(), fixture == "qwen4_exp_ple");
  // Version 2 only for what needs it.
  EXPECT_EQ(m.version, fixture == "qwen3_5" || fixture == "qwen4_exp_ple" ? 2 : 1);
}

TEST_P(HybridPack, MatchesTheReferenceLikeTheCheckpoint) {
  const std::string fixture = GetParam();
  FixtureReference ref = read_reference(fixture);
  std::vector<int32_t> ids = ref.prompt_ids;
  ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
  const fs::path& pack = fixture_pack(fixture);
  const LoadOptions lo = bf16_if_experts(pack);
  std::vector<float> from_pack = teacher_forced(pack, ids, lo);
  std::vector<float> from_checkpoint = teacher_forced(fixture_dir(fixture), ids);
  NpyArray want = read_npy(fixture_dir(fixture) / "logits_full.npy");
  const float diff = max_abs_diff(from_pack, want.data);
  // A bf16 checkpoint stores bf16 experts and dense tensors as the pack does: the same bits.
  const std::string saved = read_json_file(fixture_dir(fixture) / "reference.json")["saved_dtype"];
  if (saved == "bfloat16") {
    EXPECT_LE(diff, kLogitTolerance) << "max |pack logit - transformers| (checkpoint: "
                                     << max_abs_diff(from_checkpoint, want.data) << ")";
    EXPECT_EQ(std::memcmp(from_pack.data(), from_checkpoint.data(), from_pack.size() * sizeof(float)), 0)
        << "the pack run differs from the checkpoint run (max " << max_abs_diff(from_pack, from_checkpoint) << ")";
  }
  // The greedy continuation of the reference, decoded step by step from the pack.
  auto backend = make_cpu_backend();
  LoadedModel m = load_model(pack, *backend, lo);
  GenerateOptions opt;
  opt.n_predict = static_cast<int64_t>(ref.continuation_ids.size());
  opt.sampling.temperature = 0;
  std::vector<int32_t> got;
  Generator(*m.model).generate(ref.prompt_ids, opt, [&](int32_t id) {
    got.push_back(id);
    return true;
  });
  EXPECT_EQ(got, ref.continuation_ids);
  std::printf("%s: pack max |logit - transformers| %.3g\n", fixture.c_str(), static_cast<double>(diff));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HybridPack, ::testing::ValuesIn(hybrid_fixtures()),
                         [](const auto& info) { return info.param; });

TEST(HybridPackErrors, KindAndStreamingNeedExperts) {
  const fs::path& pack = fixture_pack("qwen3_5");
  auto backend = make_cpu_backend();
  LoadOptions lo;
  lo.expert_kind = DType::q4;
  try {
    load_model(pack, *backend, lo);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without routed experts"), std::string::npos) << e.what();
  }
  LoadOptions so;
  so.streaming = StreamerOptions{};
  so.streaming->slots = 4;
  try {
    load_model(pack, *backend, so);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing to stream"), std::string::npos) << e.what();
  }
}

}  // namespace
