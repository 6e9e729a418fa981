// The pack: sluice's own on-disk model format, laid out for streaming experts.
//
//   DIR/manifest.json        format version, family, config, tokenizer files, dense tensors,
//                            and per expert kind: file, record stride, block offsets, checksums
//   DIR/dense.bin            every non-expert tensor (bf16 or f32), each 64-byte aligned
//   DIR/experts.<kind>.bin   one record per (MoE layer, expert): gate, up and down blocks and
//                            their scales; records 4096-aligned at a fixed stride, so one
//                            direct read fetches one expert
//   DIR/tokenizer.json, tokenizer_config.json   copied from the checkpoint
//
// Record id = moe_layer_index * n_expert + expert, where moe_layer_index counts only the
// layers that have routed experts (manifest "moe_layers" lists their model layer indices).
// Bit layouts of the kinds: core/quant.h and docs/pack-format.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/expert_weights.h"

namespace sluice {

constexpr int kPackFormatVersion = 1;
constexpr uint64_t kPackRecordAlign = 4096;  // O_DIRECT alignment of records and strides

// Expert precisions a pack can hold. bf16 is the checkpoint's precision (f16/f32 experts
// are converted to bf16); the others are quantized (core/quant.h).
enum class ExpertKind { bf16, int8, q4, q2 };
std::string_view expert_kind_name(ExpertKind k);                     // "bf16", "int8", "q4", "q2"
std::optional<ExpertKind> expert_kind_from_name(std::string_view s);
DType expert_kind_dtype(ExpertKind k);                               // bf16, q8, q4, q2

// One projection matrix inside a record.
struct PackBlock {
  int64_t rows = 0, cols = 0;     // [out_features, in_features]
  uint64_t offset = 0, bytes = 0;              // packed values, from the record start
  uint64_t scale_offset = 0, scale_bytes = 0;  // scales (quantized kinds; 0 bytes for bf16)
};

struct PackKindInfo {
  ExpertKind kind = ExpertKind::bf16;
  std::string file;               // "experts.q4.bin", relative to the pack directory
  uint64_t record_bytes = 0;      // bytes actually used by a record
  uint64_t record_stride = 0;     // multiple of kPackRecordAlign, >= record_bytes
  PackBlock gate, up, down;       // gate/up [n_ff, n_embd], down [n_embd, n_ff]
  std::vector<uint64_t> checksums;  // XXH3-64 of each record's record_bytes, by record id
};

struct PackDenseTensor {
  std::string name;               // the checkpoint's tensor name
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t offset = 0, bytes = 0;  // in dense.bin
};

struct PackManifest {
  int version = kPackFormatVersion;
  std::string family;              // registry model_type
  nlohmann::json config;           // the checkpoint's config.json, verbatim
  std::vector<std::string> tokenizer_files;  // copied files, relative names
  DType dense_dtype = DType::bf16;
  std::vector<PackDenseTensor> dense;
  std::vector<int64_t> moe_layers;           // model layer index of each MoE layer, ascending
  std::vector<std::string> expert_prefixes;  // per MoE layer, the checkpoint prefix of its experts
                                             // ("model.layers.3.mlp.experts.")
  int64_t n_expert = 0, n_embd = 0, n_ff = 0;
  std::map<ExpertKind, PackKindInfo> kinds;

  int64_t n_records() const { return static_cast<int64_t>(moe_layers.size()) * n_expert; }
};

// Parses and validates manifest.json text (pure; the fuzz target calls this). Every error is
// Status::corrupt or unsupported and names the field.
PackManifest parse_pack_manifest(std::string_view json_text, std::string_view file_name);

// An open pack: the manifest plus read-only mappings of dense.bin and the expert files.
class Pack {
 public:
  static std::shared_ptr<Pack> open(const std::filesystem::path& dir);  // validates file sizes
  static bool is_pack(const std::filesystem::path& dir);                // has manifest.json

  const std::filesystem::path& dir() const { return dir_; }
  const PackManifest& manifest() const { return manifest_; }
  bool has_kind(ExpertKind k) const { return manifest_.kinds.count(k) != 0; }
  const PackKindInfo& kind(ExpertKind k) const;  // error naming the kinds the pack has

  // Dense tensors by checkpoint name (views into the mapping of dense.bin).
  bool has_dense(const std::string& name) const;
  Tensor dense(const std::string& name) const;
  std::vector<std::string> dense_names() const;

  // The path of a kind's expert file and the byte offset of a record in it.
  std::filesystem::path expert_file(ExpertKind k) const;
  uint64_t record_offset(ExpertKind k, int64_t record) const;
  // A record's bytes through the read-only mapping (for a fully resident run and verify).
  std::span<const uint8_t> mapped_record(ExpertKind k, int64_t record) const;

  int64_t record_id(int64_t moe_layer_index, int64_t expert) const { return moe_layer_index * manifest_.n_expert + expert; }
  // The MoE layer index of an expert prefix, or -1.
  int64_t moe_layer_of_prefix(const std::string& prefix) const;

 private:
  std::filesystem::path dir_;
  PackManifest manifest_;
  std::shared_ptr<void> dense_map_;
  std::map<ExpertKind, std::shared_ptr<void>> expert_maps_;
  std::map<ExpertKind, std::pair<const uint8_t*, uint64_t>> expert_bytes_;
  const uint8_t* dense_bytes_ = nullptr;
  uint64_t dense_size_ = 0;
  std::map<std::string, size_t> dense_index_;
};

// Gate, up and down as tensors viewing a record's bytes (the record may sit in a mapping, a
// host-RAM cache or a streaming slot). `owner` keeps that memory alive.
ExpertWeights expert_view(const PackKindInfo& kind, const void* record, std::shared_ptr<void> owner = {});

}  // namespace sluice
