// PackNgramTable: row lookups through the row cache and the IO engine, chunk verification.
#include "models/pack_ngram_table.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "core/bits.h"
#include "core/error.h"
#include "core/log.h"

namespace sluice {

namespace {

}  // namespace

PleFileReader::PleFileReader(const Pack& pack, const NgramTableOptions& opt) {
  IoEngineOptions io_opt;
  io_opt.mode = opt.io_mode;
  io_opt.queue_depth = 16;
  io_opt.request_timeout = opt.io_timeout;
  io = std::make_unique<IoEngine>(io_opt);
  file = io->add_file(pack.ple_file());
}

PackNgramTable::PackNgramTable(std::shared_ptr<const Pack> pack, const PackRowTable& table, const NgramTableOptions& opt,
                               std::shared_ptr<PleFileReader> reader)
    : pack_(std::move(pack)), table_(table), opt_(opt), reader_(std::move(reader)) {
  SLUICE_ASSERT(pack_->manifest().ple.has_value());
  dtype_ = pack_->manifest().ple->dtype;
  row_bytes_ = static_cast<uint64_t>(table_.cols) * dtype_size(dtype_);
  // A chunk no larger than the read that fetches one row costs nothing extra to verify.
  const uint64_t row_read = std::max<uint64_t>(kIoAlign, io_align_up(table_.row_stride));
  verify_ = opt_.verify_reads || static_cast<uint64_t>(table_.chunk_rows) * table_.row_stride <= row_read;
  if (!reader_) reader_ = std::make_shared<PleFileReader>(*pack_, opt_);
  LOG_DEBUG("n-gram table ", table_.prefix, ": ", table_.rows, " rows x ", table_.cols, " ", dtype_name(dtype_),
            ", row cache ", opt_.cache_bytes, " bytes, reads ", verify_ ? "verified" : "not verified");
}

PackNgramTable::~PackNgramTable() = default;

std::string PackNgramTable::where() const { return str(pack_->ple_file().string(), ": n-gram table ", table_.prefix); }

PackNgramTable::Counters PackNgramTable::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

int64_t PackNgramTable::cached_rows() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(cache_.size());
}

uint64_t PackNgramTable::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_used_;
}

void PackNgramTable::row_to_f32(const uint8_t* src, float* dst) const {
  const int64_t n = table_.cols;
  switch (dtype_) {
    case DType::f32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case DType::bf16:
      for (int64_t c = 0; c < n; ++c) {
        uint16_t v;
        std::memcpy(&v, src + 2 * c, 2);
        dst[c] = bf16_to_f32(v);
      }
      return;
    case DType::f16:
      for (int64_t c = 0; c < n; ++c) {
        uint16_t v;
        std::memcpy(&v, src + 2 * c, 2);
        dst[c] = f16_to_f32(v);
      }
      return;
    default: fail(Status::internal, where(), ": dtype ", dtype_name(dtype_), " is not a table dtype");
  }
}

void PackNgramTable::insert(int64_t id, const float* values) {
  const uint64_t bytes = static_cast<uint64_t>(table_.cols) * sizeof(float);
  if (bytes > opt_.cache_bytes || cache_.count(id)) return;
  while (cache_used_ + bytes > opt_.cache_bytes && !lru_.empty()) {
    cache_.erase(lru_.back());
    lru_.pop_back();
    cache_used_ -= bytes;
    ++counters_.evictions;
  }
  lru_.push_front(id);
  Entry& e = cache_[id];
  e.values.assign(values, values + table_.cols);
  e.lru = lru_.begin();
  cache_used_ += bytes;
}

void PackNgramTable::read_units(std::vector<Unit>& units) {
  std::lock_guard<std::mutex> reading(reader_->mu);
  // Tags unique over the reader's life: a completion of an earlier lookup that gave up on its
  // reads (the timeout below) is recognised and ignored, whichever table it was for.
  const uint64_t tag0 = reader_->next_tag;
  reader_->next_tag += units.size();
  for (size_t u = 0; u < units.size(); ++u) {
    Unit& unit = units[u];
    unit.buf = std::make_unique<AlignedBuffer>(unit.bytes);
    ReadRequest r;
    r.file = reader_->file;
    r.offset = unit.offset;
    r.bytes = unit.bytes;
    r.dest = unit.buf->data();
    r.tag = tag0 + u;
    reader_->io->submit(r);
  }
  // Bounded: each read times out on its own (request_timeout); this is the backstop.
  const auto deadline = std::chrono::steady_clock::now() + 2 * opt_.io_timeout + std::chrono::seconds(5);
  size_t left = units.size();
  std::vector<ReadCompletion> done;
  std::string first_error;
  Status first_status = Status::ok;
  while (left > 0) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      // A read still in flight may yet land in its buffer: leak those rather than free them.
      for (Unit& u : units)
        if (!u.done) (void)u.buf.release();
      fail(Status::timeout, where(), ": ", left, " row reads did not complete in time");
    }
    done.clear();
    reader_->io->poll(done, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
    for (const ReadCompletion& c : done) {
      if (c.tag < tag0 || c.tag >= tag0 + units.size()) continue;  // an abandoned lookup's read
      --left;
      units[c.tag - tag0].done = true;
      if (c.status != Status::ok && first_error.empty()) {
        first_error = c.error;
        first_status = c.status;
      }
    }
  }
  if (!first_error.empty()) fail(first_status, where(), ": ", first_error);
  counters_.reads += units.size();
  for (const Unit& unit : units) counters_.bytes_read += unit.bytes;
  for (const Unit& unit : units) {
    if (unit.chunk < 0) continue;
    const uint64_t hashed = table_.chunk_bytes(unit.chunk);
    const uint64_t got = XXH3_64bits(unit.buf->data(), hashed);
    const uint64_t want = table_.checksums[static_cast<size_t>(unit.chunk)];
    const int64_t r0 = unit.chunk * table_.chunk_rows, r1 = std::min(table_.rows, r0 + table_.chunk_rows);
    SLUICE_CHECK(got == want, Status::corrupt, where(), ": rows [", r0, ", ", r1, ") (chunk ", unit.chunk, ", offset ",
                 unit.offset, ") fail their checksum (manifest ", hex16(want), ", read ", hex16(got),
                 "): the file is corrupt (sluice verify checks every chunk)");
    ++counters_.chunks_verified;
  }
}

void PackNgramTable::gather(Backend& be, std::span<const int64_t> ids, const Tensor& out) {
  const int64_t dim = table_.cols;
  SLUICE_ASSERT(out.dtype == DType::f32 && out.numel() == static_cast<int64_t>(ids.size()) * dim);
  std::vector<float> staging(ids.size() * static_cast<size_t>(dim));
  std::lock_guard<std::mutex> lock(mu_);
  // Rows the cache holds; the others grouped by the read that fetches them.
  std::vector<Unit> units;
  std::map<uint64_t, size_t> unit_of_offset;
  std::vector<std::pair<size_t, size_t>> missing;  // (index in ids, unit)
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    SLUICE_CHECK(id >= 0 && id < table_.rows, Status::internal, "n-gram row ", id, " outside [0, ", table_.rows, ")");
    if (auto it = cache_.find(id); it != cache_.end()) {
      std::memcpy(staging.data() + i * dim, it->second.values.data(), static_cast<size_t>(dim) * sizeof(float));
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      ++counters_.hits;
      continue;
    }
    ++counters_.misses;
    Unit u;
    if (verify_) {  // the whole chunk: its pages, up to the file's 4096-aligned end
      u.chunk = id / table_.chunk_rows;
      u.offset = table_.row_offset(u.chunk * table_.chunk_rows);
      u.bytes = io_align_up(table_.chunk_bytes(u.chunk));
    } else {  // the pages holding the row
      const uint64_t at = table_.row_offset(id);
      u.offset = at / kIoAlign * kIoAlign;
      u.bytes = io_align_up(at + row_bytes_) - u.offset;
    }
    auto [it, fresh] = unit_of_offset.emplace(u.offset, units.size());
    if (fresh) units.push_back(std::move(u));
    missing.push_back({i, it->second});
  }
  if (!units.empty()) {
    read_units(units);
    for (const auto& [i, u] : missing) {
      const Unit& unit = units[u];
      const uint64_t at = table_.row_offset(ids[i]) - unit.offset;
      float* dst = staging.data() + i * dim;
      row_to_f32(unit.buf->data() + at, dst);
      insert(ids[i], dst);
    }
  }
  be.from_host(out, staging.data());
}

}  // namespace sluice
