// Top-k selection that keeps, among equal values, exactly the elements PyTorch's CPU
// `torch.topk(largest=True)` keeps. transformers is sluice's reference, and some of its
// selections tie often: qwen4_exp's QSA indexer scores a key block by a sum of relu()s, so
// every block whose dot products are all negative scores exactly 0, and when such zeros
// straddle the k-th place the kept set is whatever torch's topk returns (not the lowest
// indices, not a stable order). Found on independent qwen4_exp checkpoints (issue 15): a
// different tie rule changed the attended blocks and the logits by 0.5-1.0 at those positions.
//
// torch's CPU kernel (aten TopKImpl.h, topk_impl_loop) fills a queue of (value, index) pairs in
// index order and, with the comparator "x before y iff x > y, NaN first", runs
//   std::partial_sort(begin, begin + k, end)          when k * 64 <= n,
//   std::nth_element(begin, begin + k - 1, end)        otherwise (then sorts the first k - 1),
// and returns the first k pairs. Which tied elements end up in front is decided by the
// algorithms' exact sequence of comparisons and swaps, so this file re-implements those two
// algorithms step for step (libstdc++'s introselect: median-of-three pivot, unguarded
// partition, insertion sort of the last <= 3 elements, heap select past 2 floor(log2 n)
// rounds; and its heap select for partial_sort). Only the *set* of the first k matters to
// sluice, so the final sorts are left out. tests/unit/torch_topk_test.cpp checks the result
// against std::partial_sort / std::nth_element on inputs full of ties.
//
// Header-only and usable in CUDA device code (one thread), on an index array: `order` holds
// a permutation of [0, n) (start with 0, 1, ..., n - 1) and `before(a, b)` compares the
// elements the indices name.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace sluice::torch_topk {

// torch's comparator for largest = true: NaN first, then larger values first.
SLUICE_HOST_DEVICE inline bool greater_nan_first(float x, float y) {
  return (x != x && !(y != y)) || x > y;
}

SLUICE_HOST_DEVICE inline void swap_at(int32_t* o, int64_t a, int64_t b) {
  const int32_t t = o[a];
  o[a] = o[b];
  o[b] = t;
}

// ---- heaps (max-heap under `before`: the root is the element that sorts last) ----
template <class Before>
SLUICE_HOST_DEVICE void heap_push(int32_t* o, int64_t hole, int64_t top, int32_t value, Before before) {
  int64_t parent = (hole - 1) / 2;
  while (hole > top && before(o[parent], value)) {
    o[hole] = o[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  o[hole] = value;
}

template <class Before>
SLUICE_HOST_DEVICE void heap_adjust(int32_t* o, int64_t hole, int64_t len, int32_t value, Before before) {
  const int64_t top = hole;
  int64_t child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (before(o[child], o[child - 1])) --child;
    o[hole] = o[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    o[hole] = o[child - 1];
    hole = child - 1;
  }
  heap_push(o, hole, top, value, before);
}

template <class Before>
SLUICE_HOST_DEVICE void heap_make(int32_t* o, int64_t len, Before before) {
  if (len < 2) return;
  for (int64_t parent = (len - 2) / 2;; --parent) {
    heap_adjust(o, parent, len, o[parent], before);
    if (parent == 0) return;
  }
}

// The `mid` elements that sort first end up in o[0, mid) (in heap order).
template <class Before>
SLUICE_HOST_DEVICE void heap_select(int32_t* o, int64_t mid, int64_t n, Before before) {
  heap_make(o, mid, before);
  for (int64_t i = mid; i < n; ++i)
    if (before(o[i], o[0])) {  // pop the root into i, sift i's element in
      const int32_t value = o[i];
      o[i] = o[0];
      heap_adjust(o, 0, mid, value, before);
    }
}

// ---- introselect ----
template <class Before>
SLUICE_HOST_DEVICE void move_median_to_first(int32_t* o, int64_t result, int64_t a, int64_t b, int64_t c,
                                             Before before) {
  if (before(o[a], o[b])) {
    if (before(o[b], o[c])) swap_at(o, result, b);
    else if (before(o[a], o[c])) swap_at(o, result, c);
    else swap_at(o, result, a);
  } else if (before(o[a], o[c])) {
    swap_at(o, result, a);
  } else if (before(o[b], o[c])) {
    swap_at(o, result, c);
  } else {
    swap_at(o, result, b);
  }
}

// Partitions [first, last) around the element at `pivot` (outside the range); returns the cut.
template <class Before>
SLUICE_HOST_DEVICE int64_t partition_unguarded(int32_t* o, int64_t first, int64_t last, int64_t pivot,
                                               Before before) {
  for (;;) {
    while (before(o[first], o[pivot])) ++first;
    --last;
    while (before(o[pivot], o[last])) --last;
    if (!(first < last)) return first;
    swap_at(o, first, last);
    ++first;
  }
}

template <class Before>
SLUICE_HOST_DEVICE void insertion_sort(int32_t* o, int64_t first, int64_t last, Before before) {
  if (first == last) return;
  for (int64_t i = first + 1; i != last; ++i) {
    const int32_t value = o[i];
    if (before(value, o[first])) {
      for (int64_t j = i; j > first; --j) o[j] = o[j - 1];
      o[first] = value;
    } else {
      int64_t hole = i;
      while (before(value, o[hole - 1])) {
        o[hole] = o[hole - 1];
        --hole;
      }
      o[hole] = value;
    }
  }
}

SLUICE_HOST_DEVICE inline int64_t floor_log2(int64_t n) {
  int64_t r = 0;
  while (n > 1) {
    n >>= 1;
    ++r;
  }
  return r;
}

// std::nth_element(o, o + nth, o + n, before), step for step.
template <class Before>
SLUICE_HOST_DEVICE void nth_element(int32_t* o, int64_t nth, int64_t n, Before before) {
  if (n == 0 || nth == n) return;
  int64_t first = 0, last = n, depth = 2 * floor_log2(n);
  while (last - first > 3) {
    if (depth == 0) {
      heap_select(o + first, nth + 1 - first, last - first, before);
      swap_at(o, first, nth);
      return;
    }
    --depth;
    const int64_t mid = first + (last - first) / 2;
    move_median_to_first(o, first, first + 1, mid, last - 1, before);
    const int64_t cut = partition_unguarded(o, first + 1, last, first, before);
    if (cut <= nth) first = cut;
    else last = cut;
  }
  insertion_sort(o, first, last, before);
}

// Leaves in order[0, k) the k elements torch.topk(largest=True) on the CPU returns (as a set;
// their order is not torch's). order: a permutation of [0, n), normally the identity; 0 < k <= n.
template <class Before>
SLUICE_HOST_DEVICE void select(int32_t* order, int64_t n, int64_t k, Before before) {
  if (k * 64 <= n) heap_select(order, k, n, before);  // std::partial_sort's selection phase
  else nth_element(order, k - 1, n, before);
}

}  // namespace sluice::torch_topk
