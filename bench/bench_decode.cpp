// bench_decode: CPU decode and prefill speed of a qwen3_moe-shaped model of about 100M
// parameters with random bf16 weights (written once to a directory as a real HF checkpoint,
// then loaded through the normal path). Prints a markdown table: tokens/s as mean and
// spread over repetitions, and the weight bytes one decode step reads against that.
//
//   bench_decode [--dir DIR] [--threads N] [--reps R] [--decode N] [--prefill N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "core/thread_pool.h"
#include "engine/generator.h"
#include "format/safetensors.h"
#include "models/load.h"

using namespace sluice;
namespace fs = std::filesystem;

namespace {

// qwen3_moe scaled to ~113M parameters: 8 layers, 16 experts (top-4) of width 256.
const char* kConfig = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "vocab_size": 16384, "hidden_size": 768, "num_hidden_layers": 8,
  "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64,
  "intermediate_size": 2048, "moe_intermediate_size": 256, "num_experts": 16,
  "num_experts_per_tok": 4, "norm_topk_prob": true, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
  "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
  "tie_word_embeddings": false })";

struct Shape { std::string name; std::vector<int64_t> dims; bool norm; };

void write_model(const fs::path& dir) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << kConfig;
  const int64_t d = 768, V = 16384, L = 8, E = 16, ff = 256, hq = 12 * 64, hkv = 4 * 64;
  std::vector<Shape> shapes = {{"model.embed_tokens.weight", {V, d}, false},
                               {"model.norm.weight", {d}, true}, {"lm_head.weight", {V, d}, false}};
  for (int64_t l = 0; l < L; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    shapes.push_back({p + "input_layernorm.weight", {d}, true});
    shapes.push_back({p + "post_attention_layernorm.weight", {d}, true});
    shapes.push_back({p + "self_attn.q_proj.weight", {hq, d}, false});
    shapes.push_back({p + "self_attn.k_proj.weight", {hkv, d}, false});
    shapes.push_back({p + "self_attn.v_proj.weight", {hkv, d}, false});
    shapes.push_back({p + "self_attn.o_proj.weight", {d, hq}, false});
    shapes.push_back({p + "self_attn.q_norm.weight", {64}, true});
    shapes.push_back({p + "self_attn.k_norm.weight", {64}, true});
    shapes.push_back({p + "mlp.gate.weight", {E, d}, false});
    for (int64_t e = 0; e < E; ++e) {
      std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
      shapes.push_back({ep + "gate_proj.weight", {ff, d}, false});
      shapes.push_back({ep + "up_proj.weight", {ff, d}, false});
      shapes.push_back({ep + "down_proj.weight", {d, ff}, false});
    }
  }
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<std::vector<uint16_t>> storage;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& s : shapes) {
    int64_t n = 1;
    for (int64_t x : s.dims) n *= x;
    storage.emplace_back(n);
    for (auto& v : storage.back()) v = f32_to_bf16(s.norm ? 1.0f + normal(rng) : normal(rng));
    Tensor t;
    t.dtype = DType::bf16;
    t.ndim = static_cast<int>(s.dims.size());
    for (int i = 0; i < t.ndim; ++i) t.shape[i] = s.dims[i];
    t.data = storage.back().data();
    tensors.emplace_back(s.name, t);
  }
  write_safetensors(dir / "model.safetensors", tensors);
}

struct Spread { double mean, sd; };
Spread spread(const std::vector<double>& v) {
  double m = 0, s = 0;
  for (double x : v) m += x;
  m /= v.size();
  for (double x : v) s += (x - m) * (x - m);
  return {m, v.size() > 1 ? std::sqrt(s / (v.size() - 1)) : 0};
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir = fs::temp_directory_path() / "sluice-bench-qwen3moe-100m";
  int threads = 0, reps = 3;
  int64_t n_decode = 64, n_prefill = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--decode") n_decode = std::atoll(argv[i + 1]);
    else if (a == "--prefill") n_prefill = std::atoll(argv[i + 1]);
  }
  try {
    if (threads > 0) ThreadPool::set_global_threads(threads);
    if (!fs::exists(dir / "model.safetensors")) write_model(dir);
    auto backend = make_cpu_backend();
    LoadedModel m = load_model(dir, *backend);
    const ModelInfo& info = m.model->info();
    std::vector<int32_t> prompt(n_prefill);
    for (int64_t i = 0; i < n_prefill; ++i) prompt[i] = static_cast<int32_t>((i * 7919) % info.n_vocab);
    GenerateOptions opt;
    opt.n_predict = n_decode;
    opt.sampling.temperature = 0;
    std::vector<double> prefill, decode;
    for (int r = 0; r < reps; ++r) {
      GenerateStats st = Generator(*m.model).generate(prompt, opt, [](int32_t) { return true; });
      prefill.push_back(st.prefill_tokens_per_second());
      decode.push_back(st.decode_tokens_per_second());
    }
    // Bytes one decode step reads (bf16): every non-expert weight except the embedding table
    // (one row of it), plus the top-4 of 16 experts in each of the 8 layers.
    const double expert_bytes = 3.0 * 768 * 256 * 2, layers = 8;
    const double embedding_params = static_cast<double>(info.n_vocab) * info.n_embd;
    const double dense_bytes = (info.n_params - 16 * layers * 3.0 * 768 * 256 - embedding_params) * 2;
    const double step_bytes = dense_bytes + layers * 4 * expert_bytes;
    Spread p = spread(prefill), d = spread(decode);
    std::printf("| model | params | threads | prefill tok/s | decode tok/s | weight GB/s in decode |\n");
    std::printf("|---|---|---|---|---|---|\n");
    std::printf("| qwen3_moe-100m bf16 | %.1fM | %d | %.1f ± %.1f | %.2f ± %.2f | %.2f |\n", info.n_params / 1e6,
                ThreadPool::global().size(), p.mean, p.sd, d.mean, d.sd, d.mean * step_bytes / 1e9);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode: %s\n", e.what());
    return 1;
  }
  return 0;
}
