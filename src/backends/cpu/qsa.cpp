// CPU QSA ops (qwen4_exp's sparse attention): mean_rows (pooling token keys into block keys),
// qsa_select (the indexer's block top-k plus the uncompressed tail, as token indices; tied
// scores resolved as torch.topk on the CPU resolves them) and
// attention_indexed (attention over those tokens only). transformers applies the selection as
// a mask over full attention: masked scores become exp(-inf) = 0, so a softmax over the kept
// keys alone is the same sum.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops_common.h"
#include "core/torch_topk.h"

namespace sluice {

void CpuBackend::mean_rows(const Tensor& src, int64_t group, const Tensor& dst) {
  const int64_t m = cpu::lead_rows(dst), c = dst.cols();
  SLUICE_CHECK(src.dtype == DType::f32 && dst.dtype == DType::f32 && group > 0 && src.cols() == c &&
                   cpu::lead_rows(src) == m * group && !cpu::overlaps(src, dst),
               Status::internal, "cpu mean_rows: src ", src.shape_str(), ", group ", group, ", dst ", dst.shape_str(),
               " (want f32 src [m * group, c], dst [m, c])");
  const float* sp = src.ptr<float>();
  float* dp = dst.ptr<float>();
  const float div = static_cast<float>(group);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t col = 0; col < c; ++col) {
      float acc = sp[(i * group) * c + col];
      for (int64_t j = 1; j < group; ++j) acc += sp[(i * group + j) * c + col];
      dp[i * c + col] = acc / div;
    }
}

void CpuBackend::qsa_select(const Tensor& q, const Tensor& block_keys, const Tensor& idx, const QsaParams& p) {
  const int64_t c = p.compress_ratio, k = p.block_topk;
  const bool shapes = q.ndim == 3 && block_keys.ndim == 2 && idx.ndim == 2 && c > 0 && k > 0 &&
                      block_keys.shape[1] == q.shape[2] && idx.shape[0] == q.shape[0] && idx.shape[1] == k * c + c - 1 &&
                      p.n_past >= 0 && block_keys.shape[0] >= (p.n_past + q.shape[0]) / c;
  SLUICE_CHECK(q.dtype == DType::f32 && block_keys.dtype == DType::f32 && idx.dtype == DType::i32 && shapes,
               Status::internal, "cpu qsa_select: q ", q.shape_str(), ", block_keys ", block_keys.shape_str(), ", idx ",
               dtype_name(idx.dtype), " ", idx.shape_str(), ", n_past ", p.n_past, ", compress_ratio ", c,
               ", block_topk ", k,
               " (want f32 q [n, n_head, d], block_keys [>= (n_past + n) / c, d], idx i32 [n, block_topk c + c - 1])");
  const int64_t n = q.shape[0], n_head = q.shape[1], d = q.shape[2], width = idx.shape[1];
  const float sqrt_d = static_cast<float>(std::sqrt(static_cast<double>(d)));
  const float* qp = q.ptr<float>();
  const float* kp = block_keys.ptr<float>();
  int32_t* ip = idx.ptr<int32_t>();
  pool().parallel_for(n, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> score;
    std::vector<int32_t> order, tokens;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t pos = p.n_past + i, m = (pos + 1) / c;
      order.resize(static_cast<size_t>(m));
      std::iota(order.begin(), order.end(), 0);
      if (m > k) {
        score.assign(static_cast<size_t>(m), 0.0f);
        for (int64_t b = 0; b < m; ++b) {
          float s = 0.0f;
          for (int64_t h = 0; h < n_head; ++h)
            s += std::max(0.0f, cpu::dot<DType::f32>(qp + (i * n_head + h) * d, kp + b * d, d));
          score[b] = s / sqrt_d;
        }
        // Ties (exact zeros: every dot product of a block negative) keep the blocks torch.topk
        // keeps, as transformers does (core/torch_topk.h).
        torch_topk::select(order.data(), m, k,
                           [&](int32_t a, int32_t b) { return torch_topk::greater_nan_first(score[a], score[b]); });
        order.resize(static_cast<size_t>(k));
      }
      tokens.clear();
      for (int32_t b : order)
        for (int64_t j = 0; j < c; ++j) tokens.push_back(static_cast<int32_t>(b * c + j));
      for (int64_t t = m * c; t <= pos; ++t) tokens.push_back(static_cast<int32_t>(t));
      std::sort(tokens.begin(), tokens.end());
      int32_t* row = ip + i * width;
      std::fill(row, row + width, -1);
      std::copy(tokens.begin(), tokens.end(), row);
    }
  });
}

void CpuBackend::attention_indexed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& idx,
                                   const Tensor& out, float scale) {
  SLUICE_CHECK(q.dtype == DType::f32 && k.dtype == DType::f32 && v.dtype == DType::f32 && out.dtype == DType::f32 &&
                   idx.dtype == DType::i32 && q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && out.ndim == 3 &&
                   idx.ndim == 2 && k.shape == v.shape && out.shape == q.shape && k.shape[2] == q.shape[2] &&
                   k.shape[1] > 0 && q.shape[1] % k.shape[1] == 0 && idx.shape[0] == q.shape[0] &&
                   !cpu::overlaps(out, q),
               Status::internal, "cpu attention_indexed: q ", q.shape_str(), ", k ", k.shape_str(), ", v ",
               v.shape_str(), ", idx ", dtype_name(idx.dtype), " ", idx.shape_str(), ", out ", out.shape_str(),
               " (want f32 q, out [n, n_head, d], k, v [n_ctx, n_kv_head, d], idx i32 [n, m])");
  const int64_t n = q.shape[0], n_head = q.shape[1], d = q.shape[2], n_ctx = k.shape[0], n_kv = k.shape[1];
  const int64_t width = idx.shape[1], group = n_head / n_kv, stride = n_kv * d;
  const int32_t* ip = idx.ptr<int32_t>();
  for (int64_t i = 0; i < n; ++i) {  // validated here: nothing may throw inside a pool task
    int64_t valid = 0;
    for (int64_t j = 0; j < width; ++j) {
      const int32_t t = ip[i * width + j];
      SLUICE_CHECK(t < n_ctx, Status::internal, "cpu attention_indexed: key index ", t, " outside [0, ", n_ctx, ")");
      valid += t >= 0;
    }
    SLUICE_CHECK(valid > 0, Status::internal, "cpu attention_indexed: query row ", i, " lists no key");
  }
  const float* qp = q.ptr<float>();
  const float* kp = k.ptr<float>();
  const float* vp = v.ptr<float>();
  float* op = out.ptr<float>();
  pool().parallel_for(n * n_head, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> s(static_cast<size_t>(width));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t i = u / n_head, h = u % n_head, g = h / group;
      const int32_t* row = ip + i * width;
      const float* qu = qp + u * d;
      float mx = -INFINITY;
      int64_t len = 0;
      for (int64_t j = 0; j < width; ++j) {
        if (row[j] < 0) continue;
        s[len] = cpu::dot<DType::f32>(qu, kp + row[j] * stride + g * d, d) * scale;
        mx = std::max(mx, s[len++]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < len; ++j) sum += s[j] = std::exp(s[j] - mx);
      float* ou = op + u * d;
      std::fill(ou, ou + d, 0.0f);
      int64_t jj = 0;
      for (int64_t j = 0; j < width; ++j) {
        if (row[j] < 0) continue;
        const float pj = s[jj++] / sum;
        const float* vr = vp + row[j] * stride + g * d;
        for (int64_t col = 0; col < d; ++col) ou[col] += pj * vr[col];
      }
    }
  });
}

}  // namespace sluice
