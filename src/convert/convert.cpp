// convert_checkpoint: finds the routed experts of a checkpoint by name, validates the
// checkpoint against its family, then writes dense.bin and one experts.<kind>.bin per kind
// in a temporary directory, fsyncs, checks that the result loads, and renames it into place.
// The writing pieces it shares with sluice synth are in pack_writer.{h,cpp}.
#include "convert/convert.h"

#include <fcntl.h>
#include <xxhash.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "convert/pack_writer.h"
#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "format/checkpoint.h"
#include "format/file_io.h"
#include "format/json_file.h"
#include "models/load.h"
#include "models/ple.h"
#include "models/registry.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;


// Where one projection of one expert lies in the checkpoint: rows [rows, cols] of the pack's
// block (out features, in features). Per-expert and fused layouts: one contiguous byte range
// of those rows. gpt_oss: the expert's whole stored matrix [in, out] (gate and up columns
// interleaved), whose columns are the rows. gpt_oss_mxfp4: MXFP4 rows (gate and up rows
// interleaved), their e8m0 scales in a tensor of their own.
struct SourceBlock {
  int fd = -1;
  std::string name;        // tensor, for messages
  uint64_t offset = 0;     // file offset of row 0 (gpt_oss: of the expert's matrix)
  DType dtype = DType::f32;  // of the stored values (mxfp4 for gpt_oss_mxfp4)
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
  uint64_t read(const SourceBlock& s, int proj, int64_t r0, int64_t r1, const Checkpoint& ck) {
    r0_ = r0;
    tile_n_ = 0;
    const std::string where = str(ck.file_of(s.name).path().string(), ": tensor ", s.name);
    const size_t esz = dtype_size(s.dtype);
    switch (s.layout) {
      case ExpertLayout::per_expert:
      case ExpertLayout::fused: {
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
  std::vector<float> tile_, span_;  // fill_tile's block rows [tile_n_, cols], kSpanRows input rows' spans
  int tile_proj_ = -1;
  int64_t tile_r0_ = 0, tile_n_ = 0;
};


void check_cancel(const ConvertOptions& opt) {
  if (opt.cancel && opt.cancel->load()) fail(Status::io, "convert interrupted; nothing was written to the output");
}

// The routed expert layers must be loaded by the family with exactly the pack's expert
// tensors; a dry run of the family loader over the checkpoint (which maps but does not read
// the weights) checks config, shapes and that every tensor is used, before anything is written.
// Returns the tensors the family reads only as matrices (WeightLoader::take_matrix): the ones
// `--dense int8|q4` may quantize.
std::set<std::string> validate_against_family(const nlohmann::json& config, const Family& family, const fs::path& hf_dir) {
  auto backend = make_cpu_backend();
  CheckpointSource source(Checkpoint::open(hf_dir), /*dry_run=*/true);
  family.load(config, source, *backend);
  return source.matrices();
}

// One dense matrix quantized row by row (core/quant.h) in pieces of about 4M values:
// the values go to dense.bin as they are made, the scales (1/16 of the values for q4, 4
// bytes a row for int8) are kept and written after them, 64-byte aligned.
void write_quantized_dense(DenseFileWriter& out, PackDenseTensor& t, DType from, int fd, uint64_t file_offset,
                           const std::string& where, const ConvertOptions& opt,
                           const std::function<void(uint64_t)>& progress) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const DType q = t.dtype;
  const size_t in_row = static_cast<size_t>(cols) * dtype_size(from);
  const int64_t row_bytes = quant_row_bytes(q, cols), scale_row_bytes = quant_scale_row_bytes(q, cols);
  const int64_t piece_rows = std::max<int64_t>(1, (int64_t{4} << 20) / cols);
  std::vector<uint8_t> in, values, scales(static_cast<size_t>(rows * scale_row_bytes));
  for (int64_t r0 = 0; r0 < rows; r0 += piece_rows) {
    check_cancel(opt);
    const int64_t nr = std::min(piece_rows, rows - r0);
    in.resize(static_cast<size_t>(nr) * in_row);
    values.resize(static_cast<size_t>(nr * row_bytes));
    pread_all(fd, in.data(), in.size(), file_offset + static_cast<uint64_t>(r0) * in_row, where);
    std::atomic<int64_t> bad_row{-1};
    ThreadPool::global().parallel_for(nr, 16, [&](int64_t i0, int64_t i1) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t i = i0; i < i1; ++i) {
        dtype_row_to_f32(in.data() + static_cast<size_t>(i) * in_row, from, cols, row.data());
        if (!quantize_row(q, row.data(), cols, values.data() + i * row_bytes,
                          scales.data() + (r0 + i) * scale_row_bytes))
          bad_row = r0 + i;
      }
    });
    if (bad_row >= 0)
      fail(Status::corrupt, where, " row ", bad_row.load(), " holds a NaN or an infinity, or values beyond the f16 scale ",
           "range (cannot quantize to ", expert_kind_name(q), "; convert with --dense bf16 or f32)");
    out.write(values.data(), values.size());
    t.bytes += values.size();
    progress(in.size());
  }
  t.scale_offset = out.begin_tensor();
  out.write(scales.data(), scales.size());
  t.scale_bytes = scales.size();
}

// ple.<dtype>.bin: the header page, then each n-gram table (its shards concatenated by row,
// tables in name order) at a 4096-aligned offset, row r at offset + r * row_stride with zero
// padding, one checksum per chunk of rows (format/pack.h, PackRowTable); the file is padded to
// a multiple of 4096. Values are converted to the pack's dense dtype. Read and written a few
// MB at a time, so a table of any size streams through bounded memory. Returns the file size.
uint64_t write_ple_tables(const Checkpoint& ck, const std::map<std::string, std::vector<std::pair<int64_t, std::string>>>& tables,
                          PackManifest& m, const fs::path& dir, const ConvertOptions& opt,
                          const std::function<void(uint64_t)>& progress) {
  PackPleInfo ple;
  ple.dtype = m.dense_dtype;
  ple.file = str("ple.", dtype_name(ple.dtype), ".bin");
  const std::string where = ck.dir().string();
  uint64_t at = kPackHeaderBytes;
  for (const auto& [prefix, parts_in] : tables) {
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
      const int fd = ::open(ck.file_of(name).path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) fail(Status::io, ck.file_of(name).path().string(), ": cannot open: ", errno_text(errno));
      struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
      } closer{fd};
      const uint64_t base = ck.file_of(name).data_offset() + e.begin;
      for (int64_t r0 = 0; r0 < e.shape[0]; r0 += piece_rows) {
        check_cancel(opt);
        const int64_t nr = std::min(piece_rows, e.shape[0] - r0);
        in.resize(static_cast<size_t>(nr * in_row));
        pread_all(fd, in.data(), in.size(), base + static_cast<uint64_t>(r0) * in_row, str(where, ": tensor ", name));
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
        progress(in.size());
      }
    }
    SLUICE_ASSERT(row == t.rows && static_cast<int64_t>(t.checksums.size()) == t.n_chunks());
  }
  const uint64_t tail = ple.file_bytes - out.size();
  for (uint64_t z = 0; z < tail; z += kPackRecordAlign) out.write(zeros.data(), std::min<uint64_t>(kPackRecordAlign, tail - z));
  out.finish();
  LOG_INFO("convert: ", ple.tables.size(), " n-gram tables in ", ple.file, " (", ple.file_bytes, " bytes)");
  m.ple = std::move(ple);
  return m.ple->file_bytes;
}

}  // namespace

ConvertSummary convert_checkpoint(const fs::path& hf_dir, const fs::path& out_arg, const ConvertOptions& opt) {
  const auto t_start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t_start).count(); };
  SLUICE_CHECK(!opt.kinds.empty(), Status::invalid_argument, "convert: no expert kinds to write");

  // 1. The checkpoint and its family: fail before anything is written.
  std::error_code ec;
  SLUICE_CHECK(fs::is_directory(hf_dir, ec), Status::not_found, hf_dir.string(), ": no such checkpoint directory (it ",
               path_kind_text(hf_dir), ")");
  SLUICE_CHECK(!Pack::is_pack(hf_dir), Status::invalid_argument, hf_dir.string(),
               " is already a sluice pack (convert reads an HF checkpoint directory)");
  const nlohmann::json config = read_json_file(hf_dir / "config.json");
  const Family& family = find_family(config);
  const std::set<std::string> matrices = validate_against_family(config, family, hf_dir);
  Checkpoint ck = Checkpoint::open(hf_dir);
  // What stays out of dense.bin: the vision tower of a multimodal checkpoint (left out of the
  // pack), the PLE n-gram tables (their own row-addressable file), the routed experts.
  std::set<std::string> left_out;
  std::map<std::string, std::vector<std::pair<int64_t, std::string>>> tables;  // table -> (shard, tensor)
  std::vector<TensorDecl> decls;
  for (const std::string& name : ck.names()) {
    if (family.in_tower(name)) {
      left_out.insert(name);
      continue;
    }
    if (auto t = ngram_table_tensor(name)) {
      tables[t->table].push_back({t->shard, name});
      continue;
    }
    decls.push_back({name, ck.entry(name).dtype, ck.entry(name).shape});
  }
  if (!left_out.empty())
    LOG_INFO("convert: ", family.model_type, ": leaving out what the text model never reads (", left_out.size(),
             " tensors under ", family.towers_text(), "); the pack holds the text model");
  std::set<std::string> expert_names;
  std::vector<ExpertLayer> layers = find_expert_layers(decls, ck.dir().string(), expert_names, family.fused_experts, true);
  if (layers.empty()) LOG_INFO("convert: ", family.model_type, ": no routed experts; the pack holds dense weights only");

  // 2. The output location.
  PackStaging staging(out_arg, opt.force, "convert");
  const fs::path& tmp_dir = staging.dir();

  // 3. The manifest skeleton.
  std::vector<DType> kinds = layers.empty() ? std::vector<DType>{} : opt.kinds;
  std::sort(kinds.begin(), kinds.end());
  PackManifest m;
  m.family = std::string(family.model_type);
  m.config = config;
  pack_manifest_set_experts(m, layers, kinds);
  std::vector<std::string> dense_names;
  bool all_bf16 = true;
  uint64_t bytes_total = 0;
  for (const std::string& name : ck.names()) {
    const SafetensorsEntry& e = ck.entry(name);
    bytes_total += e.end - e.begin;
    if (expert_names.count(name) || left_out.count(name) || ngram_table_tensor(name)) continue;
    dense_names.push_back(name);
    if (dtype_is_float(e.dtype) && e.dtype != DType::bf16) all_bf16 = false;
  }
  const std::optional<DType> dense_quant =
      opt.dense_dtype && dtype_is_quantized(*opt.dense_dtype) ? opt.dense_dtype : std::nullopt;
  m.dense_dtype = dense_quant ? (all_bf16 ? DType::bf16 : DType::f32) : opt.dense_dtype.value_or(all_bf16 ? DType::bf16 : DType::f32);
  SLUICE_CHECK(m.dense_dtype == DType::f32 || m.dense_dtype == DType::bf16, Status::invalid_argument,
               "convert: dense dtype must be f32, bf16, int8 or q4");
  SLUICE_CHECK(!dense_quant || is_dense_quant_dtype(*dense_quant), Status::invalid_argument,
               "convert: dense dtype must be f32, bf16, int8 or q4");

  // Open file descriptors of the checkpoint's files (reads bypass the mappings).
  std::map<fs::path, int> fds;
  struct FdCloser {
    std::map<fs::path, int>& fds;
    ~FdCloser() {
      for (auto& [p, fd] : fds) ::close(fd);
    }
  } closer{fds};
  auto fd_of = [&](const std::string& tensor) {
    const fs::path& p = ck.file_of(tensor).path();
    auto it = fds.find(p);
    if (it != fds.end()) return it->second;
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(Status::io, p.string(), ": cannot open: ", errno_text(errno));
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    fds[p] = fd;
    return fd;
  };
  auto file_offset = [&](const std::string& tensor) { return ck.file_of(tensor).data_offset() + ck.entry(tensor).begin; };

  ConvertProgress prog;
  prog.records_total = m.n_records();
  prog.bytes_total = bytes_total;
  auto report = [&](std::string_view stage) {
    prog.stage = stage;
    prog.seconds = elapsed();
    if (opt.progress) opt.progress(prog);
  };

  // 4. dense.bin: tensors in checkpoint file order, converted in chunks.
  std::sort(dense_names.begin(), dense_names.end(), [&](const std::string& a, const std::string& b) {
    const fs::path &fa = ck.file_of(a).path(), &fb = ck.file_of(b).path();
    return fa != fb ? fa < fb : ck.entry(a).begin < ck.entry(b).begin;
  });
  uint64_t bytes_out = 0;
  {
    DenseFileWriter out(tmp_dir / kPackDenseName);
    constexpr size_t kChunkElems = size_t{4} << 20;
    std::vector<uint8_t> in_buf, out_buf;
    for (const std::string& name : dense_names) {
      const SafetensorsEntry& e = ck.entry(name);
      SLUICE_CHECK(e.shape.size() >= 1 && e.shape.size() <= 4, Status::unsupported, ck.dir().string(), ": tensor ", name,
                   " has ", e.shape.size(), " dimensions (the pack holds 1 to 4)");
      const bool quantize = dense_quant && dtype_is_float(e.dtype) && matrices.count(name) &&
                            dense_quantizable_shape(e.shape);
      const DType to = quantize ? *dense_quant : dtype_is_float(e.dtype) ? m.dense_dtype : e.dtype;
      PackDenseTensor t{name, to, e.shape, out.begin_tensor(), 0};
      const uint64_t n_elem = (e.end - e.begin) / dtype_size(e.dtype);
      const int fd = fd_of(name);
      if (quantize) {
        write_quantized_dense(out, t, e.dtype, fd, file_offset(name), str(ck.file_of(name).path().string(), ": tensor ", name),
                              opt, [&](uint64_t in_bytes) {
                                prog.bytes_done += in_bytes;
                                report("dense");
                              });
        m.dense.push_back(std::move(t));
        continue;
      }
      for (uint64_t done = 0; done < n_elem;) {
        check_cancel(opt);
        const uint64_t cnt = std::min<uint64_t>(kChunkElems, n_elem - done);
        in_buf.resize(cnt * dtype_size(e.dtype));
        out_buf.resize(cnt * dtype_size(to));
        pread_all(fd, in_buf.data(), in_buf.size(), file_offset(name) + done * dtype_size(e.dtype),
                  str(ck.file_of(name).path().string(), ": tensor ", name));
        dtype_convert_row(in_buf.data(), e.dtype, out_buf.data(), to, static_cast<int64_t>(cnt));
        out.write(out_buf.data(), out_buf.size());
        done += cnt;
        t.bytes += out_buf.size();
        prog.bytes_done += in_buf.size();
        report("dense");
      }
      m.dense.push_back(std::move(t));
    }
    out.finish(m);
    bytes_out += m.dense_file_bytes;
  }

  // 5. The PLE n-gram tables: ple.<dtype>.bin, rows at a fixed stride.
  if (!tables.empty()) {
    bytes_out += write_ple_tables(ck, tables, m, tmp_dir, opt, [&](uint64_t in_bytes) {
      prog.bytes_done += in_bytes;
      report("n-gram tables");
    });
  }

  // 6. Expert records, a batch at a time.
  std::vector<std::unique_ptr<OutFile>> files;
  std::vector<OutFile*> file_ptrs;
  std::vector<PackKindInfo*> infos;
  for (DType k : kinds) {
    PackKindInfo& info = m.kinds[k];
    files.push_back(open_expert_file(tmp_dir, info, m.n_records()));
    file_ptrs.push_back(files.back().get());
    infos.push_back(&info);
  }
  const int64_t E = m.n_expert, d = m.n_embd, ff = m.n_ff;
  const uint64_t src_elem = layers.empty() ? 2 : expert_source_elem_bytes(ck, layers[0]);
  const uint64_t record_in_bytes = static_cast<uint64_t>(3 * ff * d) * std::max<uint64_t>(src_elem, 2);
  // Records per batch: about batch_bytes of checkpoint data, at least one record, and at
  // most four layers' worth (tiny experts would otherwise make one batch of everything).
  const int64_t per_batch = std::clamp<int64_t>(static_cast<int64_t>(opt.batch_bytes / std::max<uint64_t>(1, record_in_bytes)), 1, std::max<int64_t>(1, E * 4));
  RecordBatch batches[2];
  for (RecordBatch& b : batches)
    for (DType k : kinds) b.out.push_back(std::make_unique<AlignedBuffer>(per_batch * m.kinds[k].record_stride));

  // The source block of (record, projection).
  auto source_of = [&](int64_t rec, int p) {
    const ExpertLayer& l = layers[static_cast<size_t>(rec / E)];
    const int64_t e = rec % E;
    SourceBlock s;
    s.rows = p == 2 ? d : ff;
    s.cols = p == 2 ? ff : d;
    switch (l.layout) {
      case ExpertLayout::per_expert:
        s.name = l.names[static_cast<size_t>(e)][p];
        s.offset = file_offset(s.name);
        break;
      case ExpertLayout::fused:
        s.name = l.prefix + (p == 2 ? "down_proj" : "gate_up_proj");
        s.row0 = p == 2 ? e * d : e * 2 * ff + (p == 1 ? ff : 0);
        s.offset = file_offset(s.name) + static_cast<uint64_t>(s.row0 * s.cols) * dtype_size(ck.entry(s.name).dtype);
        break;
      case ExpertLayout::fused_inputs_first:
      case ExpertLayout::gpt_oss:  // the whole [in, out] matrix of expert e
        s.name = l.prefix + (p == 2 ? "down_proj" : "gate_up_proj");
        s.offset = file_offset(s.name) + static_cast<uint64_t>(e * (p == 2 ? d * ff : 2 * ff * d)) *
                                             dtype_size(ck.entry(s.name).dtype);
        break;
      case ExpertLayout::gpt_oss_mxfp4:  // rows of values; the scales at scale_offset
        s.name = l.prefix + (p == 2 ? "down_proj_blocks" : "gate_up_proj_blocks");
        s.row0 = p == 2 ? e * d : e * 2 * ff;  // gate / up rows interleave: source row row0 + 2f (+ 1)
        s.offset = file_offset(s.name) + static_cast<uint64_t>(s.row0 * quant_row_bytes(DType::mxfp4, s.cols));
        s.scale_fd = fd_of(l.prefix + (p == 2 ? "down_proj_scales" : "gate_up_proj_scales"));
        s.scale_offset = file_offset(l.prefix + (p == 2 ? "down_proj_scales" : "gate_up_proj_scales")) +
                         static_cast<uint64_t>(s.row0 * quant_scale_row_bytes(DType::mxfp4, s.cols));
        break;
    }
    s.dtype = l.layout == ExpertLayout::gpt_oss_mxfp4 ? DType::mxfp4 : ck.entry(s.name).dtype;
    s.layout = l.layout;
    s.fd = fd_of(s.name);
    return s;
  };

  // gpt-oss's biases of record rec into every kind's record, as f32: gate f = gate_up_proj_bias
  // [e, 2f], up f = [e, 2f + 1] (interleaved as the weights), down = down_proj_bias[e]; s as
  // the item loop sets it. Returns the bytes read.
  auto write_biases = [&](const SourceBlock& s, int64_t rec, uint8_t* const* recs) -> uint64_t {
    const ExpertLayer& l = layers[static_cast<size_t>(rec / E)];
    const int64_t e = rec % E;
    std::vector<uint8_t> in;
    std::vector<float> gu(static_cast<size_t>(2 * ff)), dn(static_cast<size_t>(d));
    auto load = [&](const std::string& name, int fd, uint64_t offset, int64_t n, float* dst) {
      const DType dt = ck.entry(name).dtype;
      in.resize(static_cast<size_t>(n) * dtype_size(dt));
      pread_all(fd, in.data(), in.size(), offset + static_cast<uint64_t>(e * n) * dtype_size(dt),
                str(ck.file_of(name).path().string(), ": tensor ", name));
      dtype_row_to_f32(in.data(), dt, n, dst);
      return static_cast<uint64_t>(in.size());
    };
    const uint64_t bytes = load(l.prefix + "gate_up_proj_bias", s.fd, s.offset, 2 * ff, gu.data()) +
                           load(l.prefix + "down_proj_bias", s.scale_fd, s.scale_offset, d, dn.data());
    for (size_t k = 0; k < kinds.size(); ++k) {
      const PackKindInfo& info = *infos[k];
      auto* g = reinterpret_cast<float*>(recs[k] + info.gate_bias.offset);
      auto* u = reinterpret_cast<float*>(recs[k] + info.up_bias.offset);
      for (int64_t f = 0; f < ff; ++f) {
        g[f] = gu[static_cast<size_t>(2 * f)];
        u[f] = gu[static_cast<size_t>(2 * f + 1)];
      }
      std::memcpy(recs[k] + info.down_bias.offset, dn.data(), static_cast<size_t>(d) * sizeof(float));
    }
    return bytes;
  };

  {
    RecordBatchWriter writer(file_ptrs, infos);
    ThreadPool& pool = ThreadPool::global();
    constexpr int64_t kChunkBytes = int64_t{1} << 20;  // input bytes per work item
    int which = 0;
    for (int64_t r0 = 0; r0 < m.n_records(); r0 += per_batch, which ^= 1) {
      check_cancel(opt);
      RecordBatch& b = batches[which];
      writer.wait_free(&b);
      b.r0 = r0;
      b.count = std::min(per_batch, m.n_records() - r0);
      // Work items: (record, projection, row chunk); a gpt-oss float matrix is one item (its
      // rows are the stored matrix's columns), the biases one item a record (proj 3).
      struct Item {
        SourceBlock src;
        int64_t rec, row_begin, row_end;
        int proj;
        bool with_up = false;  // proj 0 of an inputs-first float matrix: up's rows from the same read
      };
      std::vector<Item> items;
      for (int64_t i = 0; i < b.count; ++i) {
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
        if (const ExpertLayer& l = layers[static_cast<size_t>((r0 + i) / E)]; l.biases) {
          // The biases (gpt-oss): gate_up_proj_bias [E, 2 n_ff] at fd/offset, down_proj_bias
          // [E, n_embd] at scale_fd/scale_offset (files opened here, on this thread).
          SourceBlock s;
          s.name = l.prefix + "gate_up_proj_bias";
          s.fd = fd_of(s.name);
          s.offset = file_offset(s.name);
          s.scale_fd = fd_of(l.prefix + "down_proj_bias");
          s.scale_offset = file_offset(l.prefix + "down_proj_bias");
          items.push_back({s, r0 + i, 0, 0, 3});
        }
      }
      std::atomic<uint64_t> bytes_in{0};
      pool.parallel_for(static_cast<int64_t>(items.size()), 1, [&](int64_t i0, int64_t i1) {
        ExpertRowReader reader;
        for (int64_t it = i0; it < i1; ++it) {
          const Item& item = items[static_cast<size_t>(it)];
          uint8_t* recs[kExpertKindCount];
          for (size_t k = 0; k < kinds.size(); ++k) recs[k] = b.out[k]->data() + (item.rec - r0) * infos[k]->record_stride;
          if (item.proj == 3) {
            bytes_in += write_biases(item.src, item.rec, recs);
            continue;
          }
          const SourceBlock& s = item.src;
          const uint64_t got = reader.read(s, item.proj, item.row_begin, item.row_end, ck);
          bytes_in += item.with_up ? 2 * got : got;  // gate's read counts half its matrix, up's the other
          const int last_proj = item.with_up ? 1 : item.proj;
          for (int proj = item.proj; proj <= last_proj; ++proj)
          for (int64_t r = item.row_begin; r < item.row_end; ++r) {
            const ExpertRowReader::Row row = reader.row(s, proj, r);
            for (size_t k = 0; k < kinds.size(); ++k) {
              const PackKindInfo& info = *infos[k];
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
                fail(Status::corrupt, ck.dir().string(), ": tensor ", s.name, " row ", reader.source_row(s, proj, r),
                     " holds a NaN or an infinity, or values beyond the f16 scale range (cannot quantize to ",
                     expert_kind_name(info.kind), ")");
            }
          }
        }
      });
      // Zero the record padding and the gaps between blocks (the buffers are reused).
      for (size_t k = 0; k < kinds.size(); ++k)
        for (int64_t i = 0; i < b.count; ++i) pack_record_zero_gaps(*infos[k], b.out[k]->data() + i * infos[k]->record_stride);
      writer.push(&b);
      prog.records_done = r0 + b.count;
      prog.bytes_done += bytes_in.load();
      report("experts");
    }
    writer.drain();
  }
  for (size_t k = 0; k < files.size(); ++k) {
    if (k == 0) LOG_INFO("convert: expert files written with ", files[k]->direct() ? "O_DIRECT" : "buffered", " IO");
    bytes_out += files[k]->size();
    files[k]->finish();
  }

  // 7. Tokenizer files and the manifest (last: a directory without it is not a pack).
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    if (!fs::is_regular_file(hf_dir / name, ec)) continue;
    std::string bytes = read_file_bytes(hf_dir / name, json_file_max, "a tokenizer file");
    write_small_file(tmp_dir / name, bytes.data(), bytes.size());
    m.tokenizer_files.push_back(name);
    m.tokenizer_checksums[name] = XXH3_64bits(bytes.data(), bytes.size());
  }
  const std::string manifest = pack_manifest_to_json(m);
  write_small_file(tmp_dir / kPackManifestName, manifest.data(), manifest.size());
  fsync_dir(tmp_dir);

  // 8. The result must load as its family at every kind; 9. into place.
  check_pack_loads(tmp_dir, kinds, "convert");
  staging.commit();

  ConvertSummary s;
  s.out_dir = staging.out_dir();
  s.family = m.family;
  s.n_records = m.n_records();
  s.bytes_in = bytes_total;
  s.bytes_out = bytes_out;
  s.seconds = elapsed();
  s.dense_dtype = m.dense_dtype;
  s.dense_quant = dense_quant;
  s.n_dense = static_cast<int64_t>(m.dense.size());
  s.n_dense_quantized = std::count_if(m.dense.begin(), m.dense.end(), [](const PackDenseTensor& t) { return dtype_is_quantized(t.dtype); });
  s.kinds = kinds;
  return s;
}

}  // namespace sluice