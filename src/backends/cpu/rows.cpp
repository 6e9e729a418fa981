// CPU row movement and the mixture combine: get_rows (embedding lookup with conversion to
// f32, dequantizing quantized tables), gather_rows, scatter_rows, moe_combine.
#include <algorithm>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"
#include "core/quant.h"

namespace sluice {

namespace {

constexpr int64_t kMinChunkElems = 16384;  // below this a thread wake-up costs more than the work

// Every index in [0, limit); names the op and the first bad index otherwise.
void check_indices(const char* op, std::span<const int32_t> idx, int64_t limit, Status status) {
  for (size_t i = 0; i < idx.size(); ++i)
    SLUICE_CHECK(idx[i] >= 0 && idx[i] < limit, status, "cpu ", op, ": index ", idx[i], " at ", i,
                 " outside [0, ", limit, ")");
}

}  // namespace

void CpuBackend::get_rows(const Tensor& table, std::span<const int32_t> ids, const Tensor& out) {
  const bool quantized = dtype_is_quantized(table.dtype);
  SLUICE_CHECK(table.ndim == 2 && (cpu::is_weight_dtype(table.dtype) || (quantized && table.scales)) &&
                   out.dtype == DType::f32 && out.cols() == table.cols() &&
                   cpu::lead_rows(out) == static_cast<int64_t>(ids.size()),
               Status::internal, "cpu get_rows: table ", dtype_name(table.dtype), " ", table.shape_str(),
               quantized && !table.scales ? " (no scales)" : "", ", ", ids.size(), " ids, out ",
               dtype_name(out.dtype), " ", out.shape_str(),
               " (want table f32/bf16/f16/q8/q4/q2/mxfp4 [n_rows, c], out f32 [n_ids, c])");
  // An id out of range is the caller's bad token id, not a kernel bug.
  check_indices("get_rows", ids, table.shape[0], Status::invalid_argument);
  int64_t c = table.cols();
  if (ids.empty() || c == 0) return;
  float* op = out.ptr<float>();
  if (quantized) {  // each row dequantized as core/quant.h defines it (the matmul's weights, bit for bit)
    const DType dt = table.dtype;
    const int64_t row_bytes = quant_row_bytes(dt, c), scale_bytes = quant_scale_row_bytes(dt, c);
    const auto* tq = static_cast<const uint8_t*>(table.data);
    const auto* ts = static_cast<const uint8_t*>(table.scales);
    pool().parallel_for(static_cast<int64_t>(ids.size()), std::max<int64_t>(1, kMinChunkElems / c),
                        [&](int64_t i0, int64_t i1) {
                          for (int64_t i = i0; i < i1; ++i)
                            dequantize_row(dt, tq + ids[i] * row_bytes, ts + ids[i] * scale_bytes, c, op + i * c);
                        });
    return;
  }
  cpu::dispatch_weight(table.dtype, [&]<DType T>() {
    const auto* tp = static_cast<const cpu::elem_t<T>*>(table.data);
    pool().parallel_for(static_cast<int64_t>(ids.size()), std::max<int64_t>(1, kMinChunkElems / c),
                        [&](int64_t i0, int64_t i1) {
                          for (int64_t i = i0; i < i1; ++i) cpu::convert_row<T>(tp + ids[i] * c, op + i * c, c);
                        });
  });
}

void CpuBackend::gather_rows(const Tensor& src, std::span<const int32_t> idx, const Tensor& out) {
  SLUICE_CHECK(src.dtype == DType::f32 && out.dtype == DType::f32 && src.cols() == out.cols() &&
                   cpu::lead_rows(out) == static_cast<int64_t>(idx.size()) && !cpu::overlaps(src, out),
               Status::internal, "cpu gather_rows: src ", dtype_name(src.dtype), " ", src.shape_str(), ", ",
               idx.size(), " indices, out ", dtype_name(out.dtype), " ", out.shape_str(),
               " (want f32 src [rows, c], out [n_idx, c], not overlapping)");
  check_indices("gather_rows", idx, cpu::lead_rows(src), Status::internal);
  int64_t c = src.cols();
  if (idx.empty() || c == 0) return;
  const float* sp = src.ptr<float>();
  float* op = out.ptr<float>();
  pool().parallel_for(static_cast<int64_t>(idx.size()), std::max<int64_t>(1, kMinChunkElems / c),
                      [&](int64_t i0, int64_t i1) {
                        for (int64_t i = i0; i < i1; ++i)
                          std::memcpy(op + i * c, sp + idx[i] * c, static_cast<size_t>(c) * sizeof(float));
                      });
}

void CpuBackend::scatter_rows(const Tensor& src, std::span<const int32_t> idx, const Tensor& dst) {
  SLUICE_CHECK((src.dtype == DType::f32 || src.dtype == DType::bf16) && dst.dtype == src.dtype &&
                   src.cols() == dst.cols() && cpu::lead_rows(src) == static_cast<int64_t>(idx.size()) &&
                   !cpu::overlaps(src, dst),
               Status::internal, "cpu scatter_rows: src ", dtype_name(src.dtype), " ", src.shape_str(), ", ",
               idx.size(), " indices, dst ", dtype_name(dst.dtype), " ", dst.shape_str(),
               " (want f32 or bf16 src [n_idx, c], dst [rows, c] of its dtype, not overlapping)");
  check_indices("scatter_rows", idx, cpu::lead_rows(dst), Status::internal);
  const size_t row_bytes = static_cast<size_t>(src.cols()) * dtype_size(src.dtype);
  const auto* sp = static_cast<const uint8_t*>(src.data);
  auto* dp = static_cast<uint8_t*>(dst.data);
  // In index order on one thread: with a repeated index the last row wins, always.
  for (size_t i = 0; i < idx.size(); ++i)
    std::memcpy(dp + static_cast<size_t>(idx[i]) * row_bytes, sp + i * row_bytes, row_bytes);
}

// out[t, :] = sum over r = 0..k-1 of weights[t*k + r] * expert_out[t*k + r, :], as
// acc = +0.0f; acc = fma(weights[t*k + r], expert_out[t*k + r, c], acc) for r ascending.
// That order (routing rank, never slot or arrival order) and the fused multiply-add are the
// contract another backend reproduces bit for bit.
void CpuBackend::moe_combine(const Tensor& expert_out, std::span<const float> weights, int64_t k,
                             const Tensor& out) {
  int64_t n = cpu::lead_rows(out), c = out.cols();
  SLUICE_CHECK(expert_out.dtype == DType::f32 && out.dtype == DType::f32 && k >= 0 &&
                   expert_out.cols() == c && cpu::lead_rows(expert_out) == n * k &&
                   static_cast<int64_t>(weights.size()) == n * k && !cpu::overlaps(expert_out, out),
               Status::internal, "cpu moe_combine: expert_out ", dtype_name(expert_out.dtype), " ",
               expert_out.shape_str(), ", ", weights.size(), " weights, k ", k, ", out ", dtype_name(out.dtype),
               " ", out.shape_str(), " (want f32 expert_out [n*k, c], n*k weights, out [n, c], not overlapping)");
  if (n == 0 || c == 0) return;
  const float* ep = expert_out.ptr<float>();
  const float* wp = weights.data();
  float* op = out.ptr<float>();
  pool().parallel_for(n, std::max<int64_t>(1, kMinChunkElems / std::max<int64_t>(1, c * k)),
                      [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* o = op + t * c;
      int64_t i = 0;
      for (; i + 8 <= c; i += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t r = 0; r < k; ++r)
          acc = _mm256_fmadd_ps(_mm256_set1_ps(wp[t * k + r]), _mm256_loadu_ps(ep + (t * k + r) * c + i), acc);
        _mm256_storeu_ps(o + i, acc);
      }
      if (i < c) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t r = 0; r < k; ++r)
          acc = _mm256_fmadd_ps(_mm256_set1_ps(wp[t * k + r]),
                                cpu::load8_tail<DType::f32>(ep + (t * k + r) * c + i, c - i), acc);
        cpu::store8_tail(o + i, acc, c - i);
      }
    }
  });
}

}  // namespace sluice
