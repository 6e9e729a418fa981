// core/torch_topk.h: the same elements as torch.topk on the CPU, ties included. Two checks:
// step-for-step equality with the standard algorithms torch's kernel calls (on this build's
// libstdc++, over thousands of tie-heavy inputs), and the index sets torch 2.11 itself
// returned on the GPU machine for a few inputs (recorded there; the tie order is torch's,
// not any "natural" one).
#include "core/torch_topk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>

using namespace sluice;

namespace {

// torch's procedure (aten TopKImpl.h, largest = true), the first k pairs before its final sort.
std::vector<int32_t> reference_topk(const std::vector<float>& v, int64_t k) {
  using Elem = std::pair<double, int64_t>;  // torch's CPU accumulate type for float is double
  std::vector<Elem> q(v.size());
  for (size_t j = 0; j < v.size(); ++j) q[j] = {v[j], static_cast<int64_t>(j)};
  auto before = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  const int64_t n = static_cast<int64_t>(v.size());
  if (k * 64 <= n) std::partial_sort(q.begin(), q.begin() + k, q.end(), before);
  else std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), before);
  std::vector<int32_t> out;
  for (int64_t j = 0; j < k; ++j) out.push_back(static_cast<int32_t>(q[static_cast<size_t>(j)].second));
  return out;
}

std::set<int32_t> as_set(const std::vector<int32_t>& v) { return {v.begin(), v.end()}; }

std::vector<int32_t> sluice_topk(const std::vector<float>& v, int64_t k) {
  std::vector<int32_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  torch_topk::select(order.data(), static_cast<int64_t>(v.size()), k,
                     [&](int32_t a, int32_t b) { return torch_topk::greater_nan_first(v[a], v[b]); });
  order.resize(static_cast<size_t>(k));
  return order;
}

TEST(TorchTopk, SameStepsAsTheStandardAlgorithmsOnTieHeavyInputs) {
  std::mt19937 rng(7);
  int64_t cases = 0, straddling = 0;
  for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 16, 17, 33, 64, 65, 127, 128, 129, 200, 640, 1000, 4099}) {
    for (int rep = 0; rep < 40; ++rep) {
      // Values from a few levels (mostly zeros, as relu scores are), sometimes a NaN.
      const int levels = 1 + rep % 5;
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& x : v) {
        const int r = static_cast<int>(rng() % 100);
        x = r < 50 ? 0.0f : static_cast<float>(rng() % levels) * 0.25f;
        if (rep % 13 == 12 && r == 99) x = NAN;
      }
      for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{3}, n / 64, n / 3, n / 2, n - 1, n}) {
        if (k < 1 || k > n) continue;
        const std::vector<int32_t> want = reference_topk(v, k), got = sluice_topk(v, k);
        if (k * 64 <= n)  // partial_sort: the same heap selection, then a sort select() leaves out
          ASSERT_EQ(as_set(got), as_set(want)) << "n " << n << " k " << k << " rep " << rep;
        else  // nth_element: the same element at every place
          ASSERT_EQ(got, want) << "n " << n << " k " << k << " rep " << rep;
        ++cases;
        std::vector<float> sorted = v;
        std::sort(sorted.begin(), sorted.end(), [](float a, float b) { return torch_topk::greater_nan_first(a, b); });
        straddling += k < n && sorted[static_cast<size_t>(k - 1)] == sorted[static_cast<size_t>(k)];
      }
    }
  }
  EXPECT_GT(straddling, cases / 4) << "the inputs must put ties across the k-th place";
}

TEST(TorchTopk, SetsTorchReturnedOnTheCpu) {
  // torch 2.11.0 on the GPU machine, float32 CPU tensors: torch.topk(x, k).indices.
  struct Case {
    std::vector<float> v;
    int64_t k;
    std::set<int32_t> want;
  };
  const std::vector<Case> cases = {
      {std::vector<float>(4, 0.0f), 2, {2, 3}},
      {std::vector<float>(4, 0.0f), 3, {2, 3, 0}},
      {std::vector<float>(5, 0.0f), 2, {2, 4}},
      {std::vector<float>(8, 0.0f), 2, {6, 5}},
      {std::vector<float>(8, 0.0f), 3, {6, 5, 4}},
      {std::vector<float>(16, 0.0f), 2, {10, 11}},
      {std::vector<float>(40, 0.0f), 2, {28, 26}},
      {std::vector<float>(40, 0.0f), 3, {28, 26, 27}},
      {{0.5f, 0, 0, 0.2f, 0, 0.9f, 0, 0}, 4, {5, 0, 3, 4}},
      {{0.5f, 0, 0, 0.2f, 0, 0.9f, 0, 0}, 5, {5, 0, 3, 4, 6}},
      {{0, 0, 0, 1, 0, 0, 0}, 3, {3, 5, 6}},
  };
  for (const Case& c : cases) EXPECT_EQ(as_set(sluice_topk(c.v, c.k)), c.want) << "n " << c.v.size() << " k " << c.k;
}

}  // namespace
