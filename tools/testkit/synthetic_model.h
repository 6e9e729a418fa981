// Large random models for benchmarks and memory tests: a qwen3_moe model with random weights
// of about a requested size, either as an HF checkpoint (bf16, for convert) or directly as a
// pack (for streaming, at sizes a convert would take minutes to write). Both are written in
// chunks (memory stays bounded whatever the size). The weights are not a trained model; only
// their size, shapes and dtype matter.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "format/pack.h"

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

// Writes a pack of this model into DIR (created; must not hold a pack already) without a
// checkpoint: dense tensors as random bf16 values, expert records of each kind filled with
// random valid values (quantized kinds: random codes with small scales), each record
// checksummed. Records are generated on the global thread pool and the files fsynced.
// Returns the bytes of the expert files.
uint64_t write_synthetic_pack(const std::filesystem::path& dir, const SyntheticSpec& spec,
                              const std::vector<DType>& kinds, uint64_t seed = 1);

}  // namespace sluice
