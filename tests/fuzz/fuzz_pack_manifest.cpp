// libFuzzer target for the pack manifest parser: any input must either parse into a
// manifest that satisfies the documented invariants or throw sluice::Error; a crash, a
// sanitizer report or a violated invariant (__builtin_trap) is a bug. Built with the other
// fuzz targets (SLUICE_FUZZ=ON); `make fuzz` runs it:
//   build-fuzz/bin/fuzz_pack_manifest -dict=tests/fuzz/pack_manifest.dict -max_len=8192 \
//     -rss_limit_mb=2048 -malloc_limit_mb=512 tests/fuzz/corpus_pack_manifest
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "format/pack.h"

namespace {

void check_block(const sluice::PackBlock& b, const sluice::PackKindInfo& k) {
  if (b.offset + b.bytes > k.record_bytes || b.scale_offset + b.scale_bytes > k.record_bytes) __builtin_trap();
  if (b.offset % sluice::kPackBlockAlign || b.scale_offset % sluice::kPackBlockAlign) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    sluice::PackManifest m =
        sluice::parse_pack_manifest(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz/manifest.json");
    if (m.version < sluice::kPackMinFormatVersion || m.version > sluice::kPackFormatVersion || m.family.empty() ||
        !m.config.is_object())
      __builtin_trap();
    // Version 2 allows a pack without routed experts: then no sizes and no kinds.
    const bool none = m.moe_layers.empty();
    if (none && (m.version < 2 || m.n_expert || m.n_embd || m.n_ff || !m.kinds.empty())) __builtin_trap();
    if (!none && (m.n_expert < 1 || m.n_expert > sluice::kPackMaxExperts || m.n_embd < 1 || m.n_ff < 1)) __builtin_trap();
    if (m.moe_layers.size() != m.expert_prefixes.size() || m.moe_layers.size() != m.expert_sources.size())
      __builtin_trap();
    if (m.ple) {
      if (m.version < 2 || m.ple->file_bytes % sluice::kPackRecordAlign) __builtin_trap();
      for (const auto& t : m.ple->tables) {
        if (t.offset < sluice::kPackHeaderBytes || t.offset % sluice::kPackRecordAlign) __builtin_trap();
        if (t.row_offset(t.rows) > m.ple->file_bytes || t.n_chunks() != static_cast<int64_t>(t.checksums.size()))
          __builtin_trap();
        if ((static_cast<uint64_t>(t.chunk_rows) * t.row_stride) % sluice::kPackRecordAlign) __builtin_trap();
      }
    }
    if (!std::is_sorted(m.moe_layers.begin(), m.moe_layers.end()) ||
        std::adjacent_find(m.moe_layers.begin(), m.moe_layers.end()) != m.moe_layers.end())
      __builtin_trap();
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const auto& t : m.dense) {
      if (t.offset < sluice::kPackHeaderBytes || t.offset + t.bytes > m.dense_file_bytes) __builtin_trap();
      if (t.shape.empty() || t.shape.size() > 4 || sluice::dtype_is_quantized(t.dtype)) __builtin_trap();
      if (t.bytes) ranges.emplace_back(t.offset, t.offset + t.bytes);
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].first < ranges[i - 1].second) __builtin_trap();
    if (m.kinds.empty()) __builtin_trap();
    std::set<std::string> files;
    for (const auto& [kind, k] : m.kinds) {
      if (k.kind != kind || k.record_stride < k.record_bytes || k.record_stride % sluice::kPackRecordAlign) __builtin_trap();
      if (static_cast<int64_t>(k.checksums.size()) != m.n_records()) __builtin_trap();
      if (!files.insert(k.file).second || k.file.find('/') != std::string::npos) __builtin_trap();
      check_block(k.gate, k);
      check_block(k.up, k);
      check_block(k.down, k);
      if (k.gate.rows != m.n_ff || k.gate.cols != m.n_embd || k.down.rows != m.n_embd || k.down.cols != m.n_ff) __builtin_trap();
    }
    // The writer's output parses back to the same manifest.
    std::string again = sluice::pack_manifest_to_json(m);
    if (sluice::pack_manifest_to_json(sluice::parse_pack_manifest(again, "again")) != again) __builtin_trap();
  } catch (const sluice::Error&) {
    // Rejected input: the expected outcome for almost everything.
  }
  return 0;
}
