// The IO engine: reads of expert records from pack files into caller-owned, 4096-aligned
// memory (a CPU slot, or pinned staging on CUDA), several in flight at once.
//
// Paths, best first:
//   io_uring + O_DIRECT   one IO thread owns the ring and keeps up to queue_depth reads in
//                         flight; submit() from any thread wakes it through an eventfd
//   io_uring, buffered    when the filesystem refuses O_DIRECT (tmpfs, some FUSE), or when
//                         IoMode::buffered is asked for
//   pread threads         when io_uring is refused (seccomp, old kernel), or forced by
//                         IoEngineOptions::use_io_uring = false; O_DIRECT still applies
// Each fallback is logged once per process.
//
// Every read completes exactly once, as ok or as an error that names the record and file:
// short reads are continued (an unaligned remainder through a buffered descriptor), EINTR
// and EAGAIN are retried, EIO is retried once, a read past the end of the file is a "short
// read" error, and a read in flight longer than request_timeout is cancelled and reported
// as Status::timeout. Waits (poll, drain) take a timeout, so no caller can hang on the disk.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/error.h"
#include "experts/streamer_options.h"

namespace sluice {

enum class IoPriority : uint8_t { demand, prefetch };  // queued demand reads go first

struct ReadRequest {
  int32_t file = 0;        // an index returned by add_file
  uint64_t offset = 0;     // byte offset in the file; a multiple of kIoAlign
  uint64_t bytes = 0;      // bytes wanted, > 0
  void* dest = nullptr;    // kIoAlign-aligned, at least io_align_up(bytes) bytes (a direct read
                           // fills whole blocks, so bytes past `bytes` up to the next block
                           // boundary may be overwritten)
  int64_t record = -1;     // named in error messages
  uint64_t tag = 0;        // the caller's, returned in the completion
  IoPriority priority = IoPriority::demand;
};

struct ReadCompletion {
  uint64_t tag = 0;
  int64_t record = -1;
  Status status = Status::ok;
  std::string error;       // empty when ok
  uint64_t bytes = 0;      // bytes delivered (the request's bytes when ok)
  double seconds = 0;      // from submit to completion
};

struct IoEngineOptions {
  IoMode mode = IoMode::direct;
  int queue_depth = 8;                                  // reads in flight, 1..256
  bool use_io_uring = true;                             // false: pread threads
  std::chrono::milliseconds request_timeout{30000};     // one read, submit to completion
  // Called on the IO thread for each completion instead of queueing it for poll(). Must not
  // block for long; an exception it throws is caught and the completion queued as an error.
  std::function<void(const ReadCompletion&)> on_complete;
  // Tests only: sees each answer of the OS to a read (bytes read, or -errno) and returns the
  // answer the engine acts on, to drive the real retry and error paths (EIO, short reads).
  // Called on the IO thread; must not throw.
  std::function<int64_t(const ReadRequest&, int64_t result)> fault_injection;
};

struct IoCounters {
  uint64_t reads = 0;          // completed ok
  uint64_t errors = 0;         // completed with an error
  uint64_t bytes = 0;          // delivered by reads that completed ok
  uint64_t retries = 0;        // EINTR / EAGAIN / EIO resubmissions
  uint64_t continuations = 0;  // short reads continued
  double busy_seconds = 0;     // wall time with at least one read in flight
};

class IoEngine {
 public:
  explicit IoEngine(IoEngineOptions opt = {});
  ~IoEngine();  // cancels what is in flight and waits for it, for a bounded time
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Opens a file for reading (O_DIRECT in direct mode when the filesystem allows it).
  int32_t add_file(const std::filesystem::path& path);
  // Reads from an already open descriptor (duplicated; the caller keeps its own), buffered.
  // `name` stands for it in errors. For callers that open files themselves, and for tests
  // (a pipe never answers: the timeout path).
  int32_t add_fd(int fd, const std::string& name);
  bool file_is_direct(int32_t file) const;
  uint64_t file_size(int32_t file) const;

  // Queues a read; never blocks on the disk. Thread-safe. Bad arguments throw at once.
  void submit(const ReadRequest& req);

  // Moves every completion ready now into `out` (appending), waiting up to `wait` for the
  // first one. Returns how many were added. Thread-safe.
  size_t poll(std::vector<ReadCompletion>& out, std::chrono::milliseconds wait);

  // Waits until every submitted read has completed (and, without on_complete, sits in the
  // completion queue). False when `wait` ran out first.
  bool drain(std::chrono::milliseconds wait);

  // Whether poll() would return something now, without taking the engine's lock: a thread
  // that polls in a tight loop (the CUDA streamer's service thread spinning on device
  // signals) checks this first, or its lock traffic starves the IO thread.
  bool has_completions() const;
  int64_t outstanding() const;      // submitted and not yet completed
  bool uses_io_uring() const;
  IoMode mode() const;
  int queue_depth() const;
  IoCounters counters() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

namespace io_detail {

// The retry decision for one read after the OS answered `res` (bytes read, or -errno):
// shared by the io_uring and pread paths, and unit-tested on its own.
struct ReadProgress {
  uint64_t done = 0;       // bytes delivered so far
  uint64_t want = 0;       // the request's bytes
  int eio_retries = 0;
  int transient_retries = 0;
  bool direct = false;     // the current descriptor is O_DIRECT
};
enum class ReadAction { complete, resubmit, resubmit_buffered, fail };
struct ReadDecision {
  ReadAction action = ReadAction::fail;
  Status status = Status::ok;
  std::string reason;      // for fail
};
constexpr int kMaxTransientRetries = 1000;  // EINTR / EAGAIN in a row (each is immediate)
ReadDecision next_read_action(ReadProgress& p, int64_t res, uint64_t file_offset_of_request);

}  // namespace io_detail

}  // namespace sluice
