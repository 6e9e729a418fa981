// measure_read_rate (read_rate.h): the IO engine reading random whole records.
#include "experts/read_rate.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/error.h"
#include "experts/io_engine.h"

namespace sluice {

ReadRate measure_read_rate(const Pack& pack, DType kind, int depth, uint64_t max_bytes, double max_seconds,
                           uint64_t seed) {
  using Clock = std::chrono::steady_clock;
  const uint64_t stride = pack.kind(kind).record_stride;
  const int64_t n_records = pack.manifest().n_records();
  SLUICE_CHECK(depth >= 1 && stride > 0 && n_records > 0, Status::invalid_argument, "read rate: depth ", depth, " over ",
               n_records, " records of ", stride, " bytes");
  IoEngineOptions o;
  o.mode = IoMode::direct;
  o.queue_depth = depth;
  IoEngine io(o);
  const int32_t f = io.add_file(pack.expert_file(kind));
  ReadRate r;
  r.record_bytes = stride;
  r.depth = depth;
  r.direct = io.file_is_direct(f);
  // At most four passes over the file's records (a small pack: its reads are counted, not timed
  // for seconds), at least four reads a slot in flight.
  const int64_t n = std::max<int64_t>(std::min<int64_t>(static_cast<int64_t>(max_bytes / stride), 4 * n_records), 4 * depth);
  std::vector<AlignedBuffer> bufs;
  for (int i = 0; i < depth; ++i) bufs.emplace_back(stride);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  auto next_record = [&] {  // xorshift*: random records, repeats allowed
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return static_cast<int64_t>((x * 0x2545F4914F6CDD1Dull) % static_cast<uint64_t>(n_records));
  };
  int64_t submitted = 0, done = 0;
  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  auto submit = [&](int buf) {
    ReadRequest q;
    q.file = f;
    q.record = next_record();
    q.offset = pack.record_offset(kind, q.record);
    q.bytes = stride;
    q.dest = bufs[static_cast<size_t>(buf)].data();
    q.tag = static_cast<uint64_t>(buf);
    io.submit(q);
    ++submitted;
  };
  for (int i = 0; i < depth && submitted < n; ++i) submit(i);
  std::vector<ReadCompletion> cs;
  while (done < submitted) {
    cs.clear();
    io.poll(cs, std::chrono::milliseconds(1000));
    for (const ReadCompletion& c : cs) {
      if (c.status != Status::ok) fail(c.status, "read rate: ", c.error);
      ++done;
      // Stop issuing once the budget is spent (the reads in flight still count).
      if (submitted < n && elapsed() < max_seconds) submit(static_cast<int>(c.tag));
    }
    SLUICE_CHECK(!cs.empty() || elapsed() < 60, Status::timeout, "read rate: no read of ", pack.expert_file(kind).string(),
                 " completed for a minute");
  }
  r.seconds = elapsed();
  r.reads = static_cast<uint64_t>(done);
  r.bytes = r.reads * stride;
  r.bytes_per_second = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds : 0;
  return r;
}

}  // namespace sluice
