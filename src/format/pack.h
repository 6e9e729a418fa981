// The pack: sluice's own on-disk model format, laid out for streaming experts.
//
//   DIR/manifest.json        format version, family, config, tokenizer files, dense tensors,
//                            and per expert kind: file, record stride, block offsets, checksums
//   DIR/dense.bin            every non-expert tensor (bf16 or f32; in version 3 the matrices
//                            may be int8 or q4 with their scales), each 64-byte aligned
//   DIR/experts.<kind>.bin   one record per (MoE layer, expert): gate, up and down blocks and
//                            their scales; records 4096-aligned at a fixed stride, so one
//                            direct read fetches one expert
//   DIR/ple.<dtype>.bin      (version 2) the PLE n-gram tables of qwen4_exp: rows at a fixed
//                            stride, read row by row on demand, one checksum per chunk of rows
//   DIR/tokenizer.json, tokenizer_config.json   copied from the checkpoint
//
// Version 2 adds the n-gram tables and packs without routed experts (a dense model such as
// qwen3_5); a pack that uses neither is written as version 1, so older readers keep reading
// the decoder families' packs. Version 3 adds quantized dense matrices (`convert --dense
// int8|q4`); a writer puts 3 only in a pack that holds one. Version 4 adds expert biases
// (gpt-oss: f32 vectors in each record after its blocks); a writer puts 4 only in a pack
// whose experts have them. This reader takes all four.
//
// dense.bin and each experts.<kind>.bin open with a 4096-byte header page (magic
// "SLUICEPK", format version, the file's role and kind, payload bytes); dense tensor offsets
// are file offsets, and record r of a kind sits at 4096 + r * record_stride.
//
// Record id = moe_layer_index * n_expert + expert, where moe_layer_index counts only the
// layers that have routed experts (manifest "experts.layers" lists their model layer indices).
// Bit layouts of the kinds: core/quant.h and docs/pack-format.md.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/expert_weights.h"

namespace sluice {

constexpr int kPackFormatVersion = 4;     // the newest version this sluice reads and writes
constexpr int kPackMinFormatVersion = 1;  // the oldest it reads
constexpr int kPackDataVersion = 1;       // the version field of every data file's header page
constexpr uint64_t kPackRecordAlign = 4096;  // O_DIRECT alignment of records and strides
constexpr uint64_t kPackHeaderBytes = 4096;  // the header page of dense.bin and experts.<kind>.bin
constexpr uint64_t kPackBlockAlign = 64;     // dense tensors and the blocks inside a record
constexpr const char* kPackFormatName = "sluice-pack";  // manifest.json "format"
constexpr const char* kPackFileMagic = "SLUICEPK";      // first 8 bytes of every data file
constexpr const char* kPackManifestName = "manifest.json";
constexpr const char* kPackDenseName = "dense.bin";
constexpr const char* kPackPleRole = "ple";  // the header role of ple.<dtype>.bin

// Bounds a manifest must respect: far beyond any real model (Qwen3-235B has 94 MoE layers of
// 128 experts, n_embd 4096, n_ff 1536), small enough that nothing derived from them can
// overflow 64 bits or ask for an absurd allocation.
constexpr uint64_t kPackManifestMaxBytes = uint64_t{256} << 20;
constexpr int64_t kPackMaxExperts = 1 << 16;
constexpr int64_t kPackMaxLayers = 1 << 16;
constexpr int64_t kPackMaxDim = 1 << 22;                    // n_embd, n_ff, a dense dimension
constexpr uint64_t kPackMaxRecordBytes = uint64_t{1} << 36;  // 64 GiB
constexpr uint64_t kPackMaxFileBytes = uint64_t{1} << 50;    // 1 PiB
constexpr int kPackMaxJsonDepth = 64;
constexpr int64_t kPackMaxTableRows = int64_t{1} << 40;     // rows of one n-gram table
constexpr int64_t kPackMaxTableChunks = int64_t{1} << 20;   // checksums of one n-gram table

// The expert kinds: the weight dtypes a pack's expert records can hold (the kinds are
// dtypes, no other type names them). bf16 is the checkpoint's precision (f16/f32 experts are
// converted to bf16); q8, q4, q2 and mxfp4 are quantized (core/quant.h). The pack format and the
// command line name q8 "int8".
constexpr DType kExpertKinds[] = {DType::bf16, DType::q8, DType::q4, DType::q2, DType::mxfp4};
constexpr int kExpertKindCount = 5;
bool is_expert_kind(DType t);
// The kind's place in kExpertKinds (0..4; residency keys use it); internal error otherwise.
int expert_kind_index(DType k);
std::string_view expert_kind_name(DType k);                     // "bf16", "int8", "q4", "q2", "mxfp4"
std::optional<DType> expert_kind_from_name(std::string_view s);
// "bf16,q4" -> {bf16, q4}; an unknown or repeated name is Error(invalid_argument).
std::vector<DType> parse_expert_kinds(std::string_view list);
// The kind a run uses when none is asked for: the first of q4, mxfp4, int8, bf16, q2 the pack
// holds (q4 is the serving precision the format is built around; mxfp4 is gpt-oss's own; q2
// is the low-bit miss copy).
DType default_expert_kind(const std::vector<DType>& available);

// One projection matrix inside a record.
struct PackBlock {
  int64_t rows = 0, cols = 0;     // [out_features, in_features]
  uint64_t offset = 0, bytes = 0;              // packed values, from the record start
  uint64_t scale_offset = 0, scale_bytes = 0;  // scales (quantized kinds; 0 bytes for bf16)
};

// One expert bias inside a record (version 4): n f32 values.
struct PackBias {
  int64_t n = 0;                   // values: n_ff (gate, up) or n_embd (down)
  uint64_t offset = 0, bytes = 0;  // from the record start; bytes = 4 n, 0 when the experts have none
};

struct PackKindInfo {
  DType kind = DType::bf16;
  std::string file;               // "experts.q4.bin", relative to the pack directory
  uint64_t record_bytes = 0;      // bytes actually used by a record
  uint64_t record_stride = 0;     // multiple of kPackRecordAlign, >= record_bytes
  PackBlock gate, up, down;       // gate/up [n_ff, n_embd], down [n_embd, n_ff]
  PackBias gate_bias, up_bias, down_bias;  // version 4 (gpt-oss); all three or none
  std::vector<uint64_t> checksums;  // XXH3-64 of each record's record_bytes, by record id

  bool has_biases() const { return gate_bias.bytes != 0; }
};

// The record layout of a kind for experts of this size: blocks in the order gate, gate
// scales, up, up scales, down, down scales, then (with biases) the gate, up and down biases
// as f32, each 64-byte aligned; record_bytes is where the last one ends and record_stride
// that rounded up to 4096. Checksums are left empty.
PackKindInfo pack_kind_layout(DType kind, int64_t n_embd, int64_t n_ff, bool biases = false);

// The byte ranges a record of this kind uses (values, scales, biases; empty ones included),
// named, in layout order.
struct PackRange {
  uint64_t offset = 0, bytes = 0;
  const char* name = "";
};
std::vector<PackRange> pack_kind_ranges(const PackKindInfo& info);
// Packed-value and scale bytes of a [rows, cols] block of an expert kind.
std::pair<uint64_t, uint64_t> pack_block_bytes(DType kind, int64_t rows, int64_t cols);

// A dense tensor in dense.bin. A quantized one (q8 or q4, version 3: a matrix [rows, cols]
// that the family reads only as a matmul weight or an embedding table) holds its packed
// values at offset (bytes = rows x quant_row_bytes) and its scales at scale_offset
// (scale_bytes = rows x quant_scale_row_bytes), laid out as core/quant.h defines.
struct PackDenseTensor {
  std::string name;               // the checkpoint's tensor name
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t offset = 0, bytes = 0;  // in dense.bin
  uint64_t scale_offset = 0, scale_bytes = 0;  // in dense.bin; quantized tensors only
};

// The dense quantized dtypes (`convert --dense int8|q4`): q8 and q4. q2 is for expert
// records only (the low-bit miss copy).
inline bool is_dense_quant_dtype(DType t) { return t == DType::q8 || t == DType::q4; }
// `--dense` names: "f32", "bf16", "int8" (q8), "q4"; nullopt for anything else.
std::optional<DType> dense_dtype_from_name(std::string_view s);
std::string_view dense_dtype_name(DType t);  // "int8" for q8, else dtype_name
// Whether a dense tensor of this shape may be stored quantized: a matrix whose rows are
// whole q4 groups (32 values), for both kinds, so that every backend's vectorized path
// applies (the CUDA matvec reads 32 q4 / 16 int8 values at a time).
inline bool dense_quantizable_shape(const std::vector<int64_t>& shape) {
  return shape.size() == 2 && shape[0] > 0 && shape[1] > 0 && shape[1] % 32 == 0;
}

// One PLE n-gram table (qwen4_exp) in ple.<dtype>.bin: the checkpoint's shards concatenated
// by row, row r at offset + r * row_stride (the row's cols values, then zero padding). A
// row_stride of at most 4096 is a power of two, so no row straddles a page and one aligned
// 4096-byte read fetches it; a larger one is a multiple of 4096. Chunk c (rows
// [c * chunk_rows, ...), the last one shorter) has one XXH3-64 checksum over its rows'
// strides; a chunk starts page-aligned.
struct PackRowTable {
  std::string prefix;                // "model.language_model.layers.0.ple.ple_embedding.ngram_embedding."
  std::vector<std::string> sources;  // the checkpoint tensors, in row order
  int64_t rows = 0, cols = 0;
  uint64_t offset = 0;               // file offset of row 0, a multiple of 4096
  uint64_t row_stride = 0;           // bytes
  int64_t chunk_rows = 0;            // rows per checksum
  std::vector<uint64_t> checksums;   // per chunk

  int64_t n_chunks() const { return chunk_rows ? (rows + chunk_rows - 1) / chunk_rows : 0; }
  uint64_t row_offset(int64_t r) const { return offset + static_cast<uint64_t>(r) * row_stride; }
  uint64_t chunk_bytes(int64_t c) const {  // the hashed bytes of chunk c
    return static_cast<uint64_t>(std::min(chunk_rows, rows - c * chunk_rows)) * row_stride;
  }
};

struct PackPleInfo {
  std::string file;                  // "ple.bf16.bin"
  DType dtype = DType::bf16;         // of the values (f32, bf16 or f16)
  uint64_t file_bytes = 0;           // a multiple of 4096
  std::vector<PackRowTable> tables;  // ascending offsets
};

// The layout of an n-gram table of [rows, cols] values of `dtype` starting at `offset`:
// row_stride as above, chunk_rows so that a chunk is one page when the table is small and
// there are at most kPleTargetChunks chunks otherwise. Checksums are left empty.
PackRowTable pack_row_table_layout(int64_t rows, int64_t cols, DType dtype, uint64_t offset);
constexpr int64_t kPleTargetChunks = 65536;

struct PackManifest {
  int version = kPackFormatVersion;
  std::string family;              // registry model_type
  nlohmann::json config;           // the checkpoint's config.json, verbatim
  std::vector<std::string> tokenizer_files;  // copied files, relative names
  // XXH3-64 of each tokenizer file's bytes, by name (packs written before these existed have
  // none: verify says their tokenizer files are not covered).
  std::map<std::string, uint64_t> tokenizer_checksums;
  // XXH3-64 of the family and config as the manifest holds them (pack_settings_checksum);
  // written with every manifest, absent from older ones.
  std::optional<uint64_t> settings_checksum;
  DType dense_dtype = DType::bf16;           // of the float tensors (integer tensors keep theirs;
                                             // quantized matrices, version 3, are q8 or q4)
  std::vector<PackDenseTensor> dense;        // ascending offsets
  uint64_t dense_file_bytes = 0;             // size of dense.bin
  uint64_t dense_checksum = 0;               // XXH3-64 of dense.bin after the header page
  std::vector<int64_t> moe_layers;           // model layer index of each MoE layer, ascending
  std::vector<std::string> expert_prefixes;  // per MoE layer, the checkpoint prefix of its experts
                                             // ("model.layers.3.mlp.experts.")
  std::vector<std::string> expert_sources;   // per MoE layer, how the checkpoint stored them:
                                             // "gate_proj,up_proj,down_proj", "w1,w3,w2" or "fused"
  int64_t n_expert = 0, n_embd = 0, n_ff = 0;
  std::map<DType, PackKindInfo> kinds;  // empty for a pack without routed experts (version 2)
  std::optional<PackPleInfo> ple;            // version 2

  // The version the writer puts in manifest.json: 4 when the experts have biases, 3 when a
  // dense tensor is quantized, 2 when the pack uses what version 2 added, else 1.
  int needed_version() const {
    for (const auto& [kind, info] : kinds)
      if (info.has_biases()) return 4;
    for (const PackDenseTensor& t : dense)
      if (dtype_is_quantized(t.dtype)) return 3;
    return ple || moe_layers.empty() ? 2 : 1;
  }
  // The dtype of the dense matrices: the first quantized dense tensor's, else dense_dtype.
  DType dense_matrix_dtype() const {
    for (const PackDenseTensor& t : dense)
      if (dtype_is_quantized(t.dtype)) return t.dtype;
    return dense_dtype;
  }
  int64_t n_records() const { return static_cast<int64_t>(moe_layers.size()) * n_expert; }
};

// The checksum of the model settings a manifest carries: the family and the config (every
// key, sorted, numbers as parsed), so that an edit of any of them (num_experts_per_tok,
// rope_theta, max_position_embeddings, ...) after conversion is found by verify.
uint64_t pack_settings_checksum(const PackManifest& m);

// Parses and validates manifest.json text (pure; the fuzz target calls this). Every error is
// Status::corrupt or unsupported and names the field.
PackManifest parse_pack_manifest(std::string_view json_text, std::string_view file_name);
// The manifest as JSON text (what the writer puts in manifest.json; parses back equal).
std::string pack_manifest_to_json(const PackManifest& m);

// The header page of a data file. kind: "dense", "ple" or an expert kind name. Its version
// field is kPackDataVersion whatever the manifest's version (the data layout is unchanged).
std::vector<uint8_t> pack_file_header(std::string_view kind, uint64_t payload_bytes);

// An open pack: the manifest plus read-only mappings of dense.bin and the expert files.
class Pack {
 public:
  // Validates file sizes and headers. map_experts = false leaves the expert files unmapped
  // (a streamed run reads records through the IO engine; mapped_record is then an error).
  static std::shared_ptr<Pack> open(const std::filesystem::path& dir, bool map_experts = true);
  static bool is_pack(const std::filesystem::path& dir);                // has manifest.json

  const std::filesystem::path& dir() const { return dir_; }
  const PackManifest& manifest() const { return manifest_; }
  bool has_kind(DType k) const { return manifest_.kinds.count(k) != 0; }
  const PackKindInfo& kind(DType k) const;  // error naming the kinds the pack has

  // Dense tensors by checkpoint name (views into the mapping of dense.bin).
  bool has_dense(const std::string& name) const;
  Tensor dense(const std::string& name) const;
  std::vector<std::string> dense_names() const;

  // The path of a kind's expert file and the byte offset of a record in it.
  std::filesystem::path expert_file(DType k) const;
  uint64_t record_offset(DType k, int64_t record) const;
  // A record's bytes through the read-only mapping (for a fully resident run and verify).
  std::span<const uint8_t> mapped_record(DType k, int64_t record) const;
  // Keeps a kind's mapping alive (the owner for expert_view over mapped records).
  std::shared_ptr<void> mapping_owner(DType k) const { return expert_maps_.at(k); }
  bool experts_mapped(DType k) const { return expert_maps_.count(k) != 0; }

  int64_t record_id(int64_t moe_layer_index, int64_t expert) const { return moe_layer_index * manifest_.n_expert + expert; }
  // The MoE layer index of an expert prefix, or -1.
  int64_t moe_layer_of_prefix(const std::string& prefix) const;
  // "layer L, expert E, kind K" for messages (L is the model layer index).
  std::string describe_record(DType k, int64_t record) const;

  // The n-gram table stored under this prefix, or null.
  const PackRowTable* row_table(const std::string& prefix) const;
  std::filesystem::path ple_file() const;  // an error when the pack has no tables

 private:
  std::filesystem::path dir_;
  PackManifest manifest_;
  std::shared_ptr<void> dense_map_;
  std::map<DType, std::shared_ptr<void>> expert_maps_;
  std::map<DType, std::pair<const uint8_t*, uint64_t>> expert_bytes_;
  const uint8_t* dense_bytes_ = nullptr;
  uint64_t dense_size_ = 0;
  std::map<std::string, size_t> dense_index_;
};

// Gate, up and down as tensors viewing a record's bytes (the record may sit in a mapping, a
// host-RAM cache or a streaming slot). `owner` keeps that memory alive.
ExpertWeights expert_view(const PackKindInfo& kind, const void* record, std::shared_ptr<void> owner = {});

// sluice verify: checks the manifest against the files (sizes, headers) and every checksum
// (dense.bin and each record of each kind), reading the files with large sequential reads.
struct PackVerifyProgress {
  uint64_t bytes_done = 0, bytes_total = 0;
};
struct PackVerifyResult {
  bool ok = true;
  uint64_t records_checked = 0, bytes_checked = 0;
  uint64_t table_chunks_checked = 0;  // n-gram table chunks
  std::vector<std::string> problems;  // first bad record first; empty when ok
  // What the pack carries no checksum of (a pack written before settings_checksum and
  // tokenizer_checksums): "the model settings", "tokenizer.json", ...
  std::vector<std::string> not_covered;
};
// Throws for a pack that cannot be opened at all (missing or corrupt manifest, wrong file
// sizes or headers); checksum mismatches are collected (at most max_problems) in the result.
PackVerifyResult verify_pack(const std::filesystem::path& dir,
                             const std::function<void(const PackVerifyProgress&)>& progress = {},
                             size_t max_problems = 16);

}  // namespace sluice
