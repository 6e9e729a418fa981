// Llama 4 beyond the shared parity tests (parity_test.cpp, pack_parity_test.cpp and the
// streaming tests run its two fixtures like every other):
//  - each of the family's switches changes the logits of its fixture (chunked attention, the
//    NoPE layers' temperature tuning, the L2 q/k norm, the shared expert via the MoE layers'
//    placement), so the parity tests do test them;
//  - the experts' inputs-first layout converts to records whose gate rows are the stored
//    matrix's first n_ff columns and up rows the next n_ff;
//  - attention chunks and temperatures against a double reference (op level);
//  - damaged configs and expert tensors are refused in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>

#include "tests/format/format_test_util.h"
#include "backends/backend.h"
#include "convert/convert.h"
#include "tests/models/fixture_util.h"
#include "format/checkpoint.h"
#include "format/json_file.h"
#include "format/npy.h"
#include "format/pack.h"
#include "format/safetensors.h"
#include "models/load.h"
#include "tests/models/pack_util.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;


TEST(Llama4, EachSwitchMovesTheLogits) {
  const std::string fixture = "llama4";
  const std::vector<int32_t> ids = full_ids(fixture);
  const std::vector<float> base = teacher_forced(fixture_dir(fixture), ids);
  const NpyArray want = read_npy(fixture_dir(fixture) / "logits_full.npy");
  EXPECT_LE(max_abs_diff(base, want.data), 1e-4f);
  const std::vector<std::pair<std::string, std::function<void(json&)>>> edits = {
      {"no chunks", [](json& c) { c["attention_chunk_size"] = 4096; }},
      {"no temperature tuning", [](json& c) { c["attn_temperature_tuning"] = false; }},
      {"no q/k norm", [](json& c) { c["use_qk_norm"] = false; }},
      {"rope everywhere", [](json& c) {
         c["no_rope_layers"] = {1, 1, 1, 1};
         c["layer_types"] = {"chunked_attention", "chunked_attention", "chunked_attention", "chunked_attention"};
       }},
  };
  for (const auto& [what, edit] : edits) {
    const float moved = max_abs_diff(teacher_forced(fixture_with_config(fixture, "llama4-edit", edit), ids), base);
    std::printf("llama4 %s: logits move by %.3g\n", what.c_str(), moved);
    EXPECT_GT(moved, 1e-2f) << what;
  }
}

TEST(Llama4, InputsFirstExpertsBecomeRecordRows) {
  const std::string fixture = "llama4_top2";  // f32: the bf16 kind rounds, so compare the f32 values rounded
  std::shared_ptr<Pack> pack = Pack::open(fixture_pack(fixture));
  const PackManifest& m = pack->manifest();
  const PackKindInfo& info = pack->kind(DType::bf16);
  Checkpoint ck = Checkpoint::open(fixture_dir(fixture));
  const int64_t E = m.n_expert, d = m.n_embd, ff = m.n_ff;
  for (size_t l = 0; l < m.moe_layers.size(); ++l) {
    ASSERT_EQ(m.expert_sources[l], "fused_inputs_first");
    const Tensor gu = ck.get(m.expert_prefixes[l] + "gate_up_proj"), dn = ck.get(m.expert_prefixes[l] + "down_proj");
    ASSERT_EQ(gu.dtype, DType::f32);
    for (int64_t e = 0; e < E; ++e) {
      const ExpertWeights w = expert_view(info, pack->mapped_record(DType::bf16, pack->record_id(static_cast<int64_t>(l), e)).data());
      EXPECT_FALSE(w.has_biases());
      for (int64_t f = 0; f < ff; ++f)
        for (int64_t h = 0; h < d; ++h) {
          const float* g = gu.ptr<float>() + (e * d + h) * 2 * ff;
          ASSERT_EQ(w.gate.ptr<uint16_t>()[f * d + h], f32_to_bf16(g[f])) << e << " " << f << " " << h;
          ASSERT_EQ(w.up.ptr<uint16_t>()[f * d + h], f32_to_bf16(g[ff + f])) << e << " " << f << " " << h;
          ASSERT_EQ(w.down.ptr<uint16_t>()[h * ff + f], f32_to_bf16(dn.ptr<float>()[(e * ff + f) * d + h]));
        }
    }
  }
}

// Chunks and temperature at the op level, against a double reference: a query at p sees keys
// [p - p % chunk, p] (and the window's bound), its scores scaled by log1p(floor((p + 1) /
// floor_scale)) * attn_scale + 1.
TEST(Llama4, ChunkedAttentionAndTemperatureMatchReference) {
  auto be = make_cpu_backend();
  const int64_t hq = 4, hkv = 2, d = 16;
  for (auto [n, n_past, chunk, floor_scale] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{9, 0, 4, 0},
                                               {5, 13, 8, 0}, {12, 3, 0, 4}, {7, 20, 5, 3}, {1, 17, 4, 2}}) {
    const int64_t ctx = n_past + n;
    std::vector<float> q(n * hq * d), k(ctx * hkv * d), v(ctx * hkv * d);
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * static_cast<float>(i));
    for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.11f * static_cast<float>(i));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.23f * static_cast<float>(i) + 1.0f);
    const float scale = 0.25f, attn_scale = 0.1f;
    AttentionParams ap;
    ap.n_past = n_past;
    ap.scale = scale;
    ap.chunk = chunk;
    ap.temperature_floor_scale = floor_scale;
    ap.temperature_attn_scale = attn_scale;
    std::vector<float> out(q.size());
    be->attention(Tensor(DType::f32, {n, hq, d}, q.data()), Tensor(DType::f32, {ctx, hkv, d}, k.data()),
                  Tensor(DType::f32, {ctx, hkv, d}, v.data()), Tensor(DType::f32, {n, hq, d}, out.data()), ap);
    double err = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t p = n_past + i, g = h / (hq / hkv), j0 = chunk ? p - p % chunk : 0;
        const double t = floor_scale ? std::log1p(std::floor((p + 1.0) / floor_scale)) * attn_scale + 1.0 : 1.0;
        std::vector<double> s;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = j0; j <= p; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += double(q[(i * hq + h) * d + c]) * k[(j * hkv + g) * d + c];
          s.push_back(dot * scale * t);
          mx = std::max(mx, s.back());
        }
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t c = 0; c < d; ++c) {
          double o = 0;
          for (int64_t j = j0; j <= p; ++j) o += s[j - j0] / sum * v[(j * hkv + g) * d + c];
          err = std::max(err, std::fabs(o - out[(i * hq + h) * d + c]));
        }
      }
    EXPECT_LT(err, 1e-5) << "n " << n << " n_past " << n_past << " chunk " << chunk << " floor_scale " << floor_scale;
  }
}

TEST(Llama4, BadConfigsAreRefusedInOneLine) {
  const std::vector<std::pair<std::function<void(json&)>, std::vector<std::string>>> cases = {
      {[](json& c) { c["moe_layers"] = {1, 7}; }, {"llama4_text", "moe_layers", "7"}},
      {[](json& c) { c["no_rope_layers"] = {1, 1}; }, {"llama4_text", "no_rope_layers", "2 entries"}},
      {[](json& c) { c["layer_types"] = {"chunked_attention", "sliding_attention", "full_attention", "full_attention"}; },
       {"llama4_text", "layer_types[1]", "sliding_attention"}},
      {[](json& c) { c["attention_bias"] = true; }, {"llama4_text", "attention_bias"}},
      {[](json& c) { c["num_experts_per_tok"] = 9; }, {"llama4_text", "num_experts_per_tok"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    const fs::path dir = fixture_with_config("llama4", "llama4-bad", cases[i].first);
    auto backend = make_cpu_backend();
    const std::string msg = expect_error([&] { load_model(dir, *backend); }, Status::corrupt, cases[i].second);
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace
