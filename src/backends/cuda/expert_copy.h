// The CUDA streamer's copies of landed expert records from pinned host memory into device
// slots, done by a kernel that reads its work list at run time. The service thread that
// answers the handshake publishes the list in host-mapped memory and never calls the CUDA API
// (a CUDA call on the service thread can wait on a lock held by the model thread, whose own
// call waits for the stream, which waits for the service thread: a deadlock). The model
// thread enqueues the kernel ahead, behind the handshake signal that publishes the list.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels.h"

namespace sluice::cuda {

// One copy: bytes (a multiple of 16) from src (host memory mapped into the device's address
// space, 16-byte aligned) to dst (device memory, 16-byte aligned).
struct CopyDesc {
  const void* src = nullptr;
  void* dst = nullptr;
  uint64_t bytes = 0;
};

// Copies descs[0 .. *count) on `s`. descs and count are device memory (the streamer copies the
// host's list there in stream order, behind the signal that publishes it); the sources are
// host-mapped and read when the kernel runs. The same kernel zeroes clear[0, clear_bytes)
// (device memory; null: nothing), so the decode step clears its pairs' flags without a memset
// on the stream.
void launch_expert_copies(const CopyDesc* descs, const uint32_t* count, Stream s, uint8_t* clear = nullptr,
                          uint32_t clear_bytes = 0);

// A kernel that only waits `us` microseconds on `s` (one thread, the device's global timer):
// tests delay a stream with it so that a missing ordering between two streams shows
// (StreamerOptions::test_copy_delay_us).
void launch_stream_delay(uint32_t us, Stream s);

}  // namespace sluice::cuda
