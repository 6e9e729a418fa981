// Helpers for tests that use the reference fixtures in tests/fixtures/<name>/.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/model.h"

namespace sluice::test {

// The source tree: SLUICE_SOURCE_DIR from the environment when set (a build carried to
// another machine), else the one this binary was configured from.
inline std::filesystem::path source_dir() {
  if (const char* env = std::getenv("SLUICE_SOURCE_DIR")) return env;
  return SLUICE_SOURCE_DIR;
}

inline std::filesystem::path fixture_dir(const std::string& name) { return source_dir() / "tests" / "fixtures" / name; }

// Every model fixture (directories with a reference.json).
// The attention + MoE decoder families (qwen3_moe, mixtral, olmoe): what packs, the quality
// measurement and the CUDA backend cover so far.
inline std::vector<std::string> decoder_fixtures() { return {"qwen3_moe", "qwen3_moe_yarn", "mixtral", "olmoe"}; }

// The hybrid Qwen families (Gated DeltaNet, QSA, hyper-connections, PLE): CPU and CUDA
// (tests/gpu/cuda_parity_test.cpp); packs of them leave out the vision tower and keep PLE
// tables in ple.<dtype>.bin.
inline std::vector<std::string> hybrid_fixtures() {
  return {"qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen4_exp_qsa", "qwen4_exp_ple"};
}

// The hybrid fixtures with routed experts (qwen3_5 is dense): what streaming and the quality
// measurement cover. Their seeds were searched for router top-k margins of 3e-4 and more.
inline std::vector<std::string> hybrid_expert_fixtures() { return {"qwen3_next", "qwen3_5_moe", "qwen4_exp_qsa", "qwen4_exp_ple"}; }

// gpt-oss (attention sinks, sliding and full layers, experts with biases and the clamped
// SwiGLU): bf16, and MXFP4 experts in the real checkpoint layout. The CUDA backend runs them
// resident from bf16 / int8 / q4 / mxfp4 weights (tests/gpu/cuda_gpt_oss_test.cpp), streamed
// host-routed (host_routed_fixtures).
inline std::vector<std::string> gpt_oss_fixtures() { return {"gpt_oss", "gpt_oss_mxfp4"}; }

// Llama 4 (NoPE layers with temperature tuning, chunked attention, L2 q/k norm, sigmoid routing
// that scales the experts' inputs, a shared expert, dense layers between MoE layers). The
// CUDA backend runs them resident (tests/gpu/cuda_llama4_test.cpp), streamed host-routed.
inline std::vector<std::string> llama4_fixtures() { return {"llama4", "llama4_top2"}; }

// Gemma 4 (sliding and full layers with their own head sizes and rope, q/k/v norms, KV shared
// across layers, attention_k_eq_v, the MoE block beside a gelu MLP, PLE, the logit softcap).
// On CUDA: tests/gpu/cuda_gemma4_test.cpp.
inline std::vector<std::string> gemma4_fixtures() { return {"gemma4", "gemma4_kv"}; }

// The giant families' fixtures: DeepSeek-V3 (multi-head latent attention with a q-LoRA,
// YaRN's mscale, interleaved rope, 4 groups keep 2, an MTP layer; and without q-LoRA, default
// rope, one group), GLM-4.5 (biases, partial rotary, qk-norm, 2 groups keep 1, an MTP layer;
// and without qk-norm) and MiniMax-M2 (whole-projection qk-norm, partial rotary): the
// group-limited sigmoid router with a correction bias that changes the choice. The CUDA
// backend routes them on the device (tests/gpu/cuda_giant_test.cpp).
inline std::vector<std::string> giant_fixtures() {
  return {"deepseek_v3", "deepseek_v3_plain", "glm4_moe", "glm4_moe_plain", "minimax_m2"};
}

// Every fixture with routed experts.
inline std::vector<std::string> expert_fixtures() {
  std::vector<std::string> all = decoder_fixtures();
  for (auto& f : hybrid_expert_fixtures()) all.push_back(f);
  for (auto& f : gpt_oss_fixtures()) all.push_back(f);
  for (auto& f : llama4_fixtures()) all.push_back(f);
  for (auto& f : gemma4_fixtures()) all.push_back(f);
  for (auto& f : giant_fixtures()) all.push_back(f);
  return all;
}

// The fixtures with routed experts that the CUDA backend routes on the device.
inline std::vector<std::string> cuda_expert_fixtures() {
  std::vector<std::string> all = decoder_fixtures();
  for (auto& f : hybrid_expert_fixtures()) all.push_back(f);
  for (auto& f : giant_fixtures()) all.push_back(f);
  return all;
}

// The fixtures whose experts the CUDA streamer computes host-routed (experts/cuda/host_routed.cpp:
// biases and the clamped SwiGLU, input scaling and sigmoid routing, GeGLU and per-expert scales).
inline std::vector<std::string> host_routed_fixtures() {
  std::vector<std::string> all = gpt_oss_fixtures();
  for (auto& f : llama4_fixtures()) all.push_back(f);
  for (auto& f : gemma4_fixtures()) all.push_back(f);
  return all;
}

// The fixtures on which the quality test asserts the int8 and q4 bounds (quality_test.cpp says
// why qwen3_next and qwen3_5_moe are only reported).
inline std::vector<std::string> quality_bounded_fixtures() {
  std::vector<std::string> all = decoder_fixtures();
  all.push_back("qwen4_exp_qsa");
  all.push_back("qwen4_exp_ple");
  return all;
}

inline std::vector<std::string> model_fixtures() {
  std::vector<std::string> all = decoder_fixtures();
  for (auto& f : hybrid_fixtures()) all.push_back(f);
  for (auto& f : gpt_oss_fixtures()) all.push_back(f);
  for (auto& f : llama4_fixtures()) all.push_back(f);
  for (auto& f : gemma4_fixtures()) all.push_back(f);
  for (auto& f : giant_fixtures()) all.push_back(f);
  return all;
}

struct FixtureReference {
  std::vector<int32_t> prompt_ids, continuation_ids;
  double min_router_margin = 0;
};

FixtureReference read_reference(const std::string& name);

// max |a - b| over all elements.
float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);
// The elements of a and b whose bits differ (the larger size when the sizes differ): 0 is
// bit for bit.
size_t floats_differing(const std::vector<float>& a, const std::vector<float>& b);

// The logits of every position of ids [n] into got [n, V], through one state: the first
// prompt_len (>= 7) tokens in uneven chunks (5, 1, the rest), then one token at a time.
void decode_in_chunks(Model& model, const std::vector<int32_t>& ids, size_t prompt_len, std::vector<float>& got);

}  // namespace sluice::test
