// The CUDA streamer's copies of landed expert records from pinned host memory into device
// slots, done by a kernel that reads its work list at run time. The service thread that
// answers the handshake publishes the list in host-mapped memory and never calls the CUDA API
// (a CUDA call on the service thread can wait on a lock held by the model thread, whose own
// call waits for the stream, which waits for the service thread: a deadlock). The model
// thread enqueues the kernel ahead, behind the handshake signal that publishes the list; by
// default that signal is awaited on the device too, by the handshake kernel below, which
// also takes the list into device memory.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels.h"
#include "backends/cuda/moe_kernels.h"

namespace sluice::cuda {

// CopyDesc, the list's entry: moe_kernels.h.

// Copies descs[0 .. *count) on `s`. descs and count are device memory (the streamer copies the
// host's list there in stream order, behind the signal that publishes it); the sources are
// host-mapped and read when the kernel runs. The same kernel zeroes clear[0, clear_bytes)
// (device memory; null: nothing), so the decode step clears its pairs' flags without a memset
// on the stream.
void launch_expert_copies(const CopyDesc* descs, const uint32_t* count, Stream s, uint8_t* clear = nullptr,
                          uint32_t clear_bytes = 0);

// One phase of a streamed decode MoE layer's handshake done by the device (docs/streamed-step.md,
// "What one MoE layer enqueues"): one block stores the layer's outgoing signal (router_ready
// before phase 1, resident_done before phase 2), waits on the incoming one (resident_ready,
// misses_ready) in host-mapped memory, then takes the phase's list the host published there into
// device memory: the copy list's length and descriptors, and the expert table's entries of the
// call's pairs (the only ones the expert kernels read). No stream memory operation and no copy on
// the stream: the step is kernels only, which a graph can hold. The call's value comes from a
// counter on the device (next_call increments it first), so a replayed graph signals each call
// with its own value, in step with the host's count of calls.
struct PhaseHandshake {
  uint64_t* signals = nullptr;  // the layer's kSignalCount signals (handshake.h), host-mapped, device address
  int signal_out = 0;           // index stored with the call's value
  int signal_in = 0;            // index awaited (>= the call's value)
  uint64_t* calls = nullptr;    // device memory: the layer's calls so far
  bool next_call = false;       // this phase starts a call: calls is incremented first
  const uint8_t* host_list = nullptr;  // the phase's list, host-mapped, device address:
  uint8_t* dev_list = nullptr;         // and its copy in device memory; both laid out as
  uint32_t table_offset = 0;           // [u32 count][...][ExpertRef table at table_offset]
  uint32_t copies_offset = 0;          // [CopyDesc list at copies_offset, max_copies of them]
  uint32_t max_copies = 0;
  const int32_t* ids = nullptr;  // the call's routing [pairs] (device memory): the table entries taken
  int32_t pairs = 0;
  uint32_t* failed = nullptr;  // host-mapped, device address: set to layer + 1 when the wait timed out
  int64_t layer = 0;
  uint64_t timeout_ns = 0;  // after this long without the incoming signal the phase computes nothing
  // Null, or the handshake timeline's sums (device memory, SLUICE_CUDA_HANDSHAKE_TIMES):
  // [0] the last point's time on the device's global timer (ns), then per (layer, point)
  // four u64: the sums over calls of the time from the point before to this one's start (the
  // kernels between), from its start to the incoming signal (the host's turn and the PCIe
  // crossings), and from the signal to its end (the list read), and the count of calls. The
  // points of a layer (kTimelinePoints): 0 phase 1's handshake (next_call), 1 phase 2's, 2
  // the combine's end (launch_timeline_stamp; its two later sums stay 0).
  uint64_t* times = nullptr;
  // Phase 2 (null: nothing): mark_done[q] = 1 for each pair q phase 1 computed (its expert's
  // entry available in the table the device holds, phase 1's, read before this phase's
  // entries replace it), 0 for the others, so that no mark kernel runs after phase 1.
  uint8_t* mark_done = nullptr;
  // Zeroed by the block (device memory; null: nothing): the pairs' done flags before phase 1,
  // when no copy kernel on the stream does it (the copies ride with phase 1's gate/up).
  uint8_t* clear = nullptr;
  uint32_t clear_bytes = 0;
  // Phase 2 settled at the plan (0: never; docs/streamed-step.md): the list's header is [u32
  // count][u32 settled]. When phase 1's host list says settled (the host left nothing to land
  // or decide, so phase 2's list, host_list + next_list_offset, was final before
  // resident_ready), phase 1's kernel also takes phase 2's table entries of the pairs, into
  // dev_list + settled_table_offset, and stores the word in the device list's header (0 or 1,
  // every call). Phase 2's kernel, seeing it there, stores no signal (no host thread waits
  // for it then) and takes those entries from device memory: no wait for the host and no
  // read of host memory.
  uint32_t next_list_offset = 0;
  uint32_t settled_table_offset = 0;
  // The hits on the device (phase 1 with settled_table_offset; null: off): hit_slots is the
  // host's map of every record to the device slot holding its main kind (host-mapped, device
  // address; [n_records] i32, -1: none), kept by the host as the cache changes, and read here
  // before router_ready at the pairs' records (first_record + id). When every pair's record has
  // a slot the block builds both tables' entries from slot_ref (the entry of slot 0, device
  // memory: its pointers move by slot_bytes a slot), marks the list settled with no copies,
  // stores hits_taken and router_ready, and waits for nothing (the host plans the layer behind
  // the device). At most kMaxMapPairs pairs (the host leaves it off above).
  const int32_t* hit_slots = nullptr;
  int64_t first_record = 0;
  const ExpertRef* slot_ref = nullptr;
  uint64_t slot_bytes = 0;
  int signal_hits = 0;  // the index of hits_taken in signals
};
constexpr int32_t kMaxMapPairs = 512;
void launch_phase_handshake(const PhaseHandshake& p, Stream s);

// The timeline's points a MoE layer (PhaseHandshake::times) and their u64 sums each.
constexpr int kTimelinePoints = 3, kTimelineSums = 4;
// SLUICE_CUDA_HANDSHAKE_TIMES: after a layer's combine, the time since phase 2's handshake
// ended (phase 2's copy and expert kernels, the combine) into the layer's point 2, so that
// phase 1's "before it" holds the next layer's dense part alone. One thread, launched plain
// (it starts once the combine finished).
void launch_timeline_stamp(uint64_t* times, int64_t layer, Stream s);

}  // namespace sluice::cuda
