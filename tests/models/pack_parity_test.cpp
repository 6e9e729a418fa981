// Running from a pack: exact expectations.
//  - A checkpoint saved in bf16 (qwen3_moe_yarn, olmoe) run from its pack at the bf16 kind
//    gives bit-identical logits to the checkpoint run (dense bf16 and bf16 experts are the
//    same bytes), and the greedy continuation of the transformers reference.
//  - For every fixture with experts (the hybrids and gpt-oss too) and every kind, the pack run
//    is bit-identical to a run of the checkpoint whose expert tensors are replaced by the
//    values the kind stores (bf16 tensors for bf16, the dequantized f32 values for
//    int8/q4/q2/mxfp4; gpt-oss's as one f32 tensor in its float layout): the pack's dense tensors
//    and records are loaded and used exactly, and the quantized matmul equals the f32 one
//    over the dequantized weights. What quantization costs is measured by quality_test.cpp.
//  - Token-by-token decoding from a pack reproduces its teacher-forced logits bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <set>

#include "core/quant.h"
#include "engine/generator.h"
#include "tests/models/fixture_util.h"
#include "format/checkpoint.h"
#include "format/pack.h"
#include "format/safetensors.h"
#include "models/load.h"
#include "tests/models/pack_util.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

const DType kKinds[] = {DType::bf16, DType::q8, DType::q4, DType::q2, DType::mxfp4};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The fixture's checkpoint with every routed expert replaced by what `kind` stores in the pack.
fs::path checkpoint_of_pack_experts(const std::string& fixture, DType kind) {
  fs::path dir = pack_test_dir(fixture + "-" + std::string(expert_kind_name(kind)) + "-values");
  fs::copy_file(fixture_dir(fixture) / "config.json", dir / "config.json");
  std::shared_ptr<Pack> pack = Pack::open(fixture_pack(fixture));
  const PackManifest& m = pack->manifest();
  const PackKindInfo& info = pack->kind(kind);
  Checkpoint ck = Checkpoint::open(fixture_dir(fixture));
  std::map<std::string, Tensor> replaced;
  std::set<std::string> dropped;  // MXFP4 blocks and scales, replaced by float tensors
  std::vector<std::shared_ptr<std::vector<float>>> storage;
  // The values of one block of a record as f32 (bf16 converted, quantized kinds dequantized).
  auto values_of = [&](const Tensor& t) {
    auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(t.numel()));
    if (t.dtype == DType::bf16) {
      dtype_row_to_f32(t.data, DType::bf16, t.numel(), values->data());
    } else {
      for (int64_t r = 0; r < t.rows(); ++r)
        dequantize_row(t.dtype, static_cast<const uint8_t*>(t.data) + r * quant_row_bytes(t.dtype, t.cols()),
                       static_cast<const uint8_t*>(t.scales) + r * quant_scale_row_bytes(t.dtype, t.cols()), t.cols(),
                       values->data() + r * t.cols());
    }
    return values;
  };
  int64_t want_replaced = 0;
  for (size_t l = 0; l < m.moe_layers.size(); ++l) {
    const std::string& src = m.expert_sources[l];
    if (src == "fused") {
      // transformers 5's fused layout (Gemma 4), f32: gate_up_proj [E, 2 ff, d] (gate rows,
      // then up rows), down_proj [E, d, ff].
      const int64_t E = m.n_expert, d = m.n_embd, ff = m.n_ff;
      auto gu = std::make_shared<std::vector<float>>(static_cast<size_t>(E * 2 * ff * d));
      auto dn = std::make_shared<std::vector<float>>(static_cast<size_t>(E * d * ff));
      for (int64_t e = 0; e < E; ++e) {
        ExpertWeights w = expert_view(info, pack->mapped_record(kind, pack->record_id(static_cast<int64_t>(l), e)).data());
        const auto g = values_of(w.gate), u = values_of(w.up), dw = values_of(w.down);
        std::copy(g->begin(), g->end(), gu->begin() + e * 2 * ff * d);
        std::copy(u->begin(), u->end(), gu->begin() + e * 2 * ff * d + ff * d);
        std::copy(dw->begin(), dw->end(), dn->begin() + e * d * ff);
      }
      storage.push_back(gu);
      storage.push_back(dn);
      replaced[m.expert_prefixes[l] + "gate_up_proj"] = Tensor(DType::f32, {E, 2 * ff, d}, gu->data());
      replaced[m.expert_prefixes[l] + "down_proj"] = Tensor(DType::f32, {E, d, ff}, dn->data());
      want_replaced += 2;
      continue;
    }
    if (src == "gpt_oss" || src == "gpt_oss_mxfp4" || src == "fused_inputs_first") {
      // The inputs-first float layout, f32: gate_up_proj [E, d, 2 ff] (gpt-oss: gate f at
      // column 2f, up f at 2f + 1; Llama 4: gate f at f, up f at ff + f), down_proj [E, ff, d];
      // gpt-oss's biases stay the checkpoint's.
      const bool halves = src == "fused_inputs_first";
      const int64_t E = m.n_expert, d = m.n_embd, ff = m.n_ff;
      auto gu = std::make_shared<std::vector<float>>(static_cast<size_t>(E * d * 2 * ff));
      auto dn = std::make_shared<std::vector<float>>(static_cast<size_t>(E * ff * d));
      for (int64_t e = 0; e < E; ++e) {
        ExpertWeights w = expert_view(info, pack->mapped_record(kind, pack->record_id(static_cast<int64_t>(l), e)).data());
        const auto g = values_of(w.gate), u = values_of(w.up), dw = values_of(w.down);
        for (int64_t f = 0; f < ff; ++f)
          for (int64_t h = 0; h < d; ++h) {
            (*gu)[static_cast<size_t>((e * d + h) * 2 * ff + (halves ? f : 2 * f))] = (*g)[static_cast<size_t>(f * d + h)];
            (*gu)[static_cast<size_t>((e * d + h) * 2 * ff + (halves ? ff + f : 2 * f + 1))] =
                (*u)[static_cast<size_t>(f * d + h)];
            (*dn)[static_cast<size_t>((e * ff + f) * d + h)] = (*dw)[static_cast<size_t>(h * ff + f)];
          }
      }
      storage.push_back(gu);
      storage.push_back(dn);
      const std::string& p = m.expert_prefixes[l];
      replaced[p + "gate_up_proj"] = Tensor(DType::f32, {E, d, 2 * ff}, gu->data());
      replaced[p + "down_proj"] = Tensor(DType::f32, {E, ff, d}, dn->data());
      for (const char* n : {"gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"})
        dropped.insert(p + n);
      want_replaced += 2;
      continue;
    }
    want_replaced += m.n_expert * 3;
    const bool hf = src[0] == 'g';
    const char* names[3] = {hf ? "gate_proj" : "w1", hf ? "up_proj" : "w3", hf ? "down_proj" : "w2"};
    for (int64_t e = 0; e < m.n_expert; ++e) {
      ExpertWeights w = expert_view(info, pack->mapped_record(kind, pack->record_id(static_cast<int64_t>(l), e)).data());
      const Tensor* blocks[3] = {&w.gate, &w.up, &w.down};
      for (int p = 0; p < 3; ++p) {
        const Tensor& t = *blocks[p];
        const std::string name = m.expert_prefixes[l] + std::to_string(e) + "." + names[p] + ".weight";
        if (kind == DType::bf16) {
          replaced[name] = t;  // bf16 values as stored
          continue;
        }
        auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(t.numel()));
        for (int64_t r = 0; r < t.rows(); ++r)
          dequantize_row(t.dtype, static_cast<const uint8_t*>(t.data) + r * quant_row_bytes(t.dtype, t.cols()),
                         static_cast<const uint8_t*>(t.scales) + r * quant_scale_row_bytes(t.dtype, t.cols()), t.cols(),
                         values->data() + r * t.cols());
        storage.push_back(values);
        replaced[name] = Tensor(DType::f32, {t.shape[0], t.shape[1]}, values->data());
      }
    }
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : ck.names()) {
    if (name.rfind("model.visual.", 0) == 0) continue;  // the vision tower (5-D; the pack leaves it out)
    if (dropped.count(name)) continue;
    auto it = replaced.find(name);
    tensors.emplace_back(name, it != replaced.end() ? it->second : ck.get(name));
  }
  for (const auto& [name, t] : replaced)  // the float tensors of an MXFP4 checkpoint are new names
    if (!ck.has(name)) tensors.emplace_back(name, t);
  EXPECT_EQ(static_cast<size_t>(want_replaced), replaced.size());
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

TEST(PackParity, Bf16KindOfABf16CheckpointIsBitIdentical) {
  for (const std::string fixture : {"qwen3_moe_yarn", "olmoe"}) {
    SCOPED_TRACE(fixture);
    std::vector<int32_t> ids = full_ids(fixture);
    EXPECT_TRUE(same_bits(teacher_forced(fixture_pack(fixture), ids, {DType::bf16}), teacher_forced(fixture_dir(fixture), ids)));
    // And the transformers reference continuation, greedily.
    FixtureReference ref = read_reference(fixture);
    auto backend = make_cpu_backend();
    LoadedModel m = load_model(fixture_pack(fixture), *backend, {DType::bf16});
    EXPECT_TRUE(m.tokenizer.has_value());  // the tokenizer files travel with the pack
    GenerateOptions opt;
    opt.n_predict = static_cast<int64_t>(ref.continuation_ids.size());
    opt.sampling.temperature = 0;
    std::vector<int32_t> got;
    Generator(*m.model).generate(ref.prompt_ids, opt, [&](int32_t id) {
      got.push_back(id);
      return true;
    });
    EXPECT_EQ(got, ref.continuation_ids);
  }
}

class PackParity : public ::testing::TestWithParam<std::string> {};

TEST_P(PackParity, EachKindEqualsTheCheckpointOfItsValues) {
  const std::string fixture = GetParam();
  std::vector<int32_t> ids = full_ids(fixture);
  for (DType kind : kKinds) {
    SCOPED_TRACE(expert_kind_name(kind));
    std::vector<float> from_pack = teacher_forced(fixture_pack(fixture), ids, {kind});
    std::vector<float> from_values = teacher_forced(checkpoint_of_pack_experts(fixture, kind), ids);
    EXPECT_TRUE(same_bits(from_pack, from_values)) << "max diff " << max_abs_diff(from_pack, from_values);
  }
}

// The decoder families only: the hybrids' prefill uses the chunked delta rule and decode the
// recurrent one, which agree to f32 rounding, not bitwise (hybrid_model_test.cpp bounds it).
class PackDecode : public ::testing::TestWithParam<std::string> {};

TEST_P(PackDecode, DecodeReproducesTeacherForcedBitwise) {
  const std::string fixture = GetParam();
  std::vector<int32_t> ids = full_ids(fixture);
  const DType kind = DType::q4;
  std::vector<float> want = teacher_forced(fixture_pack(fixture), ids, {kind});
  auto backend = make_cpu_backend();
  LoadedModel m = load_model(fixture_pack(fixture), *backend, {kind});
  const int64_t V = m.model->info().n_vocab, n = static_cast<int64_t>(ids.size());
  auto state = m.model->new_state(n);
  std::vector<float> got(n * V), row(V);
  const int64_t prefill = 7;
  std::vector<float> part(prefill * V);
  m.model->forward(std::span(ids).subspan(0, prefill), *state, part, true);
  std::copy(part.begin(), part.end(), got.begin());
  for (int64_t pos = prefill; pos < n; ++pos) {
    m.model->forward(std::span(ids).subspan(pos, 1), *state, row, false);
    std::copy(row.begin(), row.end(), got.begin() + pos * V);
  }
  EXPECT_TRUE(same_bits(got, want)) << "max diff " << max_abs_diff(got, want);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PackParity, ::testing::ValuesIn(expert_fixtures()),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Fixtures, PackDecode, ::testing::ValuesIn(decoder_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
