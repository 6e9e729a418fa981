// The steps of convert_checkpoint (convert.cpp), one function each, and what they share:
// the plan made before anything is written, the progress reports with the cancel check, and
// the journal that lets an interrupted convert resume (convert_journal.h).
//
//   1. inspect_checkpoint   the family, the tensors it leaves out, the routed experts
//   2. PackStaging          where the pack goes (pack_writer.h), resuming a partial one
//   3. plan_manifest        the manifest skeleton: kinds, dense dtype, the dense tensors
//   4. write_dense_file     dense.bin                                   (convert_dense.cpp)
//   5. write_ple_tables     ple.<dtype>.bin, the n-gram tables          (convert_dense.cpp)
//   6. write_expert_records experts.<kind>.bin, a batch at a time       (convert_experts.cpp)
//   7. write_pack_metadata  the tokenizer files and manifest.json
//   8. check_pack_loads, 9. PackStaging::commit
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "convert/pack_writer.h"
#include "format/checkpoint.h"
#include "format/checkpoint_reader.h"

namespace sluice {

class ConvertJournal;

// What steps 1 and 3 decide, before anything is written.
struct ConvertPlan {
  nlohmann::json config;
  const Family* family = nullptr;
  std::set<std::string> matrices;   // tensors the family reads only as matrices (--dense int8|q4 may quantize them)
  std::set<std::string> exact;      // tensors the family needs unrounded (dense.bin holds them in f32)
  std::set<std::string> left_out;   // a multimodal checkpoint's towers: not in the pack
  std::map<std::string, std::vector<std::pair<int64_t, std::string>>> tables;  // PLE n-gram table -> (shard, tensor)
  std::vector<ExpertLayer> layers;  // the routed experts, ascending by layer
  std::set<std::string> expert_names;
  std::vector<DType> kinds;              // sorted; empty without routed experts
  std::vector<std::string> dense_names;  // what dense.bin holds, in checkpoint file order
  std::optional<DType> dense_quant;      // q8 or q4 with --dense int8|q4
  uint64_t bytes_total = 0;              // stored bytes of the checkpoint's tensors
  PackManifest skeleton;                 // family, config, dense dtype, experts and kinds' layouts
};

// Progress reports (ConvertOptions::progress, on the calling thread) and the cancel check.
class ConvertReporter {
 public:
  explicit ConvertReporter(const ConvertOptions& opt) : opt_(opt), start_(std::chrono::steady_clock::now()) {}
  void set_totals(int64_t records, uint64_t bytes) {
    progress_.records_total = records;
    progress_.bytes_total = bytes;
  }
  // Adds checkpoint bytes read (and records finished) and reports at `stage`.
  void advance(std::string_view stage, uint64_t bytes, int64_t records_done = -1);
  // Error(io) when the run was cancelled (the SIGINT flag is set).
  void check_cancel() const;
  bool cancelled() const { return opt_.cancel && opt_.cancel->load(); }
  double seconds() const;
  const ConvertOptions& options() const { return opt_; }

 private:
  const ConvertOptions& opt_;
  std::chrono::steady_clock::time_point start_;
  ConvertProgress progress_;
};

// 1 + 3: the checkpoint against its family (a dry run of its loader that reads no weight),
// what goes where, and the manifest skeleton. Throws before anything is written.
ConvertPlan plan_convert(const std::filesystem::path& hf_dir, const Checkpoint& ck, const ConvertOptions& opt);

// 4: dense.bin in `dir`: the plan's dense tensors, converted (FP8 dequantized) in pieces of
// about 4M values, or quantized row by row with --dense int8|q4. Fills m.dense and the file's
// size and checksum.
void write_dense_file(const ConvertPlan& plan, CheckpointReader& reader, PackManifest& m,
                      const std::filesystem::path& dir, ConvertReporter& report);

// 5: ple.<dtype>.bin with the plan's n-gram tables (none: nothing written); sets m.ple.
void write_ple_tables(const ConvertPlan& plan, CheckpointReader& reader, PackManifest& m,
                      const std::filesystem::path& dir, ConvertReporter& report);

// 6: the expert files, records [first_record, n_records) (the ones before are already
// written and verified: a resumed convert), a batch at a time; the record checksums go
// into m.kinds and, a batch at a time once written, to `journal` when given.
void write_expert_records(const ConvertPlan& plan, CheckpointReader& reader, PackManifest& m,
                          const std::filesystem::path& dir, ConvertReporter& report, int64_t first_record,
                          ConvertJournal* journal);

}  // namespace sluice
