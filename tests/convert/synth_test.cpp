// sluice synth: tiny synthetic packs written end to end (verify passes, the family loads them
// at every kind, a forward pass is finite and not degenerate), dequantized expert weights
// with the intended spread, bytes independent of batching, the full-size plans of
// qwen3-30b-a3b and qwen4-exp with their real shapes, overwrite protection, and the command
// line (synth, verify, run; unknown --like lists the known names).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <tuple>
#include <thread>

#include "tests/models/fixture_util.h"
#include "tests/tools/cli/cli_util.h"
#include "convert/synth.h"
#include "core/quant.h"
#include "format/json_file.h"
#include "format/pack.h"
#include "tests/format/format_test_util.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

SynthOptions kinds(std::vector<DType> k) {
  SynthOptions o;
  o.kinds = std::move(k);
  return o;
}

struct Stats {
  double mean = 0, std = 0;
  bool finite = true;
};

Stats stats(std::span<const float> v) {
  Stats s;
  double sum = 0, sq = 0;
  for (float x : v) {
    s.finite = s.finite && std::isfinite(x);
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  s.mean = sum / static_cast<double>(v.size());
  s.std = std::sqrt(std::max(0.0, sq / static_cast<double>(v.size()) - s.mean * s.mean));
  return s;
}

// Loads the pack at `kind`, runs a prompt and one more token, and checks the logits.
void expect_forward_sane(const fs::path& pack, DType kind) {
  SCOPED_TRACE(expert_kind_name(kind));
  auto backend = make_cpu_backend();
  LoadOptions lo;
  lo.expert_kind = kind;
  LoadedModel m = load_model(pack, *backend, lo);
  const int64_t V = m.model->info().n_vocab;
  auto state = m.model->new_state(16);
  const std::vector<int32_t> prompt = {1, 2, 3, 400};
  std::vector<float> logits(static_cast<size_t>(V * 4));
  m.model->forward(prompt, *state, logits, true);
  Stats s = stats(logits);
  EXPECT_TRUE(s.finite);
  // Not degenerate: logits spread (random weights give std ~1) and differ between positions.
  EXPECT_GT(s.std, 0.05);
  EXPECT_LT(s.std, 50.0);
  EXPECT_NE(std::vector<float>(logits.begin(), logits.begin() + V), std::vector<float>(logits.begin() + V, logits.begin() + 2 * V));
  const std::vector<int32_t> next = {7};
  std::vector<float> one(static_cast<size_t>(V));
  m.model->forward(next, *state, one, false);
  EXPECT_TRUE(stats(one).finite);
}

TEST(Synth, TinyQwen3MoeWritesVerifiesLoadsAndRuns) {
  ScratchDir d;
  const fs::path out = d / "pack";
  SynthSummary s = synth_pack(synth_preset_config("tiny-qwen3-moe"), out,
                              kinds({DType::bf16, DType::q8, DType::q4, DType::q2}));
  EXPECT_EQ(s.family, "qwen3_moe");
  EXPECT_EQ(s.n_records, 2 * 8);  // layer 1 is a dense-MLP layer (mlp_only_layers)
  EXPECT_FALSE(fs::exists(d / (".pack.partial-" + std::to_string(::getpid()))));

  PackVerifyResult v = verify_pack(out);
  EXPECT_TRUE(v.ok) << (v.problems.empty() ? "" : v.problems.front());
  EXPECT_EQ(v.records_checked, 4u * 16u);

  std::shared_ptr<Pack> pack = Pack::open(out);
  const PackManifest& m = pack->manifest();
  EXPECT_EQ(m.moe_layers, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(m.expert_prefixes[1], "model.layers.2.mlp.experts.");
  EXPECT_EQ(m.expert_sources[0], "gate_proj,up_proj,down_proj");
  EXPECT_EQ(m.n_ff, 40);
  EXPECT_TRUE(pack->has_dense("model.layers.1.mlp.gate_proj.weight"));  // the dense MLP
  EXPECT_TRUE(pack->has_dense("model.layers.0.self_attn.q_norm.weight"));
  for (const auto& [kind, info] : m.kinds) {
    // Exactly convert's layout for this expert size.
    PackKindInfo want = pack_kind_layout(kind, 64, 40);
    EXPECT_EQ(info.record_stride, want.record_stride);
    EXPECT_EQ(info.down.scale_offset, want.down.scale_offset);
    EXPECT_EQ(info.record_stride % kPackRecordAlign, 0u);
  }
  // Norm weights ~1, other dense weights ~N(0, 0.02).
  auto dense_stats = [&](const std::string& name) {
    Tensor t = pack->dense(name);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_f32(t.ptr<uint16_t>()[i]);
    return stats(v);
  };
  EXPECT_NEAR(dense_stats("model.layers.0.input_layernorm.weight").mean, 1.0, 0.02);
  Stats emb = dense_stats("model.embed_tokens.weight");
  EXPECT_NEAR(emb.mean, 0.0, 0.002);
  EXPECT_NEAR(emb.std, 0.02, 0.002);

  for (DType k : {DType::bf16, DType::q8, DType::q4, DType::q2}) expect_forward_sane(out, k);
}

TEST(Synth, TinyQwen4ExpWritesVerifiesLoadsAndRuns) {
  ScratchDir d;
  const fs::path out = d / "pack";
  synth_pack(synth_preset_config("tiny-qwen4-exp"), out, kinds({DType::q4, DType::q2}));
  EXPECT_TRUE(verify_pack(out).ok);
  std::shared_ptr<Pack> pack = Pack::open(out);
  const PackManifest& m = pack->manifest();
  EXPECT_EQ(m.family, "qwen4_exp");
  EXPECT_TRUE(m.config.contains("text_config"));
  EXPECT_EQ(m.moe_layers, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(m.expert_prefixes[0], "model.language_model.layers.0.mlp.experts.");
  EXPECT_TRUE(pack->has_dense("model.language_model.layers.3.self_attn.q_proj.weight"));
  EXPECT_TRUE(pack->has_dense("model.language_model.layers.0.linear_attn.A_log"));
  EXPECT_TRUE(pack->has_dense("model.language_model.hyper_connection_mixer.hc_norm.weight"));
  // Zero-centered norms (the loader adds 1) are stored near 0; the gated DeltaNet norm near 1.
  auto mean_of = [&](const std::string& name) {
    Tensor t = pack->dense(name);
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += bf16_to_f32(t.ptr<uint16_t>()[i]);
    return s / static_cast<double>(t.numel());
  };
  EXPECT_NEAR(mean_of("model.language_model.layers.0.attn_hyper_connection.hc_norm.weight"), 0.0, 0.01);
  EXPECT_NEAR(mean_of("model.language_model.layers.3.self_attn.q_norm.weight"), 0.0, 0.02);
  EXPECT_NEAR(mean_of("model.language_model.layers.0.linear_attn.norm.weight"), 1.0, 0.02);
  EXPECT_NEAR(mean_of("model.language_model.layers.0.linear_attn.dt_bias"), 1.0, 1e-6);
  for (DType k : {DType::q4, DType::q2}) expect_forward_sane(out, k);
}

// gpt-oss: sinks and router biases among the dense tensors, expert records with the three
// biases (version 4), zero as transformers initializes them, mxfp4 beside q4; it runs.
TEST(Synth, TinyGptOssWritesVerifiesLoadsAndRuns) {
  ScratchDir d;
  const fs::path out = d / "pack";
  synth_pack(synth_preset_config("tiny-gpt-oss"), out, kinds({DType::q4, DType::mxfp4}));
  EXPECT_TRUE(verify_pack(out).ok);
  std::shared_ptr<Pack> pack = Pack::open(out);
  const PackManifest& m = pack->manifest();
  EXPECT_EQ(m.family, "gpt_oss");
  EXPECT_EQ(m.version, 4);
  EXPECT_EQ(m.expert_sources[0], "gpt_oss");
  EXPECT_TRUE(pack->has_dense("model.layers.2.self_attn.sinks"));
  EXPECT_TRUE(pack->has_dense("model.layers.0.mlp.router.bias"));
  for (DType k : {DType::q4, DType::mxfp4}) {
    const PackKindInfo& info = pack->kind(k);
    ASSERT_TRUE(info.has_biases());
    EXPECT_EQ(info.record_stride, pack_kind_layout(k, 64, 64, true).record_stride);
    for (int64_t r = 0; r < m.n_records(); ++r) {
      const ExpertWeights w = expert_view(info, pack->mapped_record(k, r).data());
      for (const Tensor* b : {&w.gate_bias, &w.up_bias, &w.down_bias})
        for (int64_t i = 0; i < b->numel(); ++i) ASSERT_EQ(b->ptr<float>()[i], 0.0f);
    }
    expect_forward_sane(out, k);
  }
  // The real models' plans: records of the published sizes.
  for (const auto& [like, layers, experts] : {std::tuple{"gpt-oss-120b", 36, 128}, {"gpt-oss-20b", 24, 32}}) {
    const SynthPlan plan = synth_plan(synth_preset_config(like), {DType::mxfp4});
    EXPECT_EQ(plan.manifest.n_records(), layers * experts) << like;
    EXPECT_EQ(plan.manifest.n_embd, 2880) << like;
    EXPECT_EQ(plan.manifest.n_ff, 2880) << like;
  }
}

// Gemma 4: norms near one (the _1 / _2 norms too), the router scales and layer scalars
// exactly one, no k/v projections on the KV-shared layers, no v projection on full layers
// (keys as values); it runs.
TEST(Synth, Gemma4PublishedPlan) {
  const SynthPlan p = synth_plan(synth_preset_config("gemma4-26b-a4b"), {DType::q4});
  const PackManifest& m = p.manifest;
  EXPECT_EQ(m.family, "gemma4");
  EXPECT_EQ(m.n_records(), 30 * 128);
  EXPECT_EQ(m.n_embd, 2816);
  EXPECT_EQ(m.n_ff, 704);
  EXPECT_EQ(m.expert_prefixes[0], "model.language_model.layers.0.experts.");
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const PackDenseTensor& t : m.dense) shapes[t.name] = t.shape;
  const std::string l0 = "model.language_model.layers.0.", l5 = "model.language_model.layers.5.";
  EXPECT_EQ(shapes[l0 + "self_attn.k_proj.weight"], (std::vector<int64_t>{8 * 256, 2816}));
  EXPECT_EQ(shapes[l0 + "self_attn.v_proj.weight"], (std::vector<int64_t>{8 * 256, 2816}));
  EXPECT_EQ(shapes[l5 + "self_attn.q_proj.weight"], (std::vector<int64_t>{16 * 512, 2816}));
  EXPECT_EQ(shapes[l5 + "self_attn.k_proj.weight"], (std::vector<int64_t>{2 * 512, 2816}));
  EXPECT_FALSE(shapes.count(l5 + "self_attn.v_proj.weight"));  // keys as values
  EXPECT_EQ(shapes[l0 + "mlp.gate_proj.weight"], (std::vector<int64_t>{2112, 2816}));
  EXPECT_EQ(shapes[l0 + "router.proj.weight"], (std::vector<int64_t>{128, 2816}));
  EXPECT_EQ(shapes["model.language_model.embed_tokens.weight"], (std::vector<int64_t>{262144, 2816}));
  std::printf("gemma4-26b-a4b q4: dense.bin %.3f GB, experts.q4.bin %.3f GB, total %.3f GB\n", p.dense_bytes / 1e9,
              p.expert_bytes / 1e9, p.total_bytes() / 1e9);
}

TEST(Synth, TinyGemma4WritesVerifiesLoadsAndRuns) {
  ScratchDir d;
  const fs::path out = d / "pack";
  synth_pack(synth_preset_config("tiny-gemma4"), out, kinds({DType::q4}));
  EXPECT_TRUE(verify_pack(out).ok);
  std::shared_ptr<Pack> pack = Pack::open(out);
  const PackManifest& m = pack->manifest();
  EXPECT_EQ(m.family, "gemma4_text");
  EXPECT_EQ(m.moe_layers.size(), 6u);
  auto values = [&](const std::string& name) {
    Tensor t = pack->dense(name);
    std::vector<float> v;
    for (int64_t i = 0; i < t.numel(); ++i) v.push_back(bf16_to_f32(t.ptr<uint16_t>()[i]));
    return v;
  };
  auto mean = [](const std::vector<float>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()); };
  EXPECT_NEAR(mean(values("model.layers.0.post_feedforward_layernorm_1.weight")), 1.0, 0.01);
  EXPECT_NEAR(mean(values("model.layers.1.self_attn.k_norm.weight")), 1.0, 0.02);
  for (const char* ones : {"model.layers.0.router.scale", "model.layers.0.router.per_expert_scale", "model.layers.5.layer_scalar"})
    for (float v : values(ones)) ASSERT_EQ(v, 1.0f) << ones;
  EXPECT_TRUE(pack->has_dense("model.layers.0.self_attn.v_proj.weight"));   // sliding: its own values
  EXPECT_FALSE(pack->has_dense("model.layers.1.self_attn.v_proj.weight"));  // full: keys as values
  EXPECT_FALSE(pack->has_dense("model.layers.4.self_attn.k_proj.weight"));  // KV-shared
  EXPECT_EQ(pack->dense("model.layers.1.self_attn.k_proj.weight").rows(), 32);  // one head of 32
  EXPECT_EQ(pack->dense("model.layers.5.mlp.gate_proj.weight").rows(), 96);    // double-wide
  expect_forward_sane(out, DType::q4);
}

// --dense int8 / q4 / f32: the matrices quantized (rows of the expert records' random
// packed values, dequantizing to a spread of about 0.02), everything else bf16 (f32 for
// --dense f32); the pack verifies, loads, runs, and its bytes are a function of the seed.
TEST(Synth, DenseDtypes) {
  ScratchDir d;
  for (const char* like : {"tiny-qwen3-moe", "tiny-qwen4-exp"}) {
    for (DType dense : {DType::q8, DType::q4, DType::f32}) {
      SCOPED_TRACE(str(like, " --dense ", dense_dtype_name(dense)));
      const fs::path out = d / str(like, "-", dense_dtype_name(dense));
      SynthOptions o = kinds({DType::q4});
      o.dense = dense;
      o.batch_bytes = 64 << 10;  // many dense.bin chunks: rows of quantized tensors cut by chunk and piece boundaries
      synth_pack(synth_preset_config(like), out, o);
      EXPECT_TRUE(verify_pack(out).ok);
      std::shared_ptr<Pack> pack = Pack::open(out);
      const PackManifest& m = pack->manifest();
      EXPECT_EQ(m.version, dtype_is_quantized(dense) ? 3 : 1);
      int n_quantized = 0;
      for (const PackDenseTensor& t : m.dense) {
        if (!dtype_is_quantized(t.dtype)) {
          EXPECT_EQ(t.dtype, dense == DType::f32 ? DType::f32 : DType::bf16) << t.name;
          continue;
        }
        ++n_quantized;
        EXPECT_EQ(t.dtype, dense) << t.name;
        EXPECT_EQ(t.name.find("norm"), std::string::npos) << t.name;
        EXPECT_EQ(t.name.find("A_log"), std::string::npos) << t.name;
        EXPECT_EQ(t.name.find("conv1d"), std::string::npos) << t.name;
      }
      if (dtype_is_quantized(dense)) {
        const std::string emb = m.family == "qwen3_moe" ? "model.embed_tokens.weight" : "model.language_model.embed_tokens.weight";
        Tensor t = pack->dense(emb);
        ASSERT_EQ(t.dtype, dense);
        std::vector<float> v(static_cast<size_t>(t.numel()));
        for (int64_t r = 0; r < t.rows(); ++r)
          dequantize_row(t.dtype, static_cast<const uint8_t*>(t.data) + r * quant_row_bytes(t.dtype, t.cols()),
                         static_cast<const uint8_t*>(t.scales) + r * quant_scale_row_bytes(t.dtype, t.cols()), t.cols(),
                         v.data() + r * t.cols());
        Stats st = stats(v);
        EXPECT_NEAR(st.mean, 0.0, 0.002);
        EXPECT_NEAR(st.std, 0.02, 0.003);
        EXPECT_GE(n_quantized, 8);
      }
      expect_forward_sane(out, DType::q4);
    }
  }
  // The bytes do not depend on the chunking (rows cut differently) nor the thread count.
  SynthOptions a = kinds({DType::q4});
  a.dense = DType::q4;
  synth_pack(synth_preset_config("tiny-qwen3-moe"), d / "whole", a);
  EXPECT_EQ(read_bytes(d / "whole" / kPackDenseName), read_bytes(d / "tiny-qwen3-moe-q4" / kPackDenseName));
}

// Dequantized expert weights of every kind have a standard deviation of about 0.02 (the
// scale rules in synth.cpp), mean about 0.
TEST(Synth, ExpertWeightsHaveTheIntendedSpread) {
  ScratchDir d;
  nlohmann::json config = synth_preset_config("tiny-qwen3-moe");
  config["hidden_size"] = 256;  // more weights per record: tighter estimates
  synth_pack(config, d / "pack", kinds({DType::bf16, DType::q8, DType::q4, DType::q2}));
  std::shared_ptr<Pack> pack = Pack::open(d / "pack");
  for (const auto& [kind, info] : pack->manifest().kinds) {
    SCOPED_TRACE(expert_kind_name(kind));
    std::vector<float> all;
    for (int64_t rec : {0, 5, 15}) {
      std::span<const uint8_t> r = pack->mapped_record(kind, rec);
      for (const PackBlock* b : {&info.gate, &info.up, &info.down}) {
        const DType dt = kind;
        std::vector<float> row(static_cast<size_t>(b->cols));
        for (int64_t i = 0; i < b->rows; ++i) {
          if (dt == DType::bf16) {
            const auto* p = reinterpret_cast<const uint16_t*>(r.data() + b->offset) + i * b->cols;
            for (int64_t c = 0; c < b->cols; ++c) row[static_cast<size_t>(c)] = bf16_to_f32(p[c]);
          } else {
            dequantize_row(dt, r.data() + b->offset + i * quant_row_bytes(dt, b->cols),
                           r.data() + b->scale_offset + i * quant_scale_row_bytes(dt, b->cols), b->cols, row.data());
          }
          all.insert(all.end(), row.begin(), row.end());
        }
      }
    }
    Stats s = stats(all);
    EXPECT_TRUE(s.finite);
    EXPECT_NEAR(s.mean, 0.0, 0.002);
    EXPECT_NEAR(s.std, 0.02, 0.002);
  }
}

// The bytes are a function of the seed alone: another batch size gives the same checksums;
// another seed gives other ones.
TEST(Synth, BytesDependOnlyOnTheSeed) {
  ScratchDir d;
  const nlohmann::json config = synth_preset_config("tiny-qwen3-moe");
  SynthOptions a = kinds({DType::q4, DType::q2});
  SynthOptions b = a;
  b.batch_bytes = 1;  // one record per batch, dense.bin in 4 KiB chunks
  SynthOptions c = a;
  c.seed = 2;
  synth_pack(config, d / "a", a);
  synth_pack(config, d / "b", b);
  synth_pack(config, d / "c", c);
  const PackManifest ma = Pack::open(d / "a")->manifest(), mb = Pack::open(d / "b")->manifest(),
                     mc = Pack::open(d / "c")->manifest();
  EXPECT_EQ(ma.dense_checksum, mb.dense_checksum);
  EXPECT_EQ(pack_manifest_to_json(ma), pack_manifest_to_json(mb));
  EXPECT_NE(ma.dense_checksum, mc.dense_checksum);
  EXPECT_NE(ma.kinds.at(DType::q4).checksums, mc.kinds.at(DType::q4).checksums);
}

// The full-size models, planned (nothing written): real names, shapes and file sizes.
TEST(Synth, FullSizePlans) {
  {
    SynthPlan p = synth_plan(synth_preset_config("qwen3-30b-a3b"), {DType::q4});
    const PackManifest& m = p.manifest;
    EXPECT_EQ(m.family, "qwen3_moe");
    EXPECT_EQ(m.moe_layers.size(), 48u);
    EXPECT_EQ(m.n_expert, 128);
    EXPECT_EQ(m.n_embd, 2048);
    EXPECT_EQ(m.n_ff, 768);
    const PackKindInfo& q4 = m.kinds.at(DType::q4);
    EXPECT_EQ(q4.record_stride, 2654208u);  // 3 x (768 x 2048 x 4.5 bits), already 4 KiB-aligned
    EXPECT_EQ(p.expert_bytes, uint64_t{4096} + uint64_t{6144} * 2654208);
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const PackDenseTensor& t : m.dense) shapes[t.name] = t.shape;
    EXPECT_EQ(shapes.size(), 3u + 48u * 9u);  // embed, norm, lm_head; per layer 2 norms, q k v o, q/k norm, router
    EXPECT_EQ(shapes["model.embed_tokens.weight"], (std::vector<int64_t>{151936, 2048}));
    EXPECT_EQ(shapes["lm_head.weight"], (std::vector<int64_t>{151936, 2048}));
    EXPECT_EQ(shapes["model.layers.47.self_attn.q_proj.weight"], (std::vector<int64_t>{4096, 2048}));
    EXPECT_EQ(shapes["model.layers.47.self_attn.k_proj.weight"], (std::vector<int64_t>{512, 2048}));
    EXPECT_EQ(shapes["model.layers.0.self_attn.q_norm.weight"], (std::vector<int64_t>{128}));
    EXPECT_EQ(shapes["model.layers.0.mlp.gate.weight"], (std::vector<int64_t>{128, 2048}));
    std::printf("qwen3-30b-a3b q4: dense.bin %.3f GB, experts.q4.bin %.3f GB, total %.3f GB\n", p.dense_bytes / 1e9,
                p.expert_bytes / 1e9, p.total_bytes() / 1e9);
  }
  {
    SynthPlan p = synth_plan(synth_preset_config("qwen4-exp"), {DType::q4});
    const PackManifest& m = p.manifest;
    EXPECT_EQ(m.family, "qwen4_exp");
    EXPECT_EQ(m.moe_layers.size(), 40u);
    EXPECT_EQ(m.n_expert, 512);
    EXPECT_EQ(m.n_ff, 512);
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const PackDenseTensor& t : m.dense) shapes[t.name] = t.shape;
    const std::string p3 = "model.language_model.layers.3.", p0 = "model.language_model.layers.0.";
    EXPECT_EQ(shapes["model.language_model.embed_tokens.weight"], (std::vector<int64_t>{248320, 2048}));
    EXPECT_EQ(shapes[p3 + "self_attn.q_proj.weight"], (std::vector<int64_t>{2 * 16 * 256, 2048}));  // query and gate
    EXPECT_EQ(shapes[p3 + "self_attn.k_proj.weight"], (std::vector<int64_t>{2 * 256, 2048}));
    EXPECT_EQ(shapes[p0 + "linear_attn.in_proj_qkv.weight"], (std::vector<int64_t>{2 * 16 * 128 + 32 * 128, 2048}));
    EXPECT_EQ(shapes[p0 + "linear_attn.conv1d.weight"], (std::vector<int64_t>{2 * 16 * 128 + 32 * 128, 1, 4}));
    EXPECT_EQ(shapes[p0 + "attn_hyper_connection.input_mix_weight_down.weight"], (std::vector<int64_t>{320, 4 * 2048}));
    EXPECT_EQ(shapes[p0 + "mlp.shared_expert.gate_proj.weight"], (std::vector<int64_t>{512, 2048}));
    EXPECT_EQ(shapes[p0 + "mlp.gate.weight"], (std::vector<int64_t>{512, 2048}));
    EXPECT_FALSE(shapes.count(p3 + "self_attn.indexer.index_qk_proj.weight"));  // no QSA by default
    EXPECT_FALSE(shapes.count(p0 + "ple.key_proj.weight"));                     // no PLE by default
    std::printf("qwen4-exp q4: dense.bin %.3f GB, experts.q4.bin %.3f GB, total %.3f GB\n", p.dense_bytes / 1e9,
                p.expert_bytes / 1e9, p.total_bytes() / 1e9);
  }
}

// The giant families' tiny presets: synthesized, verified, loaded and run (latent attention,
// the group-limited router with its correction bias, dense leading layers, shared experts).
TEST(Synth, TinyGiantFamiliesWriteVerifyLoadAndRun) {
  for (const auto& [like, family, moe_layers] :
       {std::tuple<const char*, const char*, size_t>{"tiny-deepseek-v3", "deepseek_v3", 3},
        {"tiny-glm-4.5", "glm4_moe", 2}, {"tiny-minimax-m2", "minimax_m2", 3}}) {
    SCOPED_TRACE(like);
    ScratchDir d;
    const fs::path out = d / "pack";
    synth_pack(synth_preset_config(like), out, kinds({DType::q4}));
    EXPECT_TRUE(verify_pack(out).ok);
    std::shared_ptr<Pack> pack = Pack::open(out);
    EXPECT_EQ(pack->manifest().family, family);
    EXPECT_EQ(pack->manifest().moe_layers.size(), moe_layers);
    expect_forward_sane(out, DType::q4);
  }
}

// The published shapes: DeepSeek-V3's 3 dense + 58 MoE layers of 256 experts of [2048, 7168]
// and its latent attention's tensors; the 11-layer slice the benchmarks run (3 dense + 8 MoE);
// Kimi K2's 384 experts and 64 heads; GLM-4.5's 89 MoE layers of 160 experts; MiniMax-M2's 62
// of 256.
TEST(Synth, GiantFamiliesPublishedPlans) {
  struct Want {
    const char* like;
    std::optional<int64_t> layers;
    const char* family;
    size_t moe_layers;
    int64_t n_expert, n_embd, n_ff;
  };
  for (const Want& w : {Want{"deepseek-v3", {}, "deepseek_v3", 58, 256, 7168, 2048},
                        Want{"deepseek-v3", 11, "deepseek_v3", 8, 256, 7168, 2048},
                        Want{"kimi-k2", {}, "kimi_k2", 60, 384, 7168, 2048},
                        Want{"glm-4.5", {}, "glm4_moe", 89, 160, 5120, 1536},
                        Want{"minimax-m2", {}, "minimax_m2", 62, 256, 3072, 1536}}) {
    SCOPED_TRACE(w.like);
    json config = synth_preset_config(w.like);
    if (w.layers) synth_scale_config(config, w.layers, std::nullopt);
    SynthPlan p = synth_plan(config, {DType::q4});
    const PackManifest& m = p.manifest;
    EXPECT_EQ(m.family, w.family);
    EXPECT_EQ(m.moe_layers.size(), w.moe_layers);
    EXPECT_EQ(m.n_expert, w.n_expert);
    EXPECT_EQ(m.n_embd, w.n_embd);
    EXPECT_EQ(m.n_ff, w.n_ff);
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const PackDenseTensor& t : m.dense) shapes[t.name] = t.shape;
    if (std::string(w.family) == "deepseek_v3") {
      const std::string a = "model.layers.0.self_attn.";
      EXPECT_EQ(shapes[a + "q_a_proj.weight"], (std::vector<int64_t>{1536, 7168}));
      EXPECT_EQ(shapes[a + "q_b_proj.weight"], (std::vector<int64_t>{128 * 192, 1536}));
      EXPECT_EQ(shapes[a + "kv_a_proj_with_mqa.weight"], (std::vector<int64_t>{576, 7168}));
      EXPECT_EQ(shapes[a + "kv_b_proj.weight"], (std::vector<int64_t>{128 * 256, 512}));
      EXPECT_EQ(shapes["model.layers.3.mlp.gate.e_score_correction_bias"], (std::vector<int64_t>{256}));
      EXPECT_EQ(shapes["model.layers.3.mlp.shared_experts.gate_proj.weight"], (std::vector<int64_t>{2048, 7168}));
      EXPECT_EQ(shapes["model.layers.2.mlp.gate_proj.weight"], (std::vector<int64_t>{18432, 7168}));  // dense
    }
    std::printf("%s%s q4: dense.bin %.3f GB, experts.q4.bin %.3f GB, total %.3f GB\n", w.like,
                w.layers ? str(" --layers ", *w.layers).c_str() : "", p.dense_bytes / 1e9, p.expert_bytes / 1e9,
                p.total_bytes() / 1e9);
  }
}

// --experts on a group-limited router keeps its config valid: the most groups that divide the
// experts into groups of two or more, enough of them kept for the top-k.
TEST(Synth, FewerExpertsKeepTheGroupsValid) {
  for (const auto& [experts, groups, keep] : {std::tuple<int64_t, int64_t, int64_t>{10, 5, 4}, {16, 8, 4}, {9, 3, 3},
                                              {7, 1, 1}, {64, 8, 4}}) {
    json config = synth_preset_config("deepseek-v3");
    synth_scale_config(config, 4, experts);
    EXPECT_EQ(config["n_group"], groups) << experts;
    EXPECT_EQ(config["topk_group"], keep) << experts;
    EXPECT_EQ(synth_plan(config, {DType::q4}).manifest.n_expert, experts);
  }
}

TEST(Synth, ScaleConfigShrinksLayersAndExperts) {
  json c = synth_preset_config("qwen4-exp");
  synth_scale_config(c, 6, 16);
  const json& t = c["text_config"];
  EXPECT_EQ(t["num_hidden_layers"], 6);
  EXPECT_EQ(t["layer_types"].size(), 6u);
  EXPECT_EQ(t["num_experts"], 16);
  EXPECT_EQ(t["num_experts_per_tok"], 10);
  synth_scale_config(c, std::nullopt, 4);
  EXPECT_EQ(c["text_config"]["num_experts_per_tok"], 4);  // capped to the experts left
  SynthPlan p = synth_plan(c, {DType::q2});
  EXPECT_EQ(p.manifest.n_records(), 6 * 4);
  json q = synth_preset_config("tiny-qwen3-moe");
  synth_scale_config(q, 1, std::nullopt);
  EXPECT_EQ(q["mlp_only_layers"], json::array());
  expect_error([&] { synth_scale_config(q, 2, std::nullopt); }, Status::invalid_argument, {"--layers 2", "[1, 1]"});
  expect_error([&] { synth_scale_config(q, std::nullopt, 9); }, Status::invalid_argument, {"--experts 9"});
  // Per-layer lists and Gemma 4's KV-shared layers follow the cut; the cut configs plan.
  json l4 = synth_preset_config("llama4-scout");
  synth_scale_config(l4, 8, 4);
  EXPECT_EQ(l4["text_config"]["no_rope_layers"].size(), 8u);
  const SynthPlan scout = synth_plan(l4, {DType::q4});
  EXPECT_EQ(scout.manifest.n_records(), 8 * 4);
  EXPECT_EQ(scout.manifest.family, "llama4");
  EXPECT_EQ(scout.manifest.expert_prefixes[0], "language_model.model.layers.0.feed_forward.experts.");
  json g4 = synth_preset_config("tiny-gemma4");
  synth_scale_config(g4, 3, 1);
  EXPECT_EQ(g4["num_kv_shared_layers"], 1);
  EXPECT_EQ(g4["top_k_experts"], 1);
  EXPECT_EQ(synth_plan(g4, {DType::q4}).manifest.n_records(), 3 * 1);
}

TEST(Synth, RefusesToOverwriteWithoutForce) {
  ScratchDir d;
  const json config = synth_preset_config("tiny-qwen3-moe");
  synth_pack(config, d / "pack", kinds({DType::q4}));
  expect_error([&] { synth_pack(config, d / "pack", kinds({DType::q2})); }, Status::invalid_argument,
               {"already holds a pack", "--force"});
  EXPECT_TRUE(Pack::open(d / "pack")->has_kind(DType::q4));  // untouched
  fs::create_directories(d / "other");
  write_bytes(d / "other" / "notes.txt", "mine");
  expect_error([&] { synth_pack(config, d / "other", kinds({DType::q4})); }, Status::invalid_argument,
               {"not a sluice pack", "refusing"});
  SynthOptions force = kinds({DType::q2});
  force.force = true;
  synth_pack(config, d / "pack", force);
  std::shared_ptr<Pack> p = Pack::open(d / "pack");
  EXPECT_TRUE(p->has_kind(DType::q2));
  EXPECT_FALSE(p->has_kind(DType::q4));
  for (const auto& e : fs::directory_iterator(d.path()))  // no staging directory left behind
    EXPECT_EQ(e.path().filename().string().find(".partial-"), std::string::npos) << e.path();
}

// Unknown names list the known ones; configs synth cannot imitate say why.
TEST(Synth, UnknownLikeListsTheKnownNames) {
  expect_error([] { synth_preset_config("qwen9-1t"); }, Status::invalid_argument,
               {"qwen9-1t", "qwen3-30b-a3b", "qwen4-exp", "tiny-qwen3-moe", "tiny-qwen4-exp"});
  json dense_only = synth_preset_config("tiny-qwen3-moe");
  dense_only["mlp_only_layers"] = {0, 1, 2};
  expect_error([&] { synth_plan(dense_only, {DType::q4}); }, Status::unsupported, {"no routed experts"});
  const json ple = read_json_file(sluice::test::source_dir() / "tests/fixtures/qwen4_exp_ple/config.json");
  expect_error([&] { synth_plan(ple, {DType::q4}); }, Status::unsupported, {"ngram_embedding", "ple_layer_ids"});
  json bad = synth_preset_config("tiny-qwen3-moe");
  bad["num_experts_per_tok"] = 99;
  expect_error([&] { synth_plan(bad, {DType::q4}); }, Status::corrupt, {"num_experts_per_tok (99)"});
}

// ---- the command line ----

// Runs the sluice binary (cli_util.h), its output beside the test's files.
CliRun sluice(const ScratchDir& d, const std::vector<std::string>& args, const std::function<void(pid_t)>& on_start = {}) {
  static int counter = 0;
  const fs::path io = d / ("io" + std::to_string(counter++));
  fs::create_directories(io);
  return run_cli(args, io, on_start);
}

TEST(SynthCli, SynthVerifyRun) {
  ScratchDir d;
  const std::string pack = (d / "tiny").string();
  CliRun s = sluice(d, {"synth", "--like", "tiny-qwen3-moe", "--kinds", "q4,q2", pack});
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_NE(s.err.find("synth: 100%"), std::string::npos) << s.err;  // plain progress lines: stderr is a file
  EXPECT_NE(s.err.find("16/16 records"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("sluice: synthesized tiny-qwen3-moe (qwen3_moe)"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("MB/s"), std::string::npos) << s.err;
  CliRun v = sluice(d, {"verify", pack});
  EXPECT_EQ(v.status, 0) << v.err;
  EXPECT_NE(v.err.find(": ok (32 records"), std::string::npos) << v.err;
  CliRun r = sluice(d, {"run", "--model", pack, "--tokens", "1,2,3", "-n", "4", "--expert-kind", "q4", "--print-ids"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("q4 experts"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generated 4 tokens"), std::string::npos) << r.err;
  CliRun r2 = sluice(d, {"run", "--model", pack, "--tokens", "1,2,3", "-n", "2", "--expert-kind", "q2"});
  EXPECT_EQ(r2.status, 0) << r2.err;

  // Again without --force: one clear line, the pack untouched; with --force it is replaced.
  CliRun again = sluice(d, {"synth", "--like", "tiny-qwen3-moe", "-q", pack});
  EXPECT_EQ(again.status, 1);
  EXPECT_NE(again.err.find("sluice: error: synth: "), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("already holds a pack; pass --force"), std::string::npos) << again.err;
  EXPECT_TRUE(Pack::open(pack)->has_kind(DType::q2));
  CliRun forced = sluice(d, {"synth", "--like", "tiny-qwen4-exp", "--layers", "2", "--experts", "4", "--force", "-q", pack});
  ASSERT_EQ(forced.status, 0) << forced.err;
  EXPECT_EQ(Pack::open(pack)->manifest().n_records(), 2 * 4);
  EXPECT_EQ(sluice(d, {"verify", "-q", pack}).status, 0);
}

TEST(SynthCli, BadInputGivesOneClearLine) {
  ScratchDir d;
  CliRun u = sluice(d, {"synth", "--like", "nonesuch", (d / "x").string()});
  EXPECT_EQ(u.status, 1);
  for (const char* s : {"sluice: error: ", "unknown model 'nonesuch'", "qwen3-30b-a3b", "qwen4-exp", "tiny-qwen3-moe"})
    EXPECT_NE(u.err.find(s), std::string::npos) << s << " in: " << u.err;
  CliRun k = sluice(d, {"synth", "--like", "tiny-qwen3-moe", "--kinds", "q3", (d / "x").string()});
  EXPECT_NE(k.err.find("unknown expert kind 'q3'"), std::string::npos) << k.err;
  CliRun q = sluice(d, {"synth", "--like", "tiny-qwen3-moe", "--dense", "q3", (d / "x").string()});
  EXPECT_EQ(q.status, 1);
  EXPECT_NE(q.err.find("--dense: 'q3' is not bf16, f32, int8 or q4"), std::string::npos) << q.err;
  EXPECT_EQ(std::count(q.err.begin(), q.err.end(), '\n'), 1) << q.err;
  CliRun n = sluice(d, {"synth", (d / "x").string()});
  EXPECT_NE(n.err.find("--like NAME or --config FILE"), std::string::npos) << n.err;
  EXPECT_FALSE(fs::exists(d / "x"));
}

// --dry-run prints the sizes of the full-size packs without writing anything.
TEST(SynthCli, DryRunPrintsTheSizes) {
  ScratchDir d;
  CliRun r = sluice(d, {"synth", "--like", "qwen3-30b-a3b", "--kinds", "q4,q2", "--dry-run"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("experts.q4.bin"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::to_string(uint64_t{4096} + uint64_t{6144} * 2654208)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("48 MoE layers x 128 experts of [768, 2048]"), std::string::npos) << r.out;
}

// Bounded memory and a clean interrupt, on a ~580 MB pack from --config: peak RSS is two
// batches of 64 MB plus the program (about 140 MB measured), far below the pack; SIGINT part
// way leaves neither the output nor its staging directory.
TEST(SynthCli, MemoryStaysBoundedAndSigintLeavesNothing) {
  ScratchDir d;
  json c = synth_preset_config("tiny-qwen3-moe");
  c.update(json{{"vocab_size", 32000}, {"hidden_size", 1024}, {"num_hidden_layers", 4}, {"mlp_only_layers", json::array()},
                {"num_attention_heads", 8}, {"head_dim", 128}, {"moe_intermediate_size", 512}, {"num_experts", 64}});
  std::ofstream(d / "config.json") << c.dump(1);
  SynthPlan plan = synth_plan(c, {DType::q4, DType::q2});
  ASSERT_GT(plan.total_bytes(), 400'000'000u);
  CliRun r = sluice(d, {"synth", "--config", (d / "config.json").string(), "--kinds", "q4,q2", "-q", (d / "pack").string()});
  ASSERT_EQ(r.status, 0) << r.err;
  std::printf("synth of a %.0f MB pack: peak RSS %.1f MB\n", plan.total_bytes() / 1e6, r.max_rss_kb / 1024.0);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // shadow memory is not the tool's
  EXPECT_LT(static_cast<uint64_t>(r.max_rss_kb) * 1024, plan.total_bytes() / 2);
#endif
  EXPECT_EQ(fs::file_size(d / "pack" / "experts.q2.bin"), plan.manifest.kinds.at(DType::q2).record_stride * 256 + 4096);
  EXPECT_TRUE(verify_pack(d / "pack").ok);

  CliRun i = sluice(d, {"synth", "--config", (d / "config.json").string(), "--kinds", "q4,q2", "-q", (d / "pack2").string()},
                    [&](pid_t pid) {
                      // The signal goes once the partial output exists (the handler is installed
                      // and the writing has begun), not after a sleep a loaded machine may outlast.
                      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
                      auto started = [&] {
                        for (const auto& e : fs::directory_iterator(d.path()))
                          if (e.path().filename().string().find(".partial") != std::string::npos) return true;
                        return false;
                      };
                      while (!started() && std::chrono::steady_clock::now() < give_up)
                        std::this_thread::sleep_for(std::chrono::milliseconds(1));
                      ::kill(pid, SIGINT);
                    });
  if (i.status == 0) {
    GTEST_LOG_(INFO) << "synth finished before SIGINT; the interrupt path was not exercised";
    EXPECT_TRUE(Pack::is_pack(d / "pack2"));
  } else {
    EXPECT_NE(i.err.find("interrupted"), std::string::npos) << i.err;
    EXPECT_FALSE(fs::exists(d / "pack2"));
    for (const auto& e : fs::directory_iterator(d.path()))
      EXPECT_EQ(e.path().filename().string().find(".partial"), std::string::npos) << e.path();
  }
}

}  // namespace
