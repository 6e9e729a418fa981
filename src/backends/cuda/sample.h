// Sampling on the device (sample.cu): the next token of each row of logits, so that a decode
// step returns a token id (4 bytes) instead of a row of logits (600 KB for a 151936-token
// vocabulary) and the host does no work over the vocabulary. The same rules as the host
// sampler (engine/sampler.h): temperature 0 is greedy (lowest id among equal maxima);
// otherwise logits / temperature, top-k (ties at the k-th place: lowest ids first), softmax
// over the kept tokens, top-p (the most likely tokens, lower id first among equal ones, until
// their mass reaches top_p), then one draw with the uniform number the host supplies. The
// kept set is the host's; the draw walks the kept tokens in id order (the host walks them
// most likely first after top-k / top-p), so the distribution is the host's and a seed
// reproduces a run on the device, but a given uniform number may pick another token.
// Greedy rows and rows drawn by temperature alone (the CLI's and the API's defaults but the
// temperature) are spread over many blocks a row; top-k and top-p rows take one block.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels.h"

namespace sluice::cuda {

// One block's part of a greedy row (sample.cu): its maximum, the lowest id holding it, and
// whether it saw NaN or +inf.
struct GreedyPartial {
  float v;
  int32_t id;
  int32_t bad;
};

constexpr int64_t kSampleMaxRows = 1024;  // rows the greedy kernel serves (counters the backend keeps)

struct SampleParams {
  const float* logits = nullptr;  // [n, vocab] f32, row stride vocab
  const int64_t* uniform = nullptr;  // [n] device: per row a draw u * 2^53, u in [0, 1) (unused when greedy)
  int32_t* ids = nullptr;           // [n] out: the token, or -1 when a row holds NaN or +-inf
  int64_t n = 0;                    // rows
  int64_t vocab = 0;                // logits per row
  int64_t n_valid = 0;              // ids >= n_valid are never drawn (padded output rows)
  float temperature = 0.0f;         // below kSampleKernelGreedyTemperature (0): greedy
  int64_t top_k = 0;                // 0: every token
  float top_p = 1.0f;               // (0, 1]; 1: every token
  // Greedy rows (n <= kSampleMaxRows) are reduced over many blocks when these are set:
  GreedyPartial* greedy_partials = nullptr;  // [sample_greedy_partials(n)] scratch
  int* greedy_counters = nullptr;            // [kSampleMaxRows] zero (each launch leaves them zero)
  // Rows drawn by temperature alone (no top-k below n_valid, top_p 1) are too, in two
  // launches, when these are set as well (with the two above):
  GreedyPartial* row_best = nullptr;  // [n] scratch: each row's maximum, its id, NaN / +inf seen
  float* block_sums = nullptr;        // [sample_greedy_partials(n)] scratch: each block's share of the mass
};

constexpr double kSampleKernelMassOne = 1099511627776.0;  // sample.cu's fixed point: 2^-40 units
constexpr float kSampleKernelGreedyTemperature = 1e-6f;    // below it a draw is greedy
int64_t sample_greedy_partials(int64_t n);
// Whether a row drawn by this rule takes the many-block path (row_best, block_sums) rather
// than the one-block kernel: a temperature, no top-k below n_valid, top_p 1.
bool sample_by_temperature_alone(float temperature, int64_t top_k, float top_p, int64_t n_valid);
void launch_sample(const SampleParams& p, Stream s);

}  // namespace sluice::cuda
