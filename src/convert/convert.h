// convert: an HF checkpoint directory in, a pack out (format/pack.h, docs/pack-format.md).
//
// Streams tensor by tensor with bounded memory: dense tensors are converted in chunks, and
// experts a batch of records at a time (about batch_bytes of checkpoint data), so peak
// memory is a few batches whatever the checkpoint's size. Reads use pread (never the
// checkpoint's mapping, whose pages would count as resident), quantization runs on the
// global thread pool, and a writer thread writes the previous batch (O_DIRECT where the
// file system allows it) while the next one is computed.
//
// Everything is written into a hidden staging directory next to the output, fsynced, checked
// by loading it as the family, and renamed into place at the end: an interrupted or failed
// convert never leaves something that looks like a complete pack. An interrupted one (and
// one stopped by an IO error) keeps its staging directory with a journal of what it wrote
// (convert_journal.h); the next convert of the same checkpoint with the same options checks
// that and resumes from it (`resume`), giving the same pack byte for byte.
//
// FP8 checkpoints (F8_E4M3 / F8_E5M2 weights with block scales: DeepSeek-V3, Kimi K2,
// MiniMax-M2) are read through Checkpoint, which dequantizes every block to f32; the pack's
// kinds are made from those values.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "format/pack.h"

namespace sluice {

struct ConvertProgress {
  std::string_view stage;            // "dense", "n-gram tables", "experts", "verifying" (a resumed partial pack)
  int64_t records_done = 0, records_total = 0;
  uint64_t bytes_done = 0, bytes_total = 0;  // checkpoint bytes read and converted
  double seconds = 0;                // since the start
};

struct ConvertOptions {
  std::vector<DType> kinds = {DType::bf16, DType::q4, DType::q2};
  // Dtype of the dense float tensors: f32 or bf16, or q8 / q4 (`--dense int8|q4`: the
  // matrices the family reads only through matmul or get_rows, with rows of whole 32-value
  // groups, are quantized; every other float tensor takes the default). Default: bf16 when
  // every float tensor of the checkpoint is bf16, f32 otherwise (so it never loses precision).
  std::optional<DType> dense_dtype;
  bool force = false;                    // replace an existing pack
  bool resume = true;                    // resume the partial pack of an interrupted convert (else start over)
  uint64_t batch_bytes = uint64_t{32} << 20;  // checkpoint bytes of experts per batch
  std::function<void(const ConvertProgress&)> progress;  // called on the calling thread
  const std::atomic<bool>* cancel = nullptr;             // set (e.g. by SIGINT) to stop early
};

struct ConvertSummary {
  std::filesystem::path out_dir;
  std::string family;
  int64_t n_records = 0;            // per kind
  uint64_t bytes_in = 0;            // checkpoint tensor bytes
  uint64_t bytes_out = 0;           // pack data bytes written
  double seconds = 0;
  DType dense_dtype = DType::bf16;       // of the float tensors that are not quantized
  std::optional<DType> dense_quant;      // q8 or q4 when dense matrices were quantized
  int64_t n_dense_quantized = 0, n_dense = 0;  // dense tensors quantized, and in all
  std::vector<DType> kinds;
  int64_t resumed_records = 0;      // records a resumed convert found written and verified
};

// Throws Error naming the file, tensor or field: not_found / corrupt for a bad checkpoint,
// unsupported for an unknown family or dtype, invalid_argument when OUT_DIR exists (and is
// not a pack that `force` may replace), io for a failed write or a cancelled run (whose
// message says when the partial pack is kept to be resumed).
ConvertSummary convert_checkpoint(const std::filesystem::path& hf_dir, const std::filesystem::path& out_dir,
                                  const ConvertOptions& options);

}  // namespace sluice
