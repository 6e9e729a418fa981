// The building blocks of the decode MoE expert kernels (moe_decode.cu): the warp's weight rows
// in flight (WarpRows), the swizzled staging of activation rows in shared memory, and the
// bodies of one gate/up block and one down + combine tile (moe_decode.cu's header says why the
// sums are the generic kernels'). Device code only; included by .cu files.
#pragma once

#include <cstdint>

#include "backends/cuda/common.cuh"
#include "backends/cuda/moe_common.cuh"
#include "backends/cuda/moe_decode.h"
#include "backends/cuda/moe_kernels.h"
#include "backends/cuda/row_dot.cuh"

namespace sluice::cuda::decode {

constexpr int kGateUpWarps = 4;    // warps a gate/up block
constexpr int kGateUpRows = 4;     // ff rows a warp (twice as many weight rows: gate and up)
constexpr int kDownWarps = 8;      // warps a down block
constexpr int kRowsPerWarp = 8;    // embd rows a warp in both down kernels
constexpr int kCombineWarps = 16;  // warps a down + combine block
constexpr int kCombineTile = 16;   // embd rows a down + combine block (kRowsPerWarp for each of 2 warps a rank)
constexpr size_t kMaxStagedBytes = 48 * 1024;  // shared memory a block may stage without opting in

// The arguments of the three decode kernels (each reads the fields it needs); device pointers.
struct DecodeParams {
  const float* h = nullptr;          // [n_rows, n_embd] f32, 16-byte aligned
  const int32_t* ids = nullptr;      // [n_rows * k] expert of pair p = row * k + rank
  const float* weights = nullptr;    // [n_rows * k] routing weights (down + combine)
  const ExpertRef* table = nullptr;  // [n_expert]
  const uint8_t* done = nullptr;     // [n_rows * k] pairs already computed, or null (fully resident)
  float* act = nullptr;              // [n_rows * k, n_ff] f32, 16-byte aligned: gate/up writes it
  const float* act_in = nullptr;     // the same, the down kernels read it
  float* pair_out = nullptr;         // [n_rows * k, n_embd] f32 (down)
  float* out = nullptr;              // [n_rows, n_embd] f32 (down + combine)
  int64_t k = 0, n_embd = 0, n_ff = 0;
  CopyList copies;                   // gate/up with copies: the list its first copy_blocks copy
  int32_t copy_blocks = 0;
};

// Chunks of each row a lane holds in flight at once (more spill registers). gate/up (n_embd
// 2048): 2, a q4 row's whole share of a lane, half of int8's. down (n_ff 768): 1, a q4 row's
// share (lanes 24-31 have none), half of int8's for the lanes that have two.
template <WType T>
__host__ __device__ constexpr int gate_up_steps() {
  return 2;
}
template <WType T>
__host__ __device__ constexpr int down_steps() {
  return 1;
}

// float4 units of activations one 16-byte weight chunk covers.
template <WType T>
__host__ __device__ constexpr int chunk_units() {
  return dot_vec_elems<T>() / 4;
}

// Shared-memory position of float4 unit g of a staged row: within each 128-byte line (8 units)
// the unit index is XORed with the line's low bits, so that the 8 lanes of a quarter warp,
// reading unit j of 8 consecutive chunks, hit 8 different 16-byte bank groups. U units a
// chunk: the XOR keeps a unit inside its chunk's aligned group of U.
template <int U>
__device__ __forceinline__ int swizzled(int g) {
  return g ^ ((g >> 3) & (U - 1));
}

// Starts copying n_rows rows of n floats (16-byte aligned, n a multiple of 4 U) from global
// into xs, row r's unit g at r * n / 4 + swizzled<U>(g), with cp.async: in flight while the
// block reads its expert's pointers and issues its weight loads, and no registers held. Every
// thread of the block takes part; staged_wait() (then a barrier) before reading xs, and
// before a thread exits.
template <int U>
__device__ __forceinline__ void stage_rows(float4* __restrict__ xs, const float* __restrict__ x, int64_t n_rows,
                                           int64_t n) {
  const int units = static_cast<int>(n / 4);  // the launcher bounds the staged bytes
  const float4* src = reinterpret_cast<const float4*>(x);
  for (int r = 0; r < n_rows; ++r)
    for (int g = threadIdx.x; g < units; g += blockDim.x) {
      const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(xs + r * units + swizzled<U>(g)));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src + r * units + g) : "memory");
    }
}
__device__ __forceinline__ void staged_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// chunk_dot's chain over the 4 elements of float4 unit j of a 16-byte chunk (elements 4j .. 4j + 3),
// continuing acc: the same fmaf of each weight (dequantized exactly: q - 8, q, bf16 -> f32)
// with its activation, in the same order, so that a chunk's chain over its units is
// chunk_dot's sum before the scale. j is a constant once the caller's loop is unrolled.
template <WType T>
__device__ __forceinline__ float unit_dot(const uint4& wv, int j, const float4& x, float acc) {
  const uint32_t w32[4] = {wv.x, wv.y, wv.z, wv.w};
  const auto byte_at = [](uint32_t v, int b) {  // byte_f<b>
    return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440 | b));
  };
  if constexpr (T == WType::bf16) {
    float a, b;
    bf16x2_to_f32(w32[2 * j], a, b);
    acc = fmaf(a, x.x, acc);
    acc = fmaf(b, x.y, acc);
    bf16x2_to_f32(w32[2 * j + 1], a, b);
    acc = fmaf(a, x.z, acc);
    acc = fmaf(b, x.w, acc);
  } else if constexpr (T == WType::q8) {
    const uint32_t v = w32[j] ^ 0x80808080u;  // q + 128
    acc = fmaf(byte_at(v, 0) - (kTwo23 + 128.0f), x.x, acc);
    acc = fmaf(byte_at(v, 1) - (kTwo23 + 128.0f), x.y, acc);
    acc = fmaf(byte_at(v, 2) - (kTwo23 + 128.0f), x.z, acc);
    acc = fmaf(byte_at(v, 3) - (kTwo23 + 128.0f), x.w, acc);
  } else if constexpr (T == WType::mxfp4) {
    // chunk_dot's order: byte b's low code (element 2b), then its high code (2b + 1).
    const uint32_t v = w32[j / 2] >> (16 * (j % 2));  // bytes 2 (j % 2) and 2 (j % 2) + 1 of the word
    acc = fmaf(e2m1_value(v & 15u), x.x, acc);
    acc = fmaf(e2m1_value((v >> 4) & 15u), x.y, acc);
    acc = fmaf(e2m1_value((v >> 8) & 15u), x.z, acc);
    acc = fmaf(e2m1_value((v >> 12) & 15u), x.w, acc);
  } else {
    static_assert(T == WType::q4, "decode kernels: bf16, q8, q4 or mxfp4");
    const uint32_t lo = w32[j / 2] & 0x0F0F0F0Fu, hi = (w32[j / 2] >> 4) & 0x0F0F0F0Fu;
    const int b = 2 * (j % 2);  // elements 2 (b + i) and 2 (b + i) + 1 in byte b + i's nibbles
    acc = fmaf(byte_at(lo, b) - (kTwo23 + 8.0f), x.x, acc);
    acc = fmaf(byte_at(hi, b) - (kTwo23 + 8.0f), x.y, acc);
    acc = fmaf(byte_at(lo, b + 1) - (kTwo23 + 8.0f), x.z, acc);
    acc = fmaf(byte_at(hi, b + 1) - (kTwo23 + 8.0f), x.w, acc);
  }
  return acc;
}

// A chunk's sum folded into a lane's partial: acc + sum (bf16), or the group's (row's) scale
// applied in one fused step, fma(sum, scale, acc), which is what rows_dot_partial's
// `acc += chunk_dot(..)` compiles to (the multiply by the scale contracted into the add).
template <WType T>
__device__ __forceinline__ float fold_chunk(float acc, float sum, const ChunkScale<T>& sc) {
  if constexpr (T == WType::bf16) return acc + sum;
  else return fmaf(sum, sc.v[0], acc);
}

// NM x NR weight rows dotted with one activation row, a warp's work: rows row0 .. row0 + NR - 1
// of NM matrices of the same type and shape (rows past `last` read row `last`), row q = NM r + m
// being matrix m's row row0 + r. begin() puts the first P chunks of each row of every lane in
// flight, dots() (after the activations are staged) finishes them and the rest, P at a time.
// Row addresses are computed at each load (registers hold the chunks, not 2 NM NR pointers).
template <WType T, int NM, int NR, int P>
struct WarpRows {
  static constexpr int E = dot_vec_elems<T>();
  static constexpr int NW = NM * NR;
  const uint8_t* base[NM];   // matrix m's row 0
  const uint8_t* sbase[NM];  // its scales' row 0 (quantized kinds)
  int64_t row0 = 0, last = 0, rb = 0, sb = 0;
  bool vec = false;  // every row 16-byte aligned (the launcher checked the sizes)
  uint4 wv[P][NW];
  ChunkScale<T> sv[P][NW];

  __device__ __forceinline__ int64_t row(int q) const { return row0 + q / NM < last ? row0 + q / NM : last; }
  __device__ __forceinline__ const uint8_t* wrow(int q) const { return base[q % NM] + row(q) * rb; }
  __device__ __forceinline__ const uint8_t* srow(int q) const {
    return sbase[q % NM] ? sbase[q % NM] + row(q) * sb : nullptr;
  }
  // Chunks c0, c0 + 32, ..., c0 + 32 (P - 1) of every row.
  __device__ __forceinline__ void load(int64_t c0, int64_t chunks) {
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t c = c0 + 32 * i;
      if (c < chunks)
#pragma unroll
        for (int q = 0; q < NW; ++q) {
          wv[i][q] = __ldg(reinterpret_cast<const uint4*>(wrow(q)) + c);
          if constexpr (T != WType::bf16) sv[i][q] = load_chunk_scale<T>(srow(q), c);
        }
    }
  }
  // Unit by unit of each chunk, every row's chain taking the unit (the rows share each
  // activation unit read, and only one unit a row is live).
  __device__ __forceinline__ void accumulate(const float4* __restrict__ xs, int64_t c0, int64_t chunks,
                                             float (&acc)[1][NW]) const {
    constexpr int U = chunk_units<T>();
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t c = c0 + 32 * i;
      if (c < chunks) {
        float sum[NW];
#pragma unroll
        for (int q = 0; q < NW; ++q) sum[q] = 0.0f;
#pragma unroll
        for (int j = 0; j < U; ++j) {
          const float4 x = xs[swizzled<U>(static_cast<int>(c) * U + j)];
#pragma unroll
          for (int q = 0; q < NW; ++q) sum[q] = unit_dot<T>(wv[i][q], j, x, sum[q]);
        }
#pragma unroll
        for (int q = 0; q < NW; ++q) acc[0][q] = fold_chunk<T>(acc[0][q], sum[q], sv[i][q]);
      }
    }
  }
  __device__ __forceinline__ void begin(int64_t kdim, int lane) {
    if (vec) load(lane, kdim / E);
  }
  // y[q] = row q . x in every lane; xs: x staged (stage_rows), x itself for the scalar path.
  __device__ __forceinline__ void dots(const float4* __restrict__ xs, const float* __restrict__ x, int64_t kdim,
                                       int lane, float (&y)[NW]) {
    float acc[1][NW];
#pragma unroll
    for (int q = 0; q < NW; ++q) acc[0][q] = 0.0f;
    if (vec) {
      const int64_t chunks = kdim / E;
      accumulate(xs, lane, chunks, acc);
#pragma unroll 1
      for (int64_t b = 32 * P; b < chunks; b += 32 * P) {
        load(b + lane, chunks);
        accumulate(xs, b + lane, chunks, acc);
      }
    } else {
      const uint8_t* w[NW];
      const uint8_t* s[NW];
#pragma unroll
      for (int q = 0; q < NW; ++q) {
        w[q] = wrow(q);
        s[q] = srow(q);
      }
      rows_dot_partial<T, 1, NW>(w, s, x, 0, kdim, false, lane, acc);
    }
#pragma unroll
    for (int q = 0; q < NW; ++q) y[q] = warp_sum(acc[0][q]);
  }
};

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Pair p's expert, or null when the pair is not to be computed (pair_active, in two steps: x,
// n floats, is staged into xs while the table is read; a done pair of a later phase stages
// nothing).
template <WType T>
__device__ __forceinline__ const ExpertRef* stage_for_pair(float4* __restrict__ xs, const float* __restrict__ x,
                                                           int64_t n, const int32_t* __restrict__ ids,
                                                           const ExpertRef* __restrict__ table,
                                                           const uint8_t* __restrict__ done, int64_t p) {
  if (done != nullptr && done[p] != 0) return nullptr;
  stage_rows<chunk_units<T>()>(xs, x, 1, n);
  const ExpertRef* ref = &table[ids[p]];
  if (ref->wtype != WType::unavailable) return ref;
  staged_wait();
  return nullptr;
}

template <WType T>
using DownRows = WarpRows<T, 1, kRowsPerWarp, down_steps<T>()>;

// The down rows i0 .. i0 + kRowsPerWarp - 1 of an expert (rows past n_embd read the last).
template <WType T>
__device__ __forceinline__ void set_down_rows(DownRows<T>& rows, const ExpertRef& ref, int64_t i0, int64_t n_embd,
                                              int64_t n_ff) {
  rows.base[0] = static_cast<const uint8_t*>(ref.data[2]);
  rows.sbase[0] = static_cast<const uint8_t*>(ref.scales[2]);
  rows.row0 = i0;
  rows.last = n_embd - 1;
  rows.rb = dot_row_bytes(T, n_ff);
  rows.sb = dot_scale_row_bytes(T, n_ff);
  rows.vec = aligned16(ref.data[2]);
}

// One gate/up block's work: pair p's ff rows (ty * kGateUpWarps + warp) * kGateUpRows .. of
// act (a.act), h[p / k] staged into xs (n_embd floats); ids: the pairs' experts (a.ids, or a
// copy in shared memory). Every thread of the block calls it with the same (p, ty); it
// returns with no barrier pending (a caller looping over blocks puts a __syncthreads()
// before restaging xs). a is best a kernel parameter (read from the constant bank, not
// copied into registers).
template <WType T>
__device__ __forceinline__ void gate_up_block(const DecodeParams& a, const int32_t* ids, int64_t p, int64_t ty,
                                              float4* xs) {
  const int64_t n_embd = a.n_embd, n_ff = a.n_ff;
  const float* x = a.h + (p / a.k) * n_embd;
  const ExpertRef* expert = stage_for_pair<T>(xs, x, n_embd, ids, a.table, a.done, p);
  if (expert == nullptr) return;
  const ExpertRef& ref = *expert;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j0 = (ty * kGateUpWarps + warp) * kGateUpRows;
  WarpRows<T, 2, kGateUpRows, gate_up_steps<T>()> rows;
#pragma unroll
  for (int m = 0; m < 2; ++m) {  // gate, up
    rows.base[m] = static_cast<const uint8_t*>(ref.data[m]);
    rows.sbase[m] = static_cast<const uint8_t*>(ref.scales[m]);
  }
  rows.row0 = j0;
  rows.last = n_ff - 1;
  rows.rb = dot_row_bytes(T, n_embd);
  rows.sb = dot_scale_row_bytes(T, n_embd);
  rows.vec = aligned16(ref.data[0]) && aligned16(ref.data[1]);
  const bool live = j0 < n_ff;
  if (live) rows.begin(n_embd, lane);
  staged_wait();
  __syncthreads();
  if (!live) return;
  float y[2 * kGateUpRows];
  rows.dots(xs, x, n_embd, lane, y);
  if (lane == 0) {
    const ExpertRef& eref = a.table[ids[p]];  // read again: a pointer kept live through the dots costs registers
#pragma unroll
    for (int r = 0; r < kGateUpRows; ++r)
      if (j0 + r < n_ff) a.act[p * n_ff + j0 + r] = expert_gate_up(eref, j0 + r, y[2 * r], y[2 * r + 1]);
  }
}

// The down sums of rank `rank` of batch row `row` over embd rows i0 .. i0 + kRowsPerWarp - 1,
// a warp's item of a down + combine tile, into ys[rank * tile + t0 ..] (expert_down applied to
// the rows that exist): rows already begun (set_down_rows, begin), the row's k act rows staged
// in xs (k * n_ff floats) from a.act_in (the scalar path reads them there); ids as in
// gate_up_block.
template <WType T>
__device__ __forceinline__ void down_item(const DecodeParams& a, const int32_t* ids, DownRows<T>& rows, int64_t row,
                                          int64_t rank, int64_t i0, const float4* xs, float* ys, int tile, int t0,
                                          int lane) {
  const int64_t k = a.k, n_embd = a.n_embd, n_ff = a.n_ff;
  float y[kRowsPerWarp];
  rows.dots(xs + rank * (n_ff / 4), a.act_in + (row * k + rank) * n_ff, n_ff, lane, y);
  if (lane == 0) {
    const ExpertRef& ref = a.table[ids[row * k + rank]];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
      ys[rank * tile + t0 + r] = i0 + r < n_embd ? expert_down(ref, i0 + r, y[r]) : y[r];
  }
}

inline bool aligned16_host(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Whether kernels of the shape's weight type take a product over kdim with activations x:
// bf16, q8, q4 or mxfp4, kdim whole 16-byte chunks, x 16-byte aligned (host code).
inline bool decode_product_ok(const MoeShape& shape, int64_t kdim, const void* x) {
  const WType t = shape.wtype;
  return moe_decode_enabled() && (t == WType::bf16 || t == WType::q8 || t == WType::q4 || t == WType::mxfp4) &&
         kdim % dot_vec_width(t) == 0 && dot_row_bytes(t, kdim) % 16 == 0 && aligned16_host(x);
}

// Runs the statement with T, a constant, set to the decode kernels' weight type t.
#define SLUICE_WITH_DECODE_WTYPE(t, ...)                                          \
  switch (t) {                                                                  \
    case WType::bf16: { constexpr WType T = WType::bf16; __VA_ARGS__; } break; \
    case WType::q8: { constexpr WType T = WType::q8; __VA_ARGS__; } break;     \
    case WType::mxfp4: { constexpr WType T = WType::mxfp4; __VA_ARGS__; } break; \
    default: { constexpr WType T = WType::q4; __VA_ARGS__; } break;            \
  }

}  // namespace sluice::cuda::decode
