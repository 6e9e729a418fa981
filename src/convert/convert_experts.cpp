// convert's expert step: every routed expert's gate, up and down read from the checkpoint's
// layout (per expert, fused, inputs first, gpt-oss's float or MXFP4 blocks; FP8 weights
// dequantized), converted to each kind's rows, and written a batch of records at a time by
// the writer thread while the next batch is computed on the thread pool.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "convert/convert_journal.h"
#include "convert/convert_steps.h"
#include "core/error.h"
#include "core/log.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "format/file_io.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

// Where one projection of one expert lies in the checkpoint: rows [rows, cols] of the pack's
// block (out features, in features). Per-expert and fused layouts: one contiguous byte range
// of those rows (an FP8 per-expert weight: its rows, dequantized through the reader).
// gpt_oss: the expert's whole stored matrix [in, out] (gate and up columns interleaved),
// whose columns are the rows. gpt_oss_mxfp4: MXFP4 rows (gate and up rows interleaved), their
// e8m0 scales in a tensor of their own.
struct SourceBlock {
  int fd = -1;
  std::string name;        // tensor
  uint64_t offset = 0;     // file offset of row 0 (gpt_oss: of the expert's matrix)
  DType dtype = DType::f32;  // of the stored values (mxfp4 for gpt_oss_mxfp4, f8_* for FP8)
  int64_t rows = 0, cols = 0;
  int64_t row0 = 0;        // first row inside the tensor (fused and MXFP4 layouts), for messages
  ExpertLayout layout = ExpertLayout::per_expert;
  int scale_fd = -1;       // gpt_oss_mxfp4: the scales' file and the offset of row 0's scales
  uint64_t scale_offset = 0;
};

// Bytes a checkpoint takes for one expert weight (batch sizing; MXFP4 rounded up to 1).
uint64_t expert_source_elem_bytes(const Checkpoint& ck, const ExpertLayer& l) {
  switch (l.layout) {
    case ExpertLayout::per_expert: return dtype_size(ck.entry(l.names[0][0]).dtype);
    case ExpertLayout::fused:
    case ExpertLayout::fused_inputs_first:
    case ExpertLayout::gpt_oss: return dtype_size(ck.entry(l.prefix + "gate_up_proj").dtype);
    case ExpertLayout::gpt_oss_mxfp4: return 1;
  }
  return 2;
}

// Reads the rows of one work item of a SourceBlock and hands them out one at a time, as f32
// and, where the source holds them so, as bf16 or MXFP4 bytes to copy unchanged.
class ExpertRowReader {
 public:
  struct Row {
    const float* f32 = nullptr;               // cols values
    const uint8_t* bf16 = nullptr;            // cols bf16 values as stored, or null
    const uint8_t* mxfp4 = nullptr;           // quant_row_bytes(mxfp4, cols) as stored, or null
    const uint8_t* mxfp4_scales = nullptr;    // quant_scale_row_bytes(mxfp4, cols)
  };

  // Reads what rows [r0, r1) of projection proj (0 gate, 1 up, 2 down) need; returns the
  // checkpoint bytes they stand for (gate and up each read both of their interleaved rows or
  // columns and count half: the progress adds up to the checkpoint's size). For the
  // inputs-first layouts the read of gate's whole [in, out] matrix serves up's rows too.
  uint64_t read(const SourceBlock& s, int proj, int64_t r0, int64_t r1, CheckpointReader& reader) {
    r0_ = r0;
    tile_n_ = 0;
    const std::string where = reader.where(s.name);
    const size_t esz = dtype_size(s.dtype);
    switch (s.layout) {
      case ExpertLayout::per_expert:
      case ExpertLayout::fused: {
        if (dtype_is_fp8(s.dtype)) {  // a per-expert matrix: its rows, dequantized with their block scales
          rows_f32_.resize(static_cast<size_t>((r1 - r0) * s.cols));
          return reader.read_rows_f32(s.name, s.row0 + r0, r1 - r0, rows_f32_.data(), in_);
        }
        const size_t rb = static_cast<size_t>(s.cols) * esz;
        in_.resize(rb * static_cast<size_t>(r1 - r0));
        pread_all(s.fd, in_.data(), in_.size(), s.offset + static_cast<uint64_t>(r0) * rb, where);
        return in_.size();
      }
      case ExpertLayout::fused_inputs_first:
      case ExpertLayout::gpt_oss: {  // [in, out]: the rows are columns
        const int64_t out_cols = proj == 2 ? s.rows : 2 * s.rows;
        in_.resize(static_cast<size_t>(s.cols * out_cols) * esz);
        pread_all(s.fd, in_.data(), in_.size(), s.offset, where);
        return proj == 2 ? in_.size() : in_.size() / 2;
      }
      case ExpertLayout::gpt_oss_mxfp4: {  // gate / up: source rows [2 r0, 2 r1), both interleaved
        const int64_t step = proj == 2 ? 1 : 2, first = step * r0, n = step * (r1 - r0);
        const size_t rb = static_cast<size_t>(quant_row_bytes(DType::mxfp4, s.cols));
        const size_t sb = static_cast<size_t>(quant_scale_row_bytes(DType::mxfp4, s.cols));
        in_.resize(rb * static_cast<size_t>(n));
        scales_.resize(sb * static_cast<size_t>(n));
        pread_all(s.fd, in_.data(), in_.size(), s.offset + static_cast<uint64_t>(first) * rb, where);
        pread_all(s.scale_fd, scales_.data(), scales_.size(), s.scale_offset + static_cast<uint64_t>(first) * sb,
                  where + " (scales)");
        return (in_.size() + scales_.size()) / static_cast<size_t>(step);
      }
    }
    return 0;
  }

  // Row r (inside the range read) of projection proj.
  Row row(const SourceBlock& s, int proj, int64_t r) {
    Row out;
    f32_.resize(static_cast<size_t>(s.cols));
    const size_t esz = dtype_size(s.dtype);
    switch (s.layout) {
      case ExpertLayout::per_expert:
      case ExpertLayout::fused: {
        if (dtype_is_fp8(s.dtype)) {
          out.f32 = rows_f32_.data() + static_cast<size_t>((r - r0_) * s.cols);
          return out;
        }
        const uint8_t* src = in_.data() + static_cast<size_t>(r - r0_) * static_cast<size_t>(s.cols) * esz;
        dtype_row_to_f32(src, s.dtype, s.cols, f32_.data());
        if (s.dtype == DType::bf16) out.bf16 = src;
        break;
      }
      case ExpertLayout::fused_inputs_first:
      case ExpertLayout::gpt_oss: {
        if (proj != tile_proj_ || r < tile_r0_ || r >= tile_r0_ + tile_n_) fill_tile(s, proj, r);
        out.f32 = tile_.data() + static_cast<size_t>((r - tile_r0_) * s.cols);
        return out;
      }
      case ExpertLayout::gpt_oss_mxfp4: {
        const int64_t i = proj == 2 ? r - r0_ : 2 * (r - r0_) + proj;
        out.mxfp4 = in_.data() + static_cast<size_t>(i * quant_row_bytes(DType::mxfp4, s.cols));
        out.mxfp4_scales = scales_.data() + static_cast<size_t>(i * quant_scale_row_bytes(DType::mxfp4, s.cols));
        dequantize_row(DType::mxfp4, out.mxfp4, out.mxfp4_scales, s.cols, f32_.data());
        break;
      }
    }
    out.f32 = f32_.data();
    return out;
  }

  // The checkpoint's row (or column, for the inputs-first layouts) of block row r.
  static int64_t source_row(const SourceBlock& s, int proj, int64_t r) {
    switch (s.layout) {
      case ExpertLayout::gpt_oss: return proj == 2 ? r : 2 * r + proj;         // a column: interleaved
      case ExpertLayout::fused_inputs_first: return proj == 2 ? r : proj * s.rows + r;  // a column: halves
      case ExpertLayout::gpt_oss_mxfp4: return s.row0 + (proj == 2 ? r : 2 * r + proj);
      default: return s.row0 + r;
    }
  }

 private:
  static constexpr int64_t kTileRows = 64;  // block rows transposed at once (a tile of 64 x cols f32)
  static constexpr int64_t kSpanRows = 16;  // input rows converted before they are scattered (a cache line of f32)

  // The inputs-first layouts: block rows [r, r + kTileRows) of proj, as f32 rows of tile_,
  // transposed out of the [in, out] matrix in_ an input row at a time: each input row's
  // columns of these block rows are one short contiguous span (every other column where gate
  // and up interleave), converted at once, so the matrix is read sequentially instead of a
  // column (a cache line an element) at a time.
  void fill_tile(const SourceBlock& s, int proj, int64_t r) {
    const int64_t out_cols = proj == 2 ? s.rows : 2 * s.rows;
    const int64_t n = std::min(kTileRows, s.rows - r);
    const int64_t first = source_row(s, proj, r), stride = n > 1 ? source_row(s, proj, r + 1) - first : 1;
    const int64_t span = (n - 1) * stride + 1;
    const size_t esz = dtype_size(s.dtype);
    tile_.resize(static_cast<size_t>(kTileRows * s.cols));
    span_.resize(static_cast<size_t>(kSpanRows * span));
    // kSpanRows input rows at a time, so that each block row receives a whole cache line of
    // them: writing one float a row at a power-of-two stride would evict its own lines.
    for (int64_t i0 = 0; i0 < s.cols; i0 += kSpanRows) {
      const int64_t m = std::min(kSpanRows, s.cols - i0);
      for (int64_t ii = 0; ii < m; ++ii)
        dtype_row_to_f32(in_.data() + static_cast<size_t>((i0 + ii) * out_cols + first) * esz, s.dtype, span,
                         span_.data() + ii * span);
      for (int64_t j = 0; j < n; ++j) {
        float* dst = tile_.data() + j * s.cols + i0;
        for (int64_t ii = 0; ii < m; ++ii) dst[ii] = span_[static_cast<size_t>(ii * span + j * stride)];
      }
    }
    tile_proj_ = proj;
    tile_r0_ = r;
    tile_n_ = n;
  }

  int64_t r0_ = 0;
  std::vector<uint8_t> in_, scales_;
  std::vector<float> f32_;
  std::vector<float> rows_f32_;  // FP8: the rows read, dequantized [r1 - r0, cols]
  std::vector<float> tile_, span_;  // fill_tile's block rows [tile_n_, cols], kSpanRows input rows' spans
  int tile_proj_ = -1;
  int64_t tile_r0_ = 0, tile_n_ = 0;
};

// A work item of a batch: (record, projection, row chunk); a gpt-oss float matrix is one item
// (its rows are the stored matrix's columns), the biases one item a record (proj 3).
struct WorkItem {
  SourceBlock src;
  int64_t rec = 0, row_begin = 0, row_end = 0;
  int proj = 0;
  bool with_up = false;  // proj 0 of an inputs-first float matrix: up's rows from the same read
};

// The expert files of one convert: every record from the checkpoint into each kind.
class ExpertRecordWriter {
 public:
  ExpertRecordWriter(const ConvertPlan& plan, CheckpointReader& reader, PackManifest& m)
      : plan_(plan), reader_(reader), m_(m), E_(m.n_expert), d_(m.n_embd), ff_(m.n_ff) {
    for (DType k : plan.kinds) infos_.push_back(&m.kinds.at(k));
  }

  void run(const fs::path& dir, ConvertReporter& report, int64_t first_record, ConvertJournal* journal);

 private:
  SourceBlock source_of(int64_t rec, int p);
  std::vector<WorkItem> batch_items(int64_t r0, int64_t count);
  uint64_t compute_item(const WorkItem& item, ExpertRowReader& rows, uint8_t* const* recs);
  void store_row(const ExpertRowReader::Row& row, const SourceBlock& s, int proj, int64_t r, uint8_t* const* recs);
  uint64_t write_biases(const SourceBlock& s, int64_t rec, uint8_t* const* recs);
  int64_t records_per_batch(uint64_t batch_bytes) const;

  const ConvertPlan& plan_;
  CheckpointReader& reader_;
  PackManifest& m_;
  const int64_t E_, d_, ff_;
  std::vector<PackKindInfo*> infos_;  // in plan_.kinds order
};

// Records per batch: about batch_bytes of checkpoint data, at least one record, and at most
// four layers' worth (tiny experts would otherwise make one batch of everything).
int64_t ExpertRecordWriter::records_per_batch(uint64_t batch_bytes) const {
  const uint64_t src_elem = expert_source_elem_bytes(reader_.checkpoint(), plan_.layers[0]);
  const uint64_t record_in_bytes = static_cast<uint64_t>(3 * ff_ * d_) * std::max<uint64_t>(src_elem, 2);
  return std::clamp<int64_t>(static_cast<int64_t>(batch_bytes / std::max<uint64_t>(1, record_in_bytes)), 1,
                             std::max<int64_t>(1, E_ * 4));
}

// The source block of (record, projection).
SourceBlock ExpertRecordWriter::source_of(int64_t rec, int p) {
  const Checkpoint& ck = reader_.checkpoint();
  const ExpertLayer& l = plan_.layers[static_cast<size_t>(rec / E_)];
  const int64_t e = rec % E_;
  SourceBlock s;
  s.rows = p == 2 ? d_ : ff_;
  s.cols = p == 2 ? ff_ : d_;
  switch (l.layout) {
    case ExpertLayout::per_expert:
      s.name = l.names[static_cast<size_t>(e)][p];
      s.offset = reader_.offset(s.name);
      break;
    case ExpertLayout::fused:
      s.name = l.prefix + (p == 2 ? "down_proj" : "gate_up_proj");
      s.row0 = p == 2 ? e * d_ : e * 2 * ff_ + (p == 1 ? ff_ : 0);
      s.offset = reader_.offset(s.name) + static_cast<uint64_t>(s.row0 * s.cols) * dtype_size(ck.entry(s.name).dtype);
      break;
    case ExpertLayout::fused_inputs_first:
    case ExpertLayout::gpt_oss:  // the whole [in, out] matrix of expert e
      s.name = l.prefix + (p == 2 ? "down_proj" : "gate_up_proj");
      s.offset = reader_.offset(s.name) +
                 static_cast<uint64_t>(e * (p == 2 ? d_ * ff_ : 2 * ff_ * d_)) * dtype_size(ck.entry(s.name).dtype);
      break;
    case ExpertLayout::gpt_oss_mxfp4: {  // rows of values; the scales at scale_offset
      s.name = l.prefix + (p == 2 ? "down_proj_blocks" : "gate_up_proj_blocks");
      s.row0 = p == 2 ? e * d_ : e * 2 * ff_;  // gate / up rows interleave: source row row0 + 2f (+ 1)
      s.offset = reader_.offset(s.name) + static_cast<uint64_t>(s.row0 * quant_row_bytes(DType::mxfp4, s.cols));
      const std::string scales = l.prefix + (p == 2 ? "down_proj_scales" : "gate_up_proj_scales");
      s.scale_fd = reader_.fd(scales);
      s.scale_offset =
          reader_.offset(scales) + static_cast<uint64_t>(s.row0 * quant_scale_row_bytes(DType::mxfp4, s.cols));
      break;
    }
  }
  s.dtype = l.layout == ExpertLayout::gpt_oss_mxfp4 ? DType::mxfp4 : ck.entry(s.name).dtype;
  SLUICE_CHECK(!dtype_is_fp8(s.dtype) || l.layout == ExpertLayout::per_expert, Status::unsupported, reader_.where(s.name),
               ": FP8 experts are read in the per-expert layout only");
  s.layout = l.layout;
  s.fd = reader_.fd(s.name);
  return s;
}

std::vector<WorkItem> ExpertRecordWriter::batch_items(int64_t r0, int64_t count) {
  constexpr int64_t kChunkBytes = int64_t{1} << 20;  // input bytes per work item
  std::vector<WorkItem> items;
  for (int64_t i = 0; i < count; ++i) {
    for (int p = 0; p < 3; ++p) {
      SourceBlock s = source_of(r0 + i, p);
      const bool inputs_first = s.layout == ExpertLayout::gpt_oss || s.layout == ExpertLayout::fused_inputs_first;
      if (inputs_first && p == 1) continue;  // read with gate (with_up)
      const int64_t row_bytes = s.layout == ExpertLayout::gpt_oss_mxfp4
                                    ? 2 * quant_row_bytes(DType::mxfp4, s.cols)
                                    : s.cols * static_cast<int64_t>(dtype_size(s.dtype));
      const int64_t rows_per_item =
          inputs_first ? s.rows : std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, row_bytes));
      for (int64_t r = 0; r < s.rows; r += rows_per_item)
        items.push_back({s, r0 + i, r, std::min(s.rows, r + rows_per_item), p, inputs_first && p == 0});
    }
    if (const ExpertLayer& l = plan_.layers[static_cast<size_t>((r0 + i) / E_)]; l.biases) {
      // The biases (gpt-oss): gate_up_proj_bias [E, 2 n_ff] at fd/offset, down_proj_bias
      // [E, n_embd] at scale_fd/scale_offset.
      SourceBlock s;
      s.name = l.prefix + "gate_up_proj_bias";
      s.fd = reader_.fd(s.name);
      s.offset = reader_.offset(s.name);
      s.scale_fd = reader_.fd(l.prefix + "down_proj_bias");
      s.scale_offset = reader_.offset(l.prefix + "down_proj_bias");
      WorkItem item;
      item.src = s;
      item.rec = r0 + i;
      item.proj = 3;
      items.push_back(item);
    }
  }
  return items;
}

// gpt-oss's biases of record rec into every kind's record, as f32: gate f = gate_up_proj_bias
// [e, 2f], up f = [e, 2f + 1] (interleaved as the weights), down = down_proj_bias[e]; s as
// batch_items sets it. Returns the bytes read.
uint64_t ExpertRecordWriter::write_biases(const SourceBlock& s, int64_t rec, uint8_t* const* recs) {
  const ExpertLayer& l = plan_.layers[static_cast<size_t>(rec / E_)];
  const int64_t e = rec % E_;
  std::vector<uint8_t> in;
  std::vector<float> gu(static_cast<size_t>(2 * ff_)), dn(static_cast<size_t>(d_));
  auto load = [&](const std::string& name, int fd, uint64_t offset, int64_t n, float* dst) {
    const DType dt = reader_.checkpoint().entry(name).dtype;
    in.resize(static_cast<size_t>(n) * dtype_size(dt));
    pread_all(fd, in.data(), in.size(), offset + static_cast<uint64_t>(e * n) * dtype_size(dt), reader_.where(name));
    dtype_row_to_f32(in.data(), dt, n, dst);
    return static_cast<uint64_t>(in.size());
  };
  const uint64_t bytes = load(l.prefix + "gate_up_proj_bias", s.fd, s.offset, 2 * ff_, gu.data()) +
                         load(l.prefix + "down_proj_bias", s.scale_fd, s.scale_offset, d_, dn.data());
  for (size_t k = 0; k < infos_.size(); ++k) {
    const PackKindInfo& info = *infos_[k];
    auto* g = reinterpret_cast<float*>(recs[k] + info.gate_bias.offset);
    auto* u = reinterpret_cast<float*>(recs[k] + info.up_bias.offset);
    for (int64_t f = 0; f < ff_; ++f) {
      g[f] = gu[static_cast<size_t>(2 * f)];
      u[f] = gu[static_cast<size_t>(2 * f + 1)];
    }
    std::memcpy(recs[k] + info.down_bias.offset, dn.data(), static_cast<size_t>(d_) * sizeof(float));
  }
  return bytes;
}

// Row r of projection proj into every kind's record: bf16 copied as stored or rounded from
// f32, MXFP4 copied as shipped to the mxfp4 kind, everything else quantized from f32.
void ExpertRecordWriter::store_row(const ExpertRowReader::Row& row, const SourceBlock& s, int proj, int64_t r,
                                   uint8_t* const* recs) {
  for (size_t k = 0; k < infos_.size(); ++k) {
    const PackKindInfo& info = *infos_[k];
    const PackBlock& blk = proj == 0 ? info.gate : proj == 1 ? info.up : info.down;
    uint8_t* rec = recs[k];
    if (info.kind == DType::bf16) {
      auto* o = reinterpret_cast<uint16_t*>(rec + blk.offset) + r * s.cols;
      if (row.bf16) std::memcpy(o, row.bf16, static_cast<size_t>(s.cols) * 2);
      else for (int64_t c = 0; c < s.cols; ++c) o[c] = f32_to_bf16(row.f32[c]);
      continue;
    }
    const DType qt = info.kind;
    uint8_t* vals = rec + blk.offset + r * quant_row_bytes(qt, s.cols);
    uint8_t* scales = rec + blk.scale_offset + r * quant_scale_row_bytes(qt, s.cols);
    if (qt == DType::mxfp4 && row.mxfp4) {  // as the checkpoint ships it, bit for bit
      std::memcpy(vals, row.mxfp4, static_cast<size_t>(quant_row_bytes(qt, s.cols)));
      std::memcpy(scales, row.mxfp4_scales, static_cast<size_t>(quant_scale_row_bytes(qt, s.cols)));
      continue;
    }
    if (!quantize_row(qt, row.f32, s.cols, vals, scales))
      fail(Status::corrupt, reader_.checkpoint().dir().string(), ": tensor ", s.name, " row ",
           ExpertRowReader::source_row(s, proj, r), " holds a NaN or an infinity, or values beyond the f16 scale range ",
           "(cannot quantize to ", expert_kind_name(info.kind), ")");
  }
}

// One work item's rows into every kind's record; returns the checkpoint bytes it stands for.
uint64_t ExpertRecordWriter::compute_item(const WorkItem& item, ExpertRowReader& rows, uint8_t* const* recs) {
  if (item.proj == 3) return write_biases(item.src, item.rec, recs);
  const SourceBlock& s = item.src;
  const uint64_t got = rows.read(s, item.proj, item.row_begin, item.row_end, reader_);
  const int last_proj = item.with_up ? 1 : item.proj;
  for (int proj = item.proj; proj <= last_proj; ++proj)
    for (int64_t r = item.row_begin; r < item.row_end; ++r) store_row(rows.row(s, proj, r), s, proj, r, recs);
  return item.with_up ? 2 * got : got;  // gate's read counts half its matrix, up's the other
}

void ExpertRecordWriter::run(const fs::path& dir, ConvertReporter& report, int64_t first_record, ConvertJournal* journal) {
  const int64_t n_records = m_.n_records();
  std::vector<std::unique_ptr<OutFile>> files;
  std::vector<OutFile*> file_ptrs;
  for (PackKindInfo* info : infos_) {
    files.push_back(open_expert_file(dir, *info, n_records, first_record));
    file_ptrs.push_back(files.back().get());
  }
  const int64_t per_batch = records_per_batch(report.options().batch_bytes);
  RecordBatch batches[2];
  for (RecordBatch& b : batches)
    for (PackKindInfo* info : infos_) b.out.push_back(std::make_unique<AlignedBuffer>(per_batch * info->record_stride));
  {
    RecordBatchWriter writer(file_ptrs, infos_, true,
                             journal ? [&](const RecordBatch& b) { journal->records_written(b.r0, b.count, infos_); }
                                     : std::function<void(const RecordBatch&)>());
    int which = 0;
    for (int64_t r0 = first_record; r0 < n_records; r0 += per_batch, which ^= 1) {
      report.check_cancel();
      RecordBatch& b = batches[which];
      writer.wait_free(&b);
      b.r0 = r0;
      b.count = std::min(per_batch, n_records - r0);
      const std::vector<WorkItem> items = batch_items(r0, b.count);
      std::atomic<uint64_t> bytes_in{0};
      ThreadPool::global().parallel_for(static_cast<int64_t>(items.size()), 1, [&](int64_t i0, int64_t i1) {
        ExpertRowReader rows;
        for (int64_t it = i0; it < i1; ++it) {
          const WorkItem& item = items[static_cast<size_t>(it)];
          uint8_t* recs[kExpertKindCount];
          for (size_t k = 0; k < infos_.size(); ++k) recs[k] = b.out[k]->data() + (item.rec - r0) * infos_[k]->record_stride;
          bytes_in += compute_item(item, rows, recs);
        }
      });
      // Zero the record padding and the gaps between blocks (the buffers are reused).
      for (size_t k = 0; k < infos_.size(); ++k)
        for (int64_t i = 0; i < b.count; ++i) pack_record_zero_gaps(*infos_[k], b.out[k]->data() + i * infos_[k]->record_stride);
      writer.push(&b);
      report.advance("experts", bytes_in.load(), r0 + b.count);
    }
    writer.drain();
  }
  for (size_t k = 0; k < files.size(); ++k) {
    if (k == 0) LOG_INFO("convert: expert files written with ", files[k]->direct() ? "O_DIRECT" : "buffered", " IO");
    files[k]->finish();
  }
}

}  // namespace

void write_expert_records(const ConvertPlan& plan, CheckpointReader& reader, PackManifest& m, const fs::path& dir,
                          ConvertReporter& report, int64_t first_record, ConvertJournal* journal) {
  if (plan.layers.empty()) return;
  ExpertRecordWriter(plan, reader, m).run(dir, report, first_record, journal);
}

}  // namespace sluice
