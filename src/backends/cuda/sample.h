// Sampling on the device (sample.cu, sample_blocks.cu): the next token of each row of logits,
// so that a decode step returns a token id (4 bytes) instead of a row of logits (600 KB for a
// 151936-token vocabulary) and the host does no work over the vocabulary. The same rules as
// the host sampler (engine/sampler.h): temperature 0 is greedy (lowest id among equal maxima);
// otherwise logits / temperature, top-k (ties at the k-th place: lowest ids first), softmax
// over the kept tokens, top-p (the most likely tokens, lower id first among equal ones, until
// their mass reaches top_p), then one draw with the uniform number the host supplies. The
// kept set is the host's; the draw walks the kept tokens in id order (the host walks them
// most likely first after top-k / top-p), so the distribution is the host's and a seed
// reproduces a run on the device, but a given uniform number may pick another token.
// Every rule is spread over kSampleBlocks blocks a row (up to kSampleMaxRows rows, with the
// scratch below); otherwise (more rows, or a launch without that scratch) one block a row
// draws.
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

constexpr int64_t kSampleMaxRows = 1024;  // rows the many-block kernels serve (counters the backend keeps)
constexpr int kSampleBlocks = 64;         // blocks a row of the many-block kernels

// A row's state between the many-block kernels of a draw with top-k or top-p (sample_blocks.cu);
// scratch, nothing to initialize (the greedy kernel zeroes hist).
struct SampleSelectRow {
  unsigned long long hist[256];                 // a radix pass's bins: counts (top-k) or 2^-40 masses (top-p); zero between passes
  unsigned long long k_count[kSampleBlocks];    // tokens at the top-k threshold in each block's slice
  unsigned long long k_before[kSampleBlocks];   // ... in the slices before it
  unsigned long long p_count[kSampleBlocks];    // tokens at the top-p threshold that top-k keeps, each slice (the draw)
  float z_part[kSampleBlocks];                  // each slice's exp(s) over the tokens above the top-k threshold
  unsigned long long rem;                       // the radix walk: the count still needed (top-k) or the mass above (top-p)
  uint32_t prefix;                              // the radix walk: the key's digits so far
  int p_all;                                    // top-p: the kept mass never reaches top_p (rounding): every token stays
  uint32_t k_key, p_key;                        // the thresholds' keys (order_key of s, of p)
  unsigned long long k_need, p_need;            // tokens at a threshold kept, lowest ids first
  float z;                                      // the softmax's sum over the tokens top-k keeps
};

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
  // Sampled rows are too when these are set as well (with the two above); `select` only for
  // a rule with top-k or top-p (sample_by_temperature_alone false):
  GreedyPartial* row_best = nullptr;  // [n] scratch: each row's maximum, its id, NaN / +inf seen
  float* block_sums = nullptr;        // [sample_greedy_partials(n)] scratch: each block's share of the mass
  SampleSelectRow* select = nullptr;  // [n] scratch
};

constexpr double kSampleKernelMassOne = 1099511627776.0;  // sample.cu's fixed point: 2^-40 units
constexpr float kSampleKernelGreedyTemperature = 1e-6f;    // below it a draw is greedy
int64_t sample_greedy_partials(int64_t n);
// Whether a sampled row's rule is a temperature alone (no top-k below n_valid, top_p 1): its
// many-block draw needs no `select` scratch.
bool sample_by_temperature_alone(float temperature, int64_t top_k, float top_p, int64_t n_valid);
void launch_sample(const SampleParams& p, Stream s);
// The many-block draw after the greedy kernel wrote row_best (sample_blocks.cu).
void launch_sample_draw_blocks(const SampleParams& p, Stream s);

}  // namespace sluice::cuda
