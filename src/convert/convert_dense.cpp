// convert's dense steps: dense.bin (tensors converted or quantized a piece at a time) and the
// PLE n-gram tables' ple.<dtype>.bin (rows at a fixed stride, checksummed by chunk).
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <memory>

#include "convert/convert_steps.h"
#include "core/error.h"
#include "core/log.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "models/ple.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kPieceValues = int64_t{4} << 20;  // values converted at once (16 MB of f32)

// One dense matrix quantized row by row (core/quant.h) in pieces of about 4M values: the
// values go to dense.bin as they are made, the scales (1/16 of the values for q4, 4 bytes a
// row for int8) are kept and written after them, 64-byte aligned.
void write_quantized_dense(DenseFileWriter& out, PackDenseTensor& t, CheckpointReader& reader, ConvertReporter& report) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const DType q = t.dtype;
  const int64_t row_bytes = quant_row_bytes(q, cols), scale_row_bytes = quant_scale_row_bytes(q, cols);
  const int64_t piece_rows = std::max<int64_t>(1, kPieceValues / cols);
  std::vector<uint8_t> stored, values, scales(static_cast<size_t>(rows * scale_row_bytes));
  std::vector<float> in;
  for (int64_t r0 = 0; r0 < rows; r0 += piece_rows) {
    report.check_cancel();
    const int64_t nr = std::min(piece_rows, rows - r0);
    in.resize(static_cast<size_t>(nr * cols));
    values.resize(static_cast<size_t>(nr * row_bytes));
    const uint64_t got = reader.read_rows_f32(t.name, r0, nr, in.data(), stored);
    std::atomic<int64_t> bad_row{-1};
    ThreadPool::global().parallel_for(nr, 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        if (!quantize_row(q, in.data() + i * cols, cols, values.data() + i * row_bytes,
                          scales.data() + (r0 + i) * scale_row_bytes))
          bad_row = r0 + i;
    });
    if (bad_row >= 0)
      fail(Status::corrupt, reader.where(t.name), " row ", bad_row.load(), " holds a NaN or an infinity, or values beyond ",
           "the f16 scale range (cannot quantize to ", expert_kind_name(q), "; convert with --dense bf16 or f32)");
    out.write(values.data(), values.size());
    t.bytes += values.size();
    report.advance("dense", got);
  }
  t.scale_offset = out.begin_tensor();
  out.write(scales.data(), scales.size());
  t.scale_bytes = scales.size();
}

// One dense tensor converted to `t.dtype` (f32, bf16, or its own integer dtype) in pieces
// of about 4M values: stored floats by value, FP8 weights a block row range at a time
// through their dequantized f32 values.
void write_plain_dense(DenseFileWriter& out, PackDenseTensor& t, CheckpointReader& reader, ConvertReporter& report) {
  const SafetensorsEntry& e = reader.checkpoint().entry(t.name);
  std::vector<uint8_t> in, converted;
  if (dtype_is_fp8(e.dtype)) {
    const int64_t rows = e.shape[0], cols = e.shape[1];
    const int64_t piece_rows = std::max<int64_t>(1, kPieceValues / cols);
    std::vector<float> f32;
    for (int64_t r0 = 0; r0 < rows; r0 += piece_rows) {
      report.check_cancel();
      const int64_t nr = std::min(piece_rows, rows - r0);
      f32.resize(static_cast<size_t>(nr * cols));
      const uint64_t got = reader.read_rows_f32(t.name, r0, nr, f32.data(), in);
      converted.resize(static_cast<size_t>(nr * cols) * dtype_size(t.dtype));
      dtype_convert_row(f32.data(), DType::f32, converted.data(), t.dtype, nr * cols);
      out.write(converted.data(), converted.size());
      t.bytes += converted.size();
      report.advance("dense", got);
    }
    return;
  }
  const uint64_t n_elem = (e.end - e.begin) / dtype_size(e.dtype);
  for (uint64_t done = 0; done < n_elem;) {
    report.check_cancel();
    const uint64_t cnt = std::min<uint64_t>(static_cast<uint64_t>(kPieceValues), n_elem - done);
    in.resize(cnt * dtype_size(e.dtype));
    converted.resize(cnt * dtype_size(t.dtype));
    reader.read(t.name, done * dtype_size(e.dtype), in.data(), in.size());
    dtype_convert_row(in.data(), e.dtype, converted.data(), t.dtype, static_cast<int64_t>(cnt));
    out.write(converted.data(), converted.size());
    done += cnt;
    t.bytes += converted.size();
    report.advance("dense", in.size());
  }
}

}  // namespace

void write_dense_file(const ConvertPlan& plan, CheckpointReader& reader, PackManifest& m, const fs::path& dir,
                      ConvertReporter& report) {
  const Checkpoint& ck = reader.checkpoint();
  std::error_code ec;
  fs::remove(dir / kPackDenseName, ec);  // a resumed convert writing it again
  DenseFileWriter out(dir / kPackDenseName);
  m.dense.clear();
  for (const std::string& name : plan.dense_names) {
    const SafetensorsEntry& e = ck.entry(name);
    const DType dtype = ck.dtype(name);  // an FP8 weight's: what it dequantizes to (a float dtype)
    SLUICE_CHECK(e.shape.size() >= 1 && e.shape.size() <= 4, Status::unsupported, ck.dir().string(), ": tensor ", name,
                 " has ", e.shape.size(), " dimensions (the pack holds 1 to 4)");
    const bool quantize = plan.dense_quant && dtype_is_float(dtype) && plan.matrices.count(name) &&
                          dense_quantizable_shape(e.shape);
    // A tensor the family needs exactly (a router's correction bias) is widened to f32, which
    // holds any float dtype's value: never rounded to a narrower dense dtype.
    const DType to = quantize                 ? *plan.dense_quant
                     : !dtype_is_float(dtype) ? dtype
                     : plan.exact.count(name) ? DType::f32
                                              : m.dense_dtype;
    PackDenseTensor t{name, to, e.shape, out.begin_tensor(), 0};
    if (quantize) write_quantized_dense(out, t, reader, report);
    else write_plain_dense(out, t, reader, report);
    m.dense.push_back(std::move(t));
  }
  out.finish(m);
}

// ple.<dtype>.bin: the header page, then each n-gram table (its shards concatenated by row,
// tables in name order) at a 4096-aligned offset, row r at offset + r * row_stride with zero
// padding, one checksum per chunk of rows (format/pack.h, PackRowTable); the file is padded to
// a multiple of 4096. Values are converted to the pack's dense dtype. Read and written a few
// MB at a time, so a table of any size streams through bounded memory.
void write_ple_tables(const ConvertPlan& plan, CheckpointReader& reader, PackManifest& m, const fs::path& dir,
                      ConvertReporter& report) {
  if (plan.tables.empty()) return;
  const Checkpoint& ck = reader.checkpoint();
  PackPleInfo ple;
  ple.dtype = m.dense_dtype;
  ple.file = str("ple.", dtype_name(ple.dtype), ".bin");
  const std::string where = ck.dir().string();
  uint64_t at = kPackHeaderBytes;
  for (const auto& [prefix, parts_in] : plan.tables) {
    auto parts = parts_in;
    std::sort(parts.begin(), parts.end());
    int64_t rows = 0, cols = -1;
    for (size_t i = 0; i < parts.size(); ++i) {
      const auto& [shard, name] = parts[i];
      const SafetensorsEntry& e = ck.entry(name);
      SLUICE_CHECK(shard == static_cast<int64_t>(i) && (parts.size() == 1 || ngram_table_tensor(name)->sharded),
                   Status::corrupt, where, ": n-gram table ", prefix, " has tensors that are not one whole table or shards ",
                   "0, 1, ... (", name, ")");
      SLUICE_CHECK(e.shape.size() == 2 && dtype_is_float(e.dtype) && (cols < 0 || e.shape[1] == cols), Status::corrupt, where,
                   ": tensor ", name, " is ", dtype_name(e.dtype), " with ", e.shape.size(), " dimensions; an n-gram table ",
                   "shard is a float [rows, ", cols < 0 ? std::string("dim") : std::to_string(cols), "] matrix");
      cols = e.shape[1];
      rows += e.shape[0];
    }
    PackRowTable t = pack_row_table_layout(rows, cols, ple.dtype, at);
    t.prefix = prefix;
    for (const auto& part : parts) t.sources.push_back(part.second);
    at = (t.row_offset(t.rows) + kPackRecordAlign - 1) / kPackRecordAlign * kPackRecordAlign;
    ple.tables.push_back(std::move(t));
  }
  ple.file_bytes = at;

  std::error_code ec;
  fs::remove(dir / ple.file, ec);  // a resumed convert writing it again
  OutFile out(dir / ple.file, false);
  const std::vector<uint8_t> header = pack_file_header(kPackPleRole, ple.file_bytes - kPackHeaderBytes);
  out.write(header.data(), header.size());
  XXH3_state_t* st = XXH3_createState();
  SLUICE_CHECK(st, Status::out_of_memory, "convert: XXH3 state");
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> guard(st, XXH3_freeState);
  constexpr uint64_t kPieceBytes = uint64_t{4} << 20;  // input bytes per read
  std::vector<uint8_t> in, row_out, zeros(kPackRecordAlign, 0);
  for (PackRowTable& t : ple.tables) {
    const uint64_t pad = t.offset - out.size();  // the previous table's tail up to this page
    for (uint64_t z = 0; z < pad; z += kPackRecordAlign) out.write(zeros.data(), std::min<uint64_t>(kPackRecordAlign, pad - z));
    SLUICE_ASSERT(out.size() == t.offset);
    int64_t row = 0;  // rows of the table written
    XXH3_64bits_reset(st);
    for (const std::string& name : t.sources) {
      const SafetensorsEntry& e = ck.entry(name);
      const uint64_t in_row = static_cast<uint64_t>(t.cols) * dtype_size(e.dtype);
      const int64_t piece_rows = static_cast<int64_t>(std::max<uint64_t>(1, kPieceBytes / in_row));
      for (int64_t r0 = 0; r0 < e.shape[0]; r0 += piece_rows) {
        report.check_cancel();
        const int64_t nr = std::min(piece_rows, e.shape[0] - r0);
        in.resize(static_cast<size_t>(nr * in_row));
        reader.read(name, static_cast<uint64_t>(r0) * in_row, in.data(), in.size());
        row_out.assign(static_cast<size_t>(nr) * t.row_stride, 0);
        for (int64_t i = 0; i < nr; ++i)
          dtype_convert_row(in.data() + i * in_row, e.dtype, row_out.data() + i * t.row_stride, ple.dtype, t.cols);
        // Hash by chunk: a chunk boundary may fall inside this piece.
        for (int64_t i = 0; i < nr; ++i, ++row) {
          XXH3_64bits_update(st, row_out.data() + i * t.row_stride, t.row_stride);
          if ((row + 1) % t.chunk_rows == 0 || row + 1 == t.rows) {
            t.checksums.push_back(XXH3_64bits_digest(st));
            XXH3_64bits_reset(st);
          }
        }
        out.write(row_out.data(), row_out.size());
        report.advance("n-gram tables", in.size());
      }
    }
    SLUICE_ASSERT(row == t.rows && static_cast<int64_t>(t.checksums.size()) == t.n_chunks());
  }
  const uint64_t tail = ple.file_bytes - out.size();
  for (uint64_t z = 0; z < tail; z += kPackRecordAlign) out.write(zeros.data(), std::min<uint64_t>(kPackRecordAlign, tail - z));
  out.finish();
  LOG_INFO("convert: ", ple.tables.size(), " n-gram tables in ", ple.file, " (", ple.file_bytes, " bytes)");
  m.ple = std::move(ple);
}

}  // namespace sluice
