// Large random HF checkpoints for convert benchmarks and memory tests: a qwen3_moe model
// with random bf16 weights of about a requested size, written tensor by tensor in chunks
// (memory stays a few MB whatever the size). The weights are not a trained model; only
// their size, shapes and dtype matter.
#pragma once

#include <cstdint>
#include <filesystem>

namespace sluice {

struct SyntheticSpec {
  int64_t n_layer = 2, n_embd = 1024, n_ff = 512, n_expert = 32, n_expert_used = 4;
  int64_t n_head = 8, n_head_kv = 2, head_dim = 128, n_vocab = 4096;
};

// The spec whose checkpoint is closest to `bytes` (at least one layer): 32 experts of
// [512, 1024] per layer, about 105 MB a layer.
SyntheticSpec synthetic_spec_for_bytes(uint64_t bytes);

// Writes DIR/config.json and DIR/model.safetensors (bf16); returns the safetensors file's
// size. Deterministic in `seed`.
uint64_t write_synthetic_checkpoint(const std::filesystem::path& dir, const SyntheticSpec& spec, uint64_t seed = 1);

}  // namespace sluice
