// The pieces of writing a pack that `sluice convert` (convert.cpp: from an HF checkpoint) and
// `sluice synth` (synth.cpp: random weights of a model's real shapes) share, so that the two
// lay packs out identically: routed experts found by tensor name, the staging directory that
// is renamed into place only when complete, dense.bin with its checksum, expert files written
// a batch of records at a time by a writer thread with large O_DIRECT writes, and the final
// check that the pack loads as its family. The format itself (layouts, manifest, headers)
// stays in format/pack.{h,cpp}.
#pragma once

#include <xxhash.h>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/aligned_buffer.h"
#include "format/pack.h"
#include "models/registry.h"

namespace sluice {

// ---- finding the routed experts by name ----

// A tensor as a writer sees it: name, dtype and shape (a checkpoint's entry, or one that a
// family loader asked for).
struct TensorDecl {
  std::string name;
  DType dtype = DType::bf16;
  std::vector<int64_t> shape;
};

enum class ExpertProj { gate, up, down };

struct ExpertTensor {
  std::string name;
  int64_t expert = -1;  // -1: fused over all experts
  ExpertProj proj = ExpertProj::gate;
};

// How a layer's experts are stored in a checkpoint.
enum class ExpertLayout {
  per_expert,     // <prefix><e>.gate_proj.weight [n_ff, n_embd] ... (or w1 / w3 / w2)
  fused,          // <prefix>gate_up_proj [E, 2 n_ff, n_embd] (gate rows, then up rows), down_proj [E, n_embd, n_ff]
  fused_inputs_first,  // gate_up_proj [E, n_embd, 2 n_ff] (gate columns, then up columns), down_proj
                       // [E, n_ff, n_embd] (Llama 4)
  gpt_oss,        // <prefix>gate_up_proj [E, n_embd, 2 n_ff] (gate and up columns interleaved: gate f is
                  // column 2f), down_proj [E, n_ff, n_embd] (inputs first), gate_up_proj_bias [E, 2 n_ff]
                  // (interleaved), down_proj_bias [E, n_embd]
  gpt_oss_mxfp4,  // the same as MXFP4 (core/quant.h's mxfp4 rows): gate_up_proj_blocks [E, 2 n_ff,
                  // n_embd / 32, 16] + _scales [E, 2 n_ff, n_embd / 32] (row 2f gate f, 2f + 1 up f),
                  // down_proj_blocks [E, n_embd, n_ff / 32, 16] + _scales; the biases as gpt_oss
};

// One MoE layer's experts as the tensors store them.
struct ExpertLayer {
  std::string prefix;  // "model.layers.3.mlp.experts."
  int64_t layer = -1;  // model layer number
  ExpertLayout layout = ExpertLayout::per_expert;
  bool biases = false;  // gate, up and down biases (the gpt-oss layouts)
  std::string source;   // "gate_proj,up_proj,down_proj", "w1,w3,w2", "fused", "fused_inputs_first", "gpt_oss"
                        // or "gpt_oss_mxfp4"
  std::vector<ExpertTensor> tensors;
  int64_t n_expert = 0, n_embd = 0, n_ff = 0;
  // Per expert, the tensor of each projection (per-expert layout).
  std::vector<std::array<std::string, 3>> names;
};

// The routed-expert layers among `tensors` (<prefix><e>.gate_proj.weight, ...w1.weight, the
// fused <prefix>gate_up_proj / down_proj, or gpt-oss's layouts: ExpertLayout), ascending by
// model layer, validated (complete, float or MXFP4 as the layout says, one expert size);
// their tensor names are added to `expert_names`. `where` (the
// checkpoint directory) starts every error message.
// With allow_none, a model without routed experts gives an empty list (a pack of dense
// weights only, format version 2); without, that is an error.
// `fused`: how the family stores fused expert tensors (Family::fused_experts).
std::vector<ExpertLayer> find_expert_layers(const std::vector<TensorDecl>& tensors, const std::string& where,
                                            std::set<std::string>& expert_names, FusedExperts fused,
                                            bool allow_none = false);

// The pack manifest's expert fields (n_expert, sizes, moe_layers, prefixes, sources) from the
// layers, and an empty record layout (checksums zeroed) for each kind. No layers: no experts
// and no kinds.
void pack_manifest_set_experts(PackManifest& m, const std::vector<ExpertLayer>& layers,
                               const std::vector<DType>& kinds);

// ---- files ----

// A data file being written: large sequential writes, O_DIRECT when asked for and the file
// system takes it (every write must then be 4096-aligned in address, size and offset),
// periodic write-back of buffered writes so the final fsync does not wait for gigabytes.
class OutFile {
 public:
  // A new file (an existing one is an error).
  OutFile(const std::filesystem::path& path, bool direct);
  // An existing file cut to its first `keep` bytes, written on from there (a resumed convert;
  // `keep` a multiple of 4096 for O_DIRECT). Error(io) when it is shorter than that.
  OutFile(const std::filesystem::path& path, bool direct, uint64_t keep);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const uint8_t* p, size_t n);
  void finish();  // fsync and close; errors name the file
  uint64_t size() const { return size_; }
  bool direct() const { return direct_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool direct_ = false;
  uint64_t size_ = 0, synced_ = 0;
};

// Writes a small file (manifest, tokenizer) with its contents fsynced.
void write_small_file(const std::filesystem::path& path, const void* data, size_t n);
void fsync_dir(const std::filesystem::path& dir);

// dense.bin: the header page, then tensors each at a 64-byte aligned offset (zero gaps),
// hashed as written; finish() records size and checksum in the manifest and writes the real
// header (the payload size is known only then; the header page is outside the checksum).
// With `direct`, writes go through O_DIRECT while they are 4096-aligned in address and size
// (a writer that emits whole aligned chunks from aligned memory); the first one that is not
// switches the file to buffered writes for good (OutFile), which suits an unaligned tail.
class DenseFileWriter {
 public:
  explicit DenseFileWriter(const std::filesystem::path& path, bool direct = false);
  ~DenseFileWriter();
  DenseFileWriter(const DenseFileWriter&) = delete;
  DenseFileWriter& operator=(const DenseFileWriter&) = delete;

  uint64_t begin_tensor();  // pads to kPackBlockAlign; the offset of the next tensor
  void write(const uint8_t* p, size_t n);
  uint64_t size() const { return out_.size(); }
  void finish(PackManifest& m);  // sets dense_file_bytes and dense_checksum

 private:
  std::filesystem::path path_;
  OutFile out_;
  XXH3_state_t* state_ = nullptr;
};

// An experts.<kind>.bin with its header page written (O_DIRECT where possible). With
// first_record > 0, the existing file of a resumed convert, cut after that many records
// (header page and records written and verified before) and written on from there; with 0,
// a new file (an old one of that name is removed first).
std::unique_ptr<OutFile> open_expert_file(const std::filesystem::path& dir, const PackKindInfo& info,
                                          int64_t n_records, int64_t first_record = 0);

// Zeroes a record's bytes outside its blocks: the gaps between blocks and the padding up to
// the stride (buffers are reused, and verify checks the padding).
void pack_record_zero_gaps(const PackKindInfo& info, uint8_t* record);

// ---- records, a batch at a time ----

// A batch of records in flight: one output buffer per kind.
struct RecordBatch {
  int64_t r0 = 0, count = 0;
  std::vector<std::unique_ptr<AlignedBuffer>> out;  // per kind: count * stride bytes (4096-aligned)
};

// The writer thread: writes batches in order, one file per kind. With `checksum`, it also
// computes each record's checksum into the kind's info; without, the producer has filled them.
// `written`, when given, is called on the writer thread after each batch is written (the
// journal of a resumable convert); its exceptions count as write errors.
class RecordBatchWriter {
 public:
  RecordBatchWriter(std::vector<OutFile*> files, std::vector<PackKindInfo*> kinds, bool checksum = true,
                    std::function<void(const RecordBatch&)> written = {});
  ~RecordBatchWriter();
  // Hands a batch over; waits while one is still queued (so at most two exist besides the
  // one being computed). Rethrows a write error.
  void push(RecordBatch* b);
  // Waits until every batch handed over is written; rethrows a write error.
  void drain();
  // Waits until `b` may be refilled; rethrows a write error.
  void wait_free(const RecordBatch* b);

 private:
  void run();

  std::vector<OutFile*> files_;
  std::vector<PackKindInfo*> kinds_;
  bool checksum_;
  std::function<void(const RecordBatch&)> written_;
  std::mutex m_;
  std::condition_variable cv_;
  RecordBatch* queued_ = nullptr;
  const RecordBatch* writing_ = nullptr;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

// ---- where the pack goes ----

// The output of a writer: checks OUT (absent, an empty directory, or a pack that `force`
// may replace; anything else is refused), creates the hidden staging directory
// ".OUT.partial-PID" beside it, and commit() renames the staging directory into place (with
// `force`, atomically exchanging it with the old pack, which is then removed). Destroyed
// without commit, it removes the staging directory (unless keep() was called): a failed or
// interrupted writer never leaves something at OUT that looks like a pack. A staging
// directory for OUT whose PID no longer runs (a writer killed outright, or one that kept its
// partial pack to be resumed) is offered to `adopt`: the first one it accepts becomes this
// writer's staging directory (resumed() is then true), the others are removed. PIDs are this
// host's; OUT on a filesystem shared with another host writing it is not supported. `tool`
// ("convert", "synth") starts messages.
class PackStaging {
 public:
  PackStaging(const std::filesystem::path& out, bool force, std::string tool,
              const std::function<bool(const std::filesystem::path&)>& adopt = {});
  ~PackStaging();
  PackStaging(const PackStaging&) = delete;
  PackStaging& operator=(const PackStaging&) = delete;

  const std::filesystem::path& dir() const { return tmp_; }       // write here
  const std::filesystem::path& out_dir() const { return out_; }   // absolute
  bool resumed() const { return resumed_; }  // dir() holds an adopted partial pack
  void keep() { armed_ = false; }             // leave dir() in place (to be resumed)
  void commit();

 private:
  std::string tool_;
  std::filesystem::path out_, parent_, tmp_;
  bool replace_ = false, armed_ = true, resumed_ = false;
};

// The staged pack must load as its family at every kind (cheap: weights are mapped, not read).
void check_pack_loads(const std::filesystem::path& dir, const std::vector<DType>& kinds, std::string_view tool);

}  // namespace sluice
