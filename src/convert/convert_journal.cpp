// The convert journal (appended line by line, each line checksummed) and resuming a partial
// pack from it: every claim checked against the files before it is trusted.
#include "convert/convert_journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <set>

#include "core/aligned_buffer.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "format/file_io.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

// Bumped whenever the converter's output for the same input and options changes, so that a
// newer sluice never resumes a partial pack an older one began.
constexpr int kConvertWriterVersion = 1;
constexpr uint64_t kJournalMax = uint64_t{1} << 30;  // bytes read back (millions of records fit)
constexpr uint64_t kVerifyPiece = uint64_t{8} << 20;  // bytes hashed per read while verifying

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The lines of a journal that check, in order; `good_bytes` receives where the last one ends.
std::vector<nlohmann::json> read_journal(const fs::path& path, uint64_t* good_bytes = nullptr) {
  std::vector<nlohmann::json> out;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return out;
  const std::string text = read_file_bytes(path, kJournalMax, "a convert journal");
  size_t at = 0;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    if (nl == std::string::npos) break;  // torn: the last line was being written
    const std::string_view line(text.data() + at, nl - at);
    const size_t tab = line.rfind('\t');
    if (tab == std::string_view::npos || line.size() - tab - 1 != 16) break;
    const std::string_view body = line.substr(0, tab);
    if (hex64(XXH3_64bits(body.data(), body.size())) != line.substr(tab + 1)) break;
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) break;
    out.push_back(std::move(j));
    at = nl + 1;
  }
  if (good_bytes) *good_bytes = at;
  return out;
}

// Hashes `bytes` bytes of `path` from `offset` on with XXH3-64; nullopt when the file is shorter.
std::optional<uint64_t> hash_file_range(const fs::path& path, uint64_t offset, uint64_t bytes, ConvertReporter& report) {
  std::error_code ec;
  if (fs::file_size(path, ec) < offset + bytes || ec) return std::nullopt;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<uint8_t> buf;
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min(kVerifyPiece, bytes - done);
    buf.resize(n);
    pread_all(fd, buf.data(), n, offset + done, path.string());
    XXH3_64bits_update(st, buf.data(), n);
    done += n;
    report.advance("verifying", 0);
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  ::close(fd);
  return h;
}

// dense.bin of a journaled manifest: its size and checksum (the header page is outside it).
bool dense_file_checks(const fs::path& dir, const PackManifest& j, ConvertReporter& report) {
  std::error_code ec;
  if (fs::file_size(dir / kPackDenseName, ec) != j.dense_file_bytes || ec) return false;
  return hash_file_range(dir / kPackDenseName, kPackHeaderBytes, j.dense_file_bytes - kPackHeaderBytes, report) ==
         j.dense_checksum;
}

// ple.<dtype>.bin of a journaled manifest: its size and every table chunk's checksum.
bool ple_file_checks(const fs::path& dir, const PackPleInfo& ple, ConvertReporter& report) {
  std::error_code ec;
  if (fs::file_size(dir / ple.file, ec) != ple.file_bytes || ec) return false;
  for (const PackRowTable& t : ple.tables)
    for (int64_t c = 0; c < t.n_chunks(); ++c)
      if (hash_file_range(dir / ple.file, t.row_offset(c * t.chunk_rows), t.chunk_bytes(c), report) !=
          t.checksums[static_cast<size_t>(c)])
        return false;
  return true;
}

// The first record of [0, claimed) whose bytes in any kind's file do not hash to the
// journaled checksum (claimed when all do): the files read in pieces on the thread pool,
// with "verifying" progress between pieces.
int64_t verified_records(const fs::path& dir, const PackManifest& m, const std::vector<DType>& kinds,
                         const std::vector<std::vector<uint64_t>>& sums, int64_t claimed, ConvertReporter& report) {
  int64_t good = claimed;
  for (size_t k = 0; k < kinds.size() && good > 0; ++k) {
    const PackKindInfo& info = m.kinds.at(kinds[k]);
    const fs::path path = dir / info.file;
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec || size < kPackHeaderBytes) return 0;
    {  // the header page (written first)
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return 0;
      std::vector<uint8_t> h(kPackHeaderBytes);
      pread_all(fd, h.data(), h.size(), 0, path.string());
      ::close(fd);
      if (h != pack_file_header(expert_kind_name(info.kind), static_cast<uint64_t>(m.n_records()) * info.record_stride))
        return 0;
    }
    good = std::min<int64_t>(good, static_cast<int64_t>((size - kPackHeaderBytes) / info.record_stride));
    const int64_t per_piece = std::max<int64_t>(1, static_cast<int64_t>(kVerifyPiece / info.record_stride));
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    // Rounds of pieces, one piece a task; the rounds stop at the first bad record.
    const int64_t pieces_per_round = std::max<int64_t>(1, ThreadPool::global().size() * 4);
    for (int64_t r0 = 0; r0 < good;) {
      const int64_t round_end = std::min(good, r0 + per_piece * pieces_per_round);
      std::atomic<int64_t> first_bad{round_end};
      const int64_t n_pieces = (round_end - r0 + per_piece - 1) / per_piece;
      ThreadPool::global().parallel_for(n_pieces, 1, [&](int64_t p0, int64_t p1) {
        std::vector<uint8_t> buf;
        for (int64_t p = p0; p < p1; ++p) {
          const int64_t a = r0 + p * per_piece, b = std::min(round_end, a + per_piece);
          buf.resize(static_cast<size_t>(b - a) * info.record_stride);
          pread_all(fd, buf.data(), buf.size(), kPackHeaderBytes + static_cast<uint64_t>(a) * info.record_stride,
                    path.string());
          for (int64_t r = a; r < b; ++r) {
            if (XXH3_64bits(buf.data() + (r - a) * info.record_stride, info.record_bytes) == sums[k][static_cast<size_t>(r)])
              continue;
            int64_t cur = first_bad.load();
            while (r < cur && !first_bad.compare_exchange_weak(cur, r)) {}
            break;
          }
        }
      });
      report.advance("verifying", 0, round_end);
      if (first_bad.load() < round_end) {
        good = first_bad.load();
        break;
      }
      r0 = round_end;
    }
    ::close(fd);
  }
  return good;
}

}  // namespace

nlohmann::json ConvertJournal::fingerprint(const Checkpoint& ck, const PackManifest& skeleton, const ConvertOptions& opt) {
  nlohmann::json fp;
  fp["writer"] = {{"converter", kConvertWriterVersion}, {"pack_format", kPackFormatVersion}};
  fp["source"] = fs::absolute(ck.dir()).lexically_normal().string();
  std::set<fs::path> files;
  for (const std::string& name : ck.names()) {
    files.insert(ck.file_of(name).path());
    if (const Fp8Weight* w = ck.fp8(name)) files.insert(ck.file_of(w->scale).path());
  }
  nlohmann::json list = nlohmann::json::array();
  for (const fs::path& p : files) {
    struct stat st {};
    SLUICE_CHECK(::stat(p.c_str(), &st) == 0, Status::io, p.string(), ": cannot stat: ", errno_text(errno));
    list.push_back({{"file", p.filename().string()},
                    {"bytes", static_cast<uint64_t>(st.st_size)},
                    {"mtime_ns", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec}});
  }
  fp["files"] = std::move(list);
  nlohmann::json kinds = nlohmann::json::array();
  for (DType k : opt.kinds) kinds.push_back(std::string(expert_kind_name(k)));
  fp["options"] = {{"kinds", kinds},
                   {"dense", opt.dense_dtype ? std::string(dense_dtype_name(*opt.dense_dtype)) : std::string("default")}};
  const std::string s = pack_manifest_to_json(skeleton);  // family, config, kinds' layouts, dense dtype
  fp["skeleton"] = hex64(XXH3_64bits(s.data(), s.size()));
  return fp;
}

bool ConvertJournal::matches(const fs::path& dir, const nlohmann::json& fp) {
  try {
    const std::vector<nlohmann::json> lines = read_journal(dir / kFileName);
    return !lines.empty() && lines[0].value("journal", 0) == 1 && lines[0].contains("fingerprint") &&
           lines[0]["fingerprint"] == fp;
  } catch (const Error&) {
    return false;  // unreadable: not resumable
  }
}

ConvertJournal::ConvertJournal(const fs::path& dir, nlohmann::json fp) : path_(dir / kFileName) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(Status::io, path_.string(), ": cannot create: ", errno_text(errno));
  append({{"journal", 1}, {"fingerprint", std::move(fp)}});
}

ConvertJournal::~ConvertJournal() {
  if (fd_ >= 0) ::close(fd_);
}

void ConvertJournal::append(const nlohmann::json& line) {
  const std::string body = line.dump();
  const std::string text = body + "\t" + hex64(XXH3_64bits(body.data(), body.size())) + "\n";
  // One write of the whole line (O_APPEND): a kill leaves it whole or absent; a crash may
  // tear it, and a torn line ends the journal where it starts.
  const ssize_t w = ::write(fd_, text.data(), text.size());
  if (w != static_cast<ssize_t>(text.size()))
    fail(Status::io, path_.string(), ": append failed: ", w < 0 ? errno_text(errno) : std::string("short write"));
}

void ConvertJournal::stage_done(std::string_view stage, const PackManifest& m) {
  append({{"stage", stage}, {"manifest", nlohmann::json::parse(pack_manifest_to_json(m))}});
}

void ConvertJournal::records_written(int64_t r0, int64_t n, const std::vector<PackKindInfo*>& kinds) {
  nlohmann::json sums = nlohmann::json::array();
  for (const PackKindInfo* info : kinds)
    sums.push_back(std::vector<uint64_t>(info->checksums.begin() + r0, info->checksums.begin() + r0 + n));
  append({{"records", {r0, n}}, {"checksums", std::move(sums)}});
  records_ = std::max(records_, r0 + n);
}

ResumePoint resume_partial_pack(const fs::path& dir, const ConvertPlan& plan, PackManifest& m, ConvertReporter& report,
                                std::unique_ptr<ConvertJournal>& journal, const nlohmann::json& fp) {
  const std::vector<nlohmann::json> lines = read_journal(dir / ConvertJournal::kFileName);
  std::optional<PackManifest> dense, ple;
  const int64_t n_records = m.n_records();
  std::vector<std::vector<uint64_t>> sums(plan.kinds.size(), std::vector<uint64_t>(static_cast<size_t>(n_records)));
  std::vector<bool> have(static_cast<size_t>(n_records), false);
  for (size_t i = 1; i < lines.size(); ++i) {  // a line that does not make sense ends what is trusted
    const nlohmann::json& l = lines[i];
    try {
      if (l.contains("stage")) {
        PackManifest j = parse_pack_manifest(l.at("manifest").dump(), (dir / ConvertJournal::kFileName).string());
        (l.at("stage") == "dense" ? dense : ple) = std::move(j);
        continue;
      }
      const int64_t r0 = l.at("records").at(0), n = l.at("records").at(1);
      const nlohmann::json& s = l.at("checksums");
      if (r0 < 0 || n <= 0 || r0 + n > n_records || s.size() != plan.kinds.size()) break;
      for (size_t k = 0; k < plan.kinds.size(); ++k) {
        if (s[k].size() != static_cast<size_t>(n)) throw std::out_of_range("checksums");
        for (int64_t r = 0; r < n; ++r) sums[k][static_cast<size_t>(r0 + r)] = s[k][static_cast<size_t>(r)];
      }
      for (int64_t r = 0; r < n; ++r) have[static_cast<size_t>(r0 + r)] = true;
    } catch (const std::exception&) {
      break;
    }
  }
  ResumePoint at;
  if (dense && dense_file_checks(dir, *dense, report)) {
    at.dense = true;
    m.dense = dense->dense;
    m.dense_file_bytes = dense->dense_file_bytes;
    m.dense_checksum = dense->dense_checksum;
  }
  if (ple && ple->ple && ple_file_checks(dir, *ple->ple, report)) {
    at.ple = true;
    m.ple = ple->ple;
  }
  const int64_t claimed = std::find(have.begin(), have.end(), false) - have.begin();
  at.first_record = claimed ? verified_records(dir, m, plan.kinds, sums, claimed, report) : 0;
  for (size_t k = 0; k < plan.kinds.size(); ++k)
    std::copy_n(sums[k].begin(), at.first_record, m.kinds.at(plan.kinds[k]).checksums.begin());
  LOG_INFO("convert: resuming ", dir.string(), ": dense.bin ", at.dense ? "checks" : dense ? "does not check" : "was not done",
           plan.tables.empty() ? std::string() : str(", the n-gram tables ", at.ple ? "check" : "are written again"),
           ", ", at.first_record, " of ", n_records, " records check",
           claimed > at.first_record ? str(" (", claimed, " were journaled)") : std::string());

  // The journal starts over with exactly what checks.
  journal = std::make_unique<ConvertJournal>(dir, fp);
  if (at.dense) journal->stage_done("dense", m);
  if (at.ple) journal->stage_done("ple", m);
  if (at.first_record > 0) {
    std::vector<PackKindInfo*> infos;
    for (DType k : plan.kinds) infos.push_back(&m.kinds.at(k));
    journal->records_written(0, at.first_record, infos);
  }
  return at;
}

}  // namespace sluice
