// The disk's read rate for expert records, measured as the streamers read them: whole records
// of one kind (the record stride each) from the pack's expert file, in a random order, through
// the IO engine (O_DIRECT where the filesystem allows it, so the page cache does not flatter
// it) with `depth` reads in flight. The IO bound of a streamed run is this rate over the bytes
// it reads a token (sluice bench; docs/streaming.md, "The IO bound").
#pragma once

#include <cstdint>

#include "format/pack.h"

namespace sluice {

struct ReadRate {
  double bytes_per_second = 0;
  uint64_t reads = 0, bytes = 0;
  uint64_t record_bytes = 0;  // one read: the kind's record stride
  double seconds = 0;
  int depth = 0;
  bool direct = false;        // O_DIRECT (false: the filesystem refused it; buffered reads)
};

// Reads until max_bytes, max_seconds or four reads a record on average (at least 4 reads a
// slot in flight); a failed read is an error naming the record. Deterministic order for a seed.
ReadRate measure_read_rate(const Pack& pack, DType kind, int depth, uint64_t max_bytes, double max_seconds,
                           uint64_t seed = 1);

}  // namespace sluice
