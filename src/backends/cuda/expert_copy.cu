// launch_expert_copies: a grid-stride copy of each listed record by one wave of blocks, each
// thread keeping kCopyLoads 16-byte loads in flight (copy_listed.cuh), read from host memory
// over PCIe with cache-volatile loads (the same pinned buffers are refilled with other
// records between launches). The list itself is in device memory: every thread reads
// the count and the descriptors, and thousands of warps reading one host-mapped word each
// cost milliseconds per launch over PCIe. launch_phase_handshake: the device's side of a
// phase's handshake in one block, which is also what takes the list into device memory (one
// block's reads of it, not thousands).
#include "backends/cuda/common.cuh"
#include "backends/cuda/copy_listed.cuh"
#include "backends/cuda/expert_copy.h"

namespace sluice::cuda {
namespace {

// The device's global timer, in ns (the handshake's wait bound and its timeline).
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One wave of blocks (expert_copy_blocks): most launches copy nothing (a decode layer's phase
// 2 with every miss copied beside phase 1, or none), and such a launch costs its grid.
__global__ void expert_copies_kernel(const CopyDesc* descs, const uint32_t* count, uint8_t* clear, uint32_t clear_bytes) {
  chained_kernel_entry();
  const uint64_t tid = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t c = tid; c < clear_bytes; c += stride) clear[c] = 0;
  copy_listed(CopyList{descs, count}, static_cast<int32_t>(blockIdx.x), static_cast<int32_t>(gridDim.x));
}

// The copy kernel's blocks: one a streaming multiprocessor, each thread kCopyLoads 16-byte loads
// in flight (132 x 256 x 8 x 16 B = 4.3 MiB on an H100: PCIe needs ~0.1 MiB in flight).
unsigned expert_copy_blocks() { return static_cast<unsigned>(device_sm_count()); }

__device__ __forceinline__ uint64_t load_system(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_system(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// One block (kHandshakeThreads threads). Thread 0 signals and waits; then the block copies the
// list in one wave of reads: the count, the first descriptors, and the table entries of the
// pairs, a warp a pair (an ExpertRef is 11 u64); descriptors past kSpeculativeDescs after the
// count. Host-mapped reads go through __ldcv (fetched again every time: the host rewrites
// these buffers every call).
constexpr int kHandshakeThreads = 256;

// Adds one call of the timeline's point (p.layer; phase 1 or 2) to p.times (thread 0, after
// the block's work): the time since the point before (t_entry less p.times[0]), the wait for
// the host and the list read, in ns; p.times[0] becomes now.
__device__ void add_timeline_point(const PhaseHandshake& p, bool phase1, uint64_t t_entry, uint64_t wait_ns,
                                   uint64_t read_ns) {
  const uint64_t t_end = global_timer_ns(), last = p.times[0];
  uint64_t* sums = p.times + 1 + (p.layer * kTimelinePoints + (phase1 ? 0 : 1)) * kTimelineSums;
  if (last != 0) sums[0] += t_entry - last;
  sums[1] += wait_ns;
  sums[2] += read_ns;
  sums[3] += 1;
  p.times[0] = t_end;
}

// The hits on the device (PhaseHandshake::hit_slots): true when every pair's record has a slot
// in the host's map and the block took them (both tables' entries, the settled header, the
// pairs' flags zeroed, hits_taken and router_ready stored); false, having written nothing,
// otherwise. The map's reads are one PCIe round trip, the whole host turn they replace.
__device__ bool hits_on_device(const PhaseHandshake& p, uint32_t* dev_head) {
  __shared__ int32_t slot_s[kMaxMapPairs];
  __shared__ int all_s;
  if (threadIdx.x == 0) all_s = 1;
  __syncthreads();
  for (int32_t q = threadIdx.x; q < p.pairs; q += blockDim.x) {
    const int32_t slot = __ldcv(p.hit_slots + p.first_record + p.ids[q]);
    slot_s[q] = slot;
    if (slot < 0) all_s = 0;
  }
  __syncthreads();
  if (!all_s) return false;
  const uint64_t t_entry = p.times != nullptr ? global_timer_ns() : 0;
  constexpr uint32_t kRefWords = sizeof(ExpertRef) / 8, kPointerWords = 9;  // data, scales, bias
  auto* dev_table = reinterpret_cast<uint64_t*>(p.dev_list + p.table_offset);
  auto* settled_table = reinterpret_cast<uint64_t*>(p.dev_list + p.settled_table_offset);
  const auto* ref0 = reinterpret_cast<const uint64_t*>(p.slot_ref);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int32_t q = warp; q < p.pairs; q += kHandshakeThreads / 32) {
    if (lane >= kRefWords) continue;
    uint64_t w = ref0[lane];
    if (lane < kPointerWords && w != 0) w += static_cast<uint64_t>(slot_s[q]) * p.slot_bytes;
    const uint64_t at = static_cast<uint64_t>(p.ids[q]) * kRefWords + lane;
    dev_table[at] = w;
    settled_table[at] = w;
  }
  for (uint32_t c = threadIdx.x; c < p.clear_bytes; c += blockDim.x) p.clear[c] = 0;
  if (threadIdx.x == 0) {
    dev_head[0] = 0;  // no copies
    dev_head[1] = 1;  // settled: phase 2 takes its entries here and waits for nothing
    const uint64_t v = ++*p.calls;
    // The routing (the top-k kernel's, finished) reaches the host before the signals, and
    // hits_taken before router_ready (two release stores of one thread, in order).
    __threadfence_system();
    store_system(p.signals + p.signal_hits, v);
    store_system(p.signals + p.signal_out, v);
  }
  if (p.times != nullptr) {  // a phase-1 point whose wait and list read are 0
    __syncthreads();
    if (threadIdx.x == 0) add_timeline_point(p, true, t_entry, 0, 0);
  }
  return true;
}
// Descriptors read with the header, before its count is known: a decode layer lists a few.
constexpr uint32_t kSpeculativeDescs = 32;
static_assert(sizeof(ExpertRef) % 8 == 0 && sizeof(CopyDesc) % 8 == 0, "copied as u64 words");

__global__ void __launch_bounds__(kHandshakeThreads) phase_handshake_kernel(PhaseHandshake p) {
  // Launched chained: the copy kernel and the experts' after it launch while this one waits.
  chained_kernel_entry();
  __shared__ uint32_t count_s;
  __shared__ int ok_s, taken_s;
  auto* dev_head = reinterpret_cast<uint32_t*>(p.dev_list);  // [count][settled]
  uint64_t t_entry = 0, t_seen = 0;  // thread 0's, for p.times
  if (p.hit_slots != nullptr && hits_on_device(p, dev_head)) return;
  if (threadIdx.x == 0) {
    t_entry = global_timer_ns();
    const uint64_t v = p.next_call ? ++*p.calls : *p.calls;
    // Phase 2 settled at the plan: phase 1's kernel took its entries (this call's: it stores
    // the word every call), and no host thread waits for resident_done.
    const bool taken = !p.next_call && p.settled_table_offset != 0 && dev_head[1] != 0;
    if (!taken) {
      // The kernels before this one finished (chained_kernel_entry waited for them); their
      // writes to host memory (the routing) reach the host before the signal.
      __threadfence_system();
      store_system(p.signals + p.signal_out, v);
    }
    const uint64_t t0 = global_timer_ns();
    int ok = 1;
    for (uint32_t spin = 1; !taken && load_system(p.signals + p.signal_in) < v; ++spin) {
      __nanosleep(256);
      if (spin % 64 == 0 && global_timer_ns() - t0 > p.timeout_ns) {
        ok = 0;
        // A plain store, not a system atomic (those on host memory need PCIe atomics): the
        // first layer to time out is kept, give or take a race between two layers' waits.
        volatile uint32_t* failed = p.failed;
        if (*failed == 0) *failed = static_cast<uint32_t>(p.layer + 1);
        __threadfence_system();
        break;
      }
    }
    t_seen = global_timer_ns();
    ok_s = ok;
    taken_s = taken;
  }
  __syncthreads();
  const bool read_host = ok_s && !taken_s;
  constexpr uint32_t kDescWords = sizeof(CopyDesc) / 8, kRefWords = sizeof(ExpertRef) / 8;
  static_assert(kRefWords <= 16, "a warp takes a pair's two entries, lanes 0-15 and 16-31");
  static_assert(kSpeculativeDescs * kDescWords <= kHandshakeThreads, "a word a thread");
  const auto* host_descs = reinterpret_cast<const uint64_t*>(p.host_list + p.copies_offset);
  auto* dev_descs = reinterpret_cast<uint64_t*>(p.dev_list + p.copies_offset);
  const uint32_t first_words = min(p.max_copies, kSpeculativeDescs) * kDescWords;
  const auto* host_table = reinterpret_cast<const uint64_t*>(p.host_list + p.table_offset);
  auto* dev_table = reinterpret_cast<ExpertRef*>(p.dev_list + p.table_offset);
  // Phase 2's entries, taken by phase 1 (from host memory) and by phase 2 when settled (from here).
  auto* settled_table = reinterpret_cast<uint64_t*>(p.dev_list + p.settled_table_offset);
  const auto* next_host_table = reinterpret_cast<const uint64_t*>(p.host_list + p.next_list_offset + p.table_offset);
  const bool take_next = read_host && p.next_call && p.settled_table_offset != 0;
  for (uint32_t c = threadIdx.x; c < p.clear_bytes; c += blockDim.x) p.clear[c] = 0;
  if (p.mark_done != nullptr) {  // all of phase 1's entries read before any is replaced
    for (int32_t q = threadIdx.x; q < p.pairs; q += blockDim.x)
      p.mark_done[q] = dev_table[p.ids[q]].wtype != WType::unavailable ? 1 : 0;
    __syncthreads();
  }
  // Pair q's entries: lanes 0-15 this phase's table (word `lane`), lanes 16-31 phase 2's when
  // phase 1 takes them (settled protocol; phase 2 reads them only when the header says settled).
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool this_lane = lane < kRefWords, next_lane = take_next && lane >= 16 && lane < 16 + kRefWords;
  auto host_entry = [&](int32_t e) {
    const uint64_t word = static_cast<uint64_t>(e) * kRefWords + lane % 16;
    return this_lane ? __ldcv(host_table + word) : next_lane ? __ldcv(next_host_table + word) : 0;
  };
  auto store_entry = [&](int32_t e, uint64_t v) {
    const uint64_t word = static_cast<uint64_t>(e) * kRefWords + lane % 16;
    if (this_lane) reinterpret_cast<uint64_t*>(dev_table + e)[lane] = v;
    else if (next_lane) settled_table[word] = v;
  };
  // After the signal, one wave of host reads, every load issued before any is used (one PCIe
  // round trip, not one for the header and another for what it counts): the header (thread
  // 0), the first kSpeculativeDescs descriptors whatever the count (those past it are never
  // read: the copy kernel reads count of them), and each warp's first pair's entries.
  uint64_t head = 0, desc = 0, entry = 0;
  const int32_t e0 = warp < p.pairs ? p.ids[warp] : -1;
  if (read_host) {
    if (threadIdx.x == 0) head = __ldcv(reinterpret_cast<const unsigned long long*>(p.host_list));
    if (threadIdx.x < first_words) desc = __ldcv(host_descs + threadIdx.x);
    if (e0 >= 0) entry = host_entry(e0);
  }
  if (read_host && threadIdx.x < first_words) dev_descs[threadIdx.x] = desc;
  for (int32_t q = warp; q < p.pairs; q += kHandshakeThreads / 32) {
    const int32_t e = q == warp ? e0 : p.ids[q];
    if (!ok_s) {
      if (lane == 0) dev_table[e].wtype = WType::unavailable;  // nothing computed; the host reports the layer
    } else if (taken_s) {
      if (this_lane) reinterpret_cast<uint64_t*>(dev_table + e)[lane] = settled_table[static_cast<uint64_t>(e) * kRefWords + lane];
    } else {
      store_entry(e, q == warp ? entry : host_entry(e));
    }
  }
  if (threadIdx.x == 0) {
    const uint32_t count = read_host ? min(static_cast<uint32_t>(head), p.max_copies) : 0u;
    count_s = count;
    dev_head[0] = count;
    // Settled (the list's second word), stored every call by phase 1.
    if (p.next_call && p.settled_table_offset != 0) dev_head[1] = read_host && (head >> 32) != 0 ? 1u : 0u;
  }
  __syncthreads();
  // A list longer than the speculative read: the rest, now that the count is known.
  for (uint32_t w = first_words + threadIdx.x; w < count_s * kDescWords; w += blockDim.x)
    dev_descs[w] = __ldcv(host_descs + w);
  if (p.times != nullptr) {  // launches on one stream: one phase at a time adds
    __syncthreads();
    if (threadIdx.x == 0) add_timeline_point(p, p.next_call, t_entry, t_seen - t_entry, global_timer_ns() - t_seen);
  }
}

__global__ void timeline_stamp_kernel(uint64_t* times, int64_t layer) {
  const uint64_t now = global_timer_ns(), last = times[0];
  uint64_t* sums = times + 1 + (layer * kTimelinePoints + 2) * kTimelineSums;
  if (last != 0) sums[0] += now - last;
  sums[3] += 1;
  times[0] = now;
}

}  // namespace

void launch_timeline_stamp(uint64_t* times, int64_t layer, Stream s) {
  timeline_stamp_kernel<<<1, 1, 0, static_cast<cudaStream_t>(s)>>>(times, layer);
  CUDA_CHECK(cudaGetLastError());
}

void launch_phase_handshake(const PhaseHandshake& p, Stream s) {
  launch_chained(phase_handshake_kernel, dim3(1), dim3(kHandshakeThreads), 0, static_cast<cudaStream_t>(s), p);
  CUDA_CHECK(cudaGetLastError());
}

void launch_expert_copies(const CopyDesc* descs, const uint32_t* count, Stream s, uint8_t* clear, uint32_t clear_bytes) {
  launch_chained(expert_copies_kernel, dim3(expert_copy_blocks()), dim3(256), 0, static_cast<cudaStream_t>(s), descs,
                 count, clear, clear_bytes);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace sluice::cuda
