// How a pack's PLE n-gram tables are read (models/pack_ngram_table.h), apart from the table
// so that the loader's options can carry them without pulling in the IO engine.
#pragma once

#include <chrono>
#include <cstdint>

#include "experts/streamer_options.h"

namespace sluice {

constexpr uint64_t kDefaultNgramCacheBytes = uint64_t{64} << 20;  // --ple-cache default, per table

struct NgramTableOptions {
  uint64_t cache_bytes = kDefaultNgramCacheBytes;  // f32 row values kept, per table; 0: no cache
  IoMode io_mode = IoMode::direct;
  bool verify_reads = false;                        // verify tables with multi-page chunks too
  std::chrono::milliseconds io_timeout{30000};      // one read; a lookup waits at most 2x + 5 s
};

}  // namespace sluice
