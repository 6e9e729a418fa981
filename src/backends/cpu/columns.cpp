// CPU copy_cols: a column range of every row of one tensor into a column range of another
// (splitting fused projections, filling hyper-connection streams). Plain copies: exact.
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"

namespace sluice {

void CpuBackend::copy_cols(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t n_cols) {
  SLUICE_CHECK(src.dtype == DType::f32 && dst.dtype == DType::f32 && cpu::lead_rows(src) == cpu::lead_rows(dst) &&
                   src_col >= 0 && dst_col >= 0 && n_cols >= 0 && src_col + n_cols <= src.cols() &&
                   dst_col + n_cols <= dst.cols() && !cpu::overlaps(src, dst),
               Status::internal, "cpu copy_cols: src ", dtype_name(src.dtype), " ", src.shape_str(), " cols [",
               src_col, ", ", src_col + n_cols, "), dst ", dtype_name(dst.dtype), " ", dst.shape_str(), " from col ",
               dst_col, " (want f32, the same number of rows, ranges inside both, not overlapping)");
  const int64_t rows = cpu::lead_rows(src), sc = src.cols(), dc = dst.cols();
  if (rows == 0 || n_cols == 0) return;
  const float* sp = src.ptr<float>() + src_col;
  float* dp = dst.ptr<float>() + dst_col;
  pool().parallel_for(rows, std::max<int64_t>(1, 16384 / n_cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      std::memcpy(dp + r * dc, sp + r * sc, static_cast<size_t>(n_cols) * sizeof(float));
  });
}

}  // namespace sluice
