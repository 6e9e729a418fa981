// PackNgramTable: a PLE n-gram table (models/ple.h) served from a pack's ple.<dtype>.bin,
// never loaded whole (the real model's tables are ~90 GB; a token reads a few rows per PLE
// layer). A lookup takes the rows it finds in a small LRU row cache (bounded in bytes) and
// reads the others through the IO engine (experts/io_engine.h): O_DIRECT, one aligned read per
// distinct page (or chunk) holding the missing rows, all in flight at once.
//
// Verification: when a table's checksum chunk is one page (every table up to 65536 pages,
// format/pack.h), a read fetches whole chunks anyway and each one is checked against its
// manifest checksum before a row of it is used. A larger table is checked on reads only with
// verify_reads, which then reads whole chunks. A mismatch is a corrupt error naming the file,
// the table and the rows.
//
// Thread-safe: concurrent sequences may look rows up at once (one lock per table for its
// cache; the reads of all of a pack's tables take turns on its PleFileReader).
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "experts/io_engine.h"
#include "format/pack.h"
#include "models/ngram_table_options.h"
#include "models/ple.h"

namespace sluice {

// The reads of a pack's n-gram tables: one IO engine (one thread, one open ple file) shared by
// all of them, where a real qwen4_exp has a table per PLE layer. A lookup holds `mu` from its
// first submit to its last completion, so that lookups of different tables on different
// threads take turns instead of taking each other's completions.
struct PleFileReader {
  PleFileReader(const Pack& pack, const NgramTableOptions& opt);
  std::unique_ptr<IoEngine> io;
  int32_t file = -1;
  std::mutex mu;
  uint64_t next_tag = 0;  // guarded by mu
};

class PackNgramTable final : public NgramTable {
 public:
  // `table` must belong to `pack` (the pack keeps it alive). Reads go through `reader` (shared
  // by the pack's tables), or through a reader of its own when none is given.
  PackNgramTable(std::shared_ptr<const Pack> pack, const PackRowTable& table, const NgramTableOptions& opt,
                 std::shared_ptr<PleFileReader> reader = nullptr);
  ~PackNgramTable() override;

  int64_t n_rows() const override { return table_.rows; }
  int64_t dim() const override { return table_.cols; }
  void gather(Backend& be, std::span<const int64_t> ids, const Tensor& out) override;

  struct Counters {
    uint64_t hits = 0, misses = 0;  // rows looked up
    uint64_t reads = 0, bytes_read = 0;
    uint64_t chunks_verified = 0;
    uint64_t evictions = 0;         // rows dropped from the cache
  };
  Counters counters() const;
  int64_t cached_rows() const;
  uint64_t cached_bytes() const;
  // Whether every read is checked against a chunk checksum.
  bool verifies() const { return verify_; }
  const PackRowTable& table() const { return table_; }

 private:
  struct Unit {            // one read: a chunk (verified) or the pages of one row
    uint64_t offset = 0, bytes = 0;
    int64_t chunk = -1;    // the chunk to verify, or -1
    std::unique_ptr<AlignedBuffer> buf;
    bool done = false;
  };
  struct Entry {
    std::vector<float> values;            // [dim]
    std::list<int64_t>::iterator lru;     // position in lru_ (front: most recent)
  };

  void read_units(std::vector<Unit>& units);
  void row_to_f32(const uint8_t* src, float* dst) const;
  void insert(int64_t id, const float* values);
  std::string where() const;

  std::shared_ptr<const Pack> pack_;
  const PackRowTable& table_;
  DType dtype_;
  NgramTableOptions opt_;
  bool verify_ = false;
  uint64_t row_bytes_ = 0;
  std::shared_ptr<PleFileReader> reader_;

  mutable std::mutex mu_;
  std::unordered_map<int64_t, Entry> cache_;
  std::list<int64_t> lru_;
  uint64_t cache_used_ = 0;
  Counters counters_;
};

}  // namespace sluice
