// sluice verify's check of a pack (pack.h, verify_pack): every byte of dense.bin, every
// expert record and every n-gram table chunk against the manifest's checksums, and the zero
// padding between records and rows, in bounded memory.
#include "format/pack.h"


#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include "core/bits.h"
#include "core/error.h"
#include "core/paths.h"
#include "core/quant.h"
#include "format/file_io.h"
#include "format/json_file.h"


namespace sluice {

using json = nlohmann::json;
namespace fs = std::filesystem;

// ---- verify ----

namespace {

struct Fd {
  int fd;
  explicit Fd(const fs::path& p) : fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd < 0) fail(Status::io, p.string(), ": cannot open: ", errno_text(errno));
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  ~Fd() { ::close(fd); }
};

constexpr size_t kVerifyChunk = size_t{64} << 20;  // bytes per read

}  // namespace

PackVerifyResult verify_pack(const fs::path& dir, const std::function<void(const PackVerifyProgress&)>& progress,
                             size_t max_problems) {
  std::shared_ptr<Pack> pack = Pack::open(dir);
  const PackManifest& m = pack->manifest();
  PackVerifyResult r;
  PackVerifyProgress p;
  p.bytes_total = m.dense_file_bytes - kPackHeaderBytes;
  for (const auto& [kind, info] : m.kinds) p.bytes_total += static_cast<uint64_t>(m.n_records()) * info.record_stride;
  if (m.ple)
    for (const PackRowTable& t : m.ple->tables) p.bytes_total += static_cast<uint64_t>(t.rows) * t.row_stride;
  auto problem = [&](std::string what) {
    r.ok = false;
    if (r.problems.size() < max_problems) r.problems.push_back(std::move(what));
  };

  // The model settings and the tokenizer files: an edit after conversion changes what a run
  // computes as surely as a flipped weight.
  if (!m.settings_checksum) r.not_covered.push_back("the model settings");
  else if (const uint64_t got = pack_settings_checksum(m); got != *m.settings_checksum)
    problem(str((dir / kPackManifestName).string(), ": the model settings (family and config) do not match "
                "settings_checksum (manifest ", hex16(*m.settings_checksum), ", settings ", hex16(got),
                "): edited after conversion; convert the checkpoint again"));
  for (const std::string& name : m.tokenizer_files) {
    std::error_code ec;
    if (!fs::is_regular_file(dir / name, ec)) {
      problem(str((dir / name).string(), ": listed in the manifest but missing"));
      continue;
    }
    auto sum = m.tokenizer_checksums.find(name);
    if (sum == m.tokenizer_checksums.end()) {
      r.not_covered.push_back(name);
      continue;
    }
    const std::string bytes = read_file_bytes(dir / name, json_file_max, "a tokenizer file");
    if (const uint64_t got = XXH3_64bits(bytes.data(), bytes.size()); got != sum->second)
      problem(str((dir / name).string(), ": checksum mismatch (manifest ", hex16(sum->second), ", file ", hex16(got), ")"));
  }
  std::vector<uint8_t> buf;
  {  // dense.bin
    const fs::path path = dir / kPackDenseName;
    Fd fd(path);
    XXH3_state_t* st = XXH3_createState();
    SLUICE_CHECK(st, Status::out_of_memory, "verify: XXH3 state");
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> guard(st, XXH3_freeState);
    XXH3_64bits_reset(st);
    for (uint64_t off = kPackHeaderBytes; off < m.dense_file_bytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kVerifyChunk, m.dense_file_bytes - off));
      buf.resize(n);
      pread_all(fd.fd, buf.data(), n, off, path.string());
      XXH3_64bits_update(st, buf.data(), n);
      off += n;
      p.bytes_done += n;
      r.bytes_checked += n;
      if (progress) progress(p);
    }
    const uint64_t got = XXH3_64bits_digest(st);
    if (got != m.dense_checksum)
      problem(str(path.string(), ": checksum mismatch (manifest ", hex16(m.dense_checksum), ", file ", hex16(got), ")"));
  }
  // Expert files are read in chunks of at most kVerifyChunk bytes whatever the record size
  // (a record is hashed incrementally), so memory stays bounded even for huge records.
  XXH3_state_t* st = XXH3_createState();
  SLUICE_CHECK(st, Status::out_of_memory, "verify: XXH3 state");
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st_guard(st, XXH3_freeState);
  for (const auto& [kind, info] : m.kinds) {
    const fs::path path = dir / info.file;
    Fd fd(path);
    const uint64_t total = static_cast<uint64_t>(m.n_records()) * info.record_stride;
    int64_t rec = 0;
    uint64_t in_rec = 0;  // bytes of record `rec` seen so far
    bool padding_ok = true;
    XXH3_64bits_reset(st);
    for (uint64_t off = 0; off < total;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kVerifyChunk, total - off));
      buf.resize(n);
      pread_all(fd.fd, buf.data(), n, kPackHeaderBytes + off, path.string());
      for (size_t at = 0; at < n;) {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(n - at, info.record_stride - in_rec));
        const uint8_t* b = buf.data() + at;
        const size_t hashed = in_rec < info.record_bytes ? static_cast<size_t>(std::min<uint64_t>(take, info.record_bytes - in_rec)) : 0;
        if (hashed) XXH3_64bits_update(st, b, hashed);
        padding_ok = padding_ok && std::all_of(b + hashed, b + take, [](uint8_t c) { return c == 0; });
        in_rec += take;
        at += take;
        if (in_rec == info.record_stride) {
          const uint64_t got = XXH3_64bits_digest(st);
          if (got != info.checksums[static_cast<size_t>(rec)])
            problem(str(path.string(), ": record ", rec, " (", pack->describe_record(kind, rec), ") at offset ",
                        pack->record_offset(kind, rec), ": checksum mismatch (manifest ", hex16(info.checksums[rec]),
                        ", data ", hex16(got), ")"));
          else if (!padding_ok)
            problem(str(path.string(), ": record ", rec, " (", pack->describe_record(kind, rec),
                        "): the padding after the record is not zero"));
          ++r.records_checked;
          ++rec;
          in_rec = 0;
          padding_ok = true;
          XXH3_64bits_reset(st);
        }
      }
      off += n;
      p.bytes_done += n;
      r.bytes_checked += n;
      if (progress) progress(p);
    }
  }
  // The n-gram tables: each chunk's checksum and the zero padding of each row, read in
  // pieces of whole rows.
  if (m.ple) {
    const fs::path path = dir / m.ple->file;
    Fd fd(path);
    const uint64_t row_bytes_of = dtype_size(m.ple->dtype);
    for (size_t ti = 0; ti < m.ple->tables.size(); ++ti) {
      const PackRowTable& t = m.ple->tables[ti];
      const uint64_t row_bytes = static_cast<uint64_t>(t.cols) * row_bytes_of;
      const uint64_t piece_rows = std::max<uint64_t>(1, kVerifyChunk / t.row_stride);
      for (int64_t c = 0; c < t.n_chunks(); ++c) {
        const int64_t r0 = c * t.chunk_rows, r1 = std::min(t.rows, r0 + t.chunk_rows);
        XXH3_64bits_reset(st);
        bool padding_ok = true;
        for (int64_t at = r0; at < r1;) {
          const int64_t nr = std::min<int64_t>(static_cast<int64_t>(piece_rows), r1 - at);
          const size_t n = static_cast<size_t>(nr) * t.row_stride;
          buf.resize(n);
          pread_all(fd.fd, buf.data(), n, t.row_offset(at), path.string());
          XXH3_64bits_update(st, buf.data(), n);
          for (int64_t i = 0; i < nr; ++i) {
            const uint8_t* row = buf.data() + static_cast<size_t>(i) * t.row_stride;
            padding_ok = padding_ok && std::all_of(row + row_bytes, row + t.row_stride, [](uint8_t b) { return b == 0; });
          }
          at += nr;
          p.bytes_done += n;
          r.bytes_checked += n;
          if (progress) progress(p);
        }
        const uint64_t got = XXH3_64bits_digest(st);
        if (got != t.checksums[static_cast<size_t>(c)])
          problem(str(path.string(), ": n-gram table ", t.prefix, " rows [", r0, ", ", r1, ") (chunk ", c, ") at offset ",
                      t.row_offset(r0), ": checksum mismatch (manifest ", hex16(t.checksums[static_cast<size_t>(c)]),
                      ", data ", hex16(got), ")"));
        else if (!padding_ok)
          problem(str(path.string(), ": n-gram table ", t.prefix, " rows [", r0, ", ", r1, "): the padding after a row is not zero"));
        ++r.table_chunks_checked;
      }
    }
  }
  return r;
}

}  // namespace sluice
