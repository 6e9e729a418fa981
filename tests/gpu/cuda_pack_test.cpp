// Packs on the GPU: every decoder fixture, converted to each expert kind, gives on the CUDA
// backend the logits the CPU backend gives from the same pack (the oracle for kernels), within
// 1e-3 max-abs (f32 activations, reordered sums), and the same greedy continuation.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "engine/generator.h"
#include "format/pack.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

namespace {

class CudaPack : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaPack, EveryKindMatchesTheCpu) {
  FixtureReference ref = read_reference(GetParam());
  for (DType kind : {DType::bf16, DType::q8, DType::q4, DType::q2}) {
    auto cpu = make_cpu_backend();
    auto gpu = make_cuda_backend(0);
    LoadOptions lo;
    lo.expert_kind = kind;
    LoadedModel mc = load_model(fixture_pack(GetParam()), *cpu, lo);
    LoadedModel mg = load_model(fixture_pack(GetParam()), *gpu, lo);
    const int64_t n = static_cast<int64_t>(ref.prompt_ids.size()), V = mc.model->info().n_vocab;
    std::vector<float> lc(n * V), lg(n * V);
    auto sc = mc.model->new_state(n), sg = mg.model->new_state(n);
    mc.model->forward(ref.prompt_ids, *sc, lc, true);
    mg.model->forward(ref.prompt_ids, *sg, lg, true);
    float diff = max_abs_diff(lg, lc);
    std::printf("cuda pack %s %s: max |gpu - cpu| = %.3g\n", GetParam().c_str(),
                std::string(expert_kind_name(kind)).c_str(), diff);
    EXPECT_LE(diff, 1e-3f) << expert_kind_name(kind);
    EXPECT_EQ(greedy(*mg.model, ref.prompt_ids, 8), greedy(*mc.model, ref.prompt_ids, 8)) << expert_kind_name(kind);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaPack, ::testing::ValuesIn(decoder_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
