// The journal of a convert, and resuming from it: what a convert keeps beside its partial
// pack (the hidden staging directory) so that the next convert of the same checkpoint with
// the same options, after an interrupt (Ctrl-C, a kill, a crash, a full disk), goes on from
// the records already written instead of starting over.
//
// convert.journal in the staging directory: lines `<JSON>\t<XXH3-64 of the JSON, 16 hex
// digits>\n`, appended as the work is done:
//   {"journal": 1, "fingerprint": {...}}   what the convert is (below); always first
//   {"stage": "dense", "manifest": {...}}  dense.bin written and fsynced: the manifest so far
//   {"stage": "ple", "manifest": {...}}    ple.<dtype>.bin likewise
//   {"records": [r0, n], "checksums": [[...], ...]}  records [r0, r0 + n) written; their
//                                          checksums, one list per kind in kind order
// A line that does not check (torn by a crash) ends the journal. The fingerprint holds the
// checkpoint (its directory; each file's name, size and modification time; config.json's
// hash), the options that shape the pack (kinds, dense dtype), the manifest skeleton (family,
// config, record layouts) and the writer's version: a resume needs every part equal.
//
// Resuming trusts nothing it does not check: dense.bin and the PLE file are hashed again
// against the checksums the journal holds (a file that fails is written again), every
// journaled record is read back and hashed, and the expert files are cut after the longest
// run of records from the first that check; the convert goes on from there. The records it
// then writes are the ones an uninterrupted convert writes, so the pack comes out the same,
// byte for byte.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "convert/convert_steps.h"

namespace sluice {

class ConvertJournal {
 public:
  static constexpr const char* kFileName = "convert.journal";

  // What a convert is, for matching a partial pack to the convert that may resume it.
  static nlohmann::json fingerprint(const Checkpoint& ck, const PackManifest& skeleton, const ConvertOptions& opt);
  // Whether `dir` holds a journal whose fingerprint is `fp`.
  static bool matches(const std::filesystem::path& dir, const nlohmann::json& fp);

  // A new journal in `dir` (replacing any), holding only the fingerprint.
  ConvertJournal(const std::filesystem::path& dir, nlohmann::json fp);
  ~ConvertJournal();
  ConvertJournal(const ConvertJournal&) = delete;
  ConvertJournal& operator=(const ConvertJournal&) = delete;

  // A stage ("dense", "ple") is written and fsynced; m: the manifest with its results.
  void stage_done(std::string_view stage, const PackManifest& m);
  // Records [r0, r0 + n) are written (the writer thread calls this); their checksums are in
  // the kinds' infos.
  void records_written(int64_t r0, int64_t n, const std::vector<PackKindInfo*>& kinds);
  // Records [0, records()) are journaled as written (for the interrupt message).
  int64_t records() const { return records_; }

 private:
  void append(const nlohmann::json& line);

  std::filesystem::path path_;
  int fd_ = -1;
  int64_t records_ = 0;
};

// What a partial pack that resume_partial_pack checked still holds.
struct ResumePoint {
  bool dense = false, ple = false;  // the file is complete and checks; m holds its manifest fields
  int64_t first_record = 0;         // records [0, first_record) check; m holds their checksums
};

// Reads the journal of a partial pack in `dir` whose fingerprint matched, checks what it
// claims against the files (reporting "verifying" progress) and fills `m` with what checks.
// Then starts the journal over with exactly that (the returned journal appends from there).
ResumePoint resume_partial_pack(const std::filesystem::path& dir, const ConvertPlan& plan, PackManifest& m,
                                ConvertReporter& report, std::unique_ptr<ConvertJournal>& journal,
                                const nlohmann::json& fp);

}  // namespace sluice
