// The pack manifest's parser and validation (pack.h): hostile-input code, every number is
// bounded and every offset checked before use, nothing allocated from a size the manifest
// states.
#include "format/pack.h"


#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include "core/bits.h"
#include "core/error.h"
#include "core/paths.h"
#include "core/quant.h"
#include "format/file_io.h"
#include "format/json_file.h"


namespace sluice {

using json = nlohmann::json;
namespace fs = std::filesystem;

// ---- manifest parsing ----

namespace {

bool plain_file_name(const std::string& s) {
  return !s.empty() && s.size() <= 255 && s.find('/') == std::string::npos && s.find('\\') == std::string::npos &&
         s.find('\0') == std::string::npos && s != "." && s != ".." && s.find("..") == std::string::npos;
}


// Field access with errors "FILE: path.to.field: what".
class Fields {
 public:
  explicit Fields(std::string_view file) : file_(file) {}

  [[noreturn]] void bad(const std::string& path, const std::string& what, Status s = Status::corrupt) const {
    fail(s, file_, ": ", path, ": ", what);
  }
  const json& member(const json& obj, const std::string& path, const char* key) const {
    SLUICE_CHECK(obj.is_object(), Status::corrupt, file_, ": ", path, " is not a JSON object");
    auto it = obj.find(key);
    if (it == obj.end()) bad(join(path, key), "missing");
    return *it;
  }
  const json* optional(const json& obj, const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  uint64_t u64(const json& v, const std::string& path, uint64_t max = std::numeric_limits<uint64_t>::max()) const {
    if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)
      bad(path, str("is negative (", v.get<int64_t>(), ")"));
    if (!v.is_number_unsigned()) bad(path, "is not a non-negative integer");
    uint64_t x = v.get<uint64_t>();
    if (x > max) bad(path, str(x, " exceeds the limit of ", max));
    return x;
  }
  int64_t count(const json& v, const std::string& path, int64_t min, int64_t max) const {
    uint64_t x = u64(v, path, static_cast<uint64_t>(max));
    if (static_cast<int64_t>(x) < min) bad(path, str(x, " is below the minimum of ", min));
    return static_cast<int64_t>(x);
  }
  const std::string& string(const json& v, const std::string& path) const {
    if (!v.is_string()) bad(path, "is not a string");
    return v.get_ref<const std::string&>();
  }
  const json& array(const json& v, const std::string& path) const {
    if (!v.is_array()) bad(path, "is not an array");
    return v;
  }
  const json& object(const json& v, const std::string& path) const {
    if (!v.is_object()) bad(path, "is not a JSON object");
    return v;
  }
  uint64_t checksum(const json& v, const std::string& path) const {
    const std::string& s = string(v, path);
    if (s.size() != 16) bad(path, "is not a 16-digit hex checksum");
    uint64_t x = 0;
    for (char c : s) {
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) bad(path, "is not a 16-digit hex checksum");
      x = (x << 4) | static_cast<uint64_t>(d);
    }
    return x;
  }
  static std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

 private:
  std::string_view file_;
};

// A byte range [begin, begin + bytes) with a name, for overlap checks.
struct Range {
  uint64_t begin, bytes;
  std::string name;
};

// Fails when two non-empty ranges overlap.
void check_disjoint(std::vector<Range> ranges, const Fields& f, const std::string& where) {
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  const Range* last = nullptr;
  for (const Range& r : ranges) {
    if (r.bytes == 0) continue;
    if (last && r.begin < last->begin + last->bytes)
      f.bad(where, str(r.name, " [", r.begin, ", ", r.begin + r.bytes, ") overlaps ", last->name, " [", last->begin, ", ",
                       last->begin + last->bytes, ")"));
    if (!last || r.begin + r.bytes > last->begin + last->bytes) last = &r;
  }
}

PackBlock parse_block(const json& v, const Fields& f, const std::string& path, DType kind, int64_t rows,
                      int64_t cols, uint64_t record_bytes) {
  f.object(v, path);
  PackBlock b;
  b.rows = f.count(f.member(v, path, "rows"), path + ".rows", 0, kPackMaxDim);
  b.cols = f.count(f.member(v, path, "cols"), path + ".cols", 0, kPackMaxDim);
  if (b.rows != rows || b.cols != cols)
    f.bad(path, str("is [", b.rows, ", ", b.cols, "] but the experts are [", rows, ", ", cols, "]"));
  b.offset = f.u64(f.member(v, path, "offset"), path + ".offset", kPackMaxRecordBytes);
  b.bytes = f.u64(f.member(v, path, "bytes"), path + ".bytes", kPackMaxRecordBytes);
  b.scale_offset = f.u64(f.member(v, path, "scale_offset"), path + ".scale_offset", kPackMaxRecordBytes);
  b.scale_bytes = f.u64(f.member(v, path, "scale_bytes"), path + ".scale_bytes", kPackMaxRecordBytes);
  auto [want, want_scales] = pack_block_bytes(kind, rows, cols);
  if (b.bytes != want) f.bad(path + ".bytes", str(b.bytes, " but a ", expert_kind_name(kind), " [", rows, ", ", cols, "] block is ", want));
  if (b.scale_bytes != want_scales)
    f.bad(path + ".scale_bytes", str(b.scale_bytes, " but a ", expert_kind_name(kind), " [", rows, ", ", cols, "] block has ", want_scales));
  if (b.offset % kPackBlockAlign || b.scale_offset % kPackBlockAlign)
    f.bad(path, str("offsets ", b.offset, " and ", b.scale_offset, " must be multiples of ", kPackBlockAlign));
  // All values are below 2^36 here, so the sums cannot overflow.
  if (b.offset + b.bytes > record_bytes)
    f.bad(path, str("values [", b.offset, ", ", b.offset + b.bytes, ") run past the end of the ", record_bytes, "-byte record"));
  if (b.scale_offset + b.scale_bytes > record_bytes)
    f.bad(path, str("scales [", b.scale_offset, ", ", b.scale_offset + b.scale_bytes, ") run past the end of the ",
                    record_bytes, "-byte record"));
  return b;
}

// An expert bias (version 4): n f32 values inside the record.
PackBias parse_bias(const json& v, const Fields& f, const std::string& path, int64_t n, uint64_t record_bytes) {
  f.object(v, path);
  PackBias b;
  b.n = f.count(f.member(v, path, "n"), path + ".n", 0, kPackMaxDim);
  if (b.n != n) f.bad(path + ".n", str(b.n, " but the experts need ", n, " values"));
  b.offset = f.u64(f.member(v, path, "offset"), path + ".offset", kPackMaxRecordBytes);
  b.bytes = f.u64(f.member(v, path, "bytes"), path + ".bytes", kPackMaxRecordBytes);
  if (b.bytes != static_cast<uint64_t>(n) * sizeof(float)) f.bad(path + ".bytes", str(b.bytes, " but ", n, " f32 values are ", n * 4));
  if (b.offset % kPackBlockAlign) f.bad(path + ".offset", str(b.offset, " is not a multiple of ", kPackBlockAlign));
  if (b.offset + b.bytes > record_bytes)
    f.bad(path, str("values [", b.offset, ", ", b.offset + b.bytes, ") run past the end of the ", record_bytes, "-byte record"));
  return b;
}

PackKindInfo parse_kind(const std::string& name, const json& v, const Fields& f, const PackManifest& m) {
  const std::string path = "kinds." + name;
  f.object(v, path);
  std::optional<DType> kind = expert_kind_from_name(name);
  if (!kind) f.bad(path, "unknown expert kind (kinds: bf16, int8, q4, q2, mxfp4)", Status::unsupported);
  PackKindInfo info;
  info.kind = *kind;
  const std::string& dtype = f.string(f.member(v, path, "dtype"), path + ".dtype");
  std::optional<DType> dt = dtype_from_name(dtype);
  if (!dt || *dt != *kind)
    f.bad(path + ".dtype", str("'", dtype, "' does not fit expert kind ", name, " (want ", dtype_name(*kind), ")"));
  info.file = f.string(f.member(v, path, "file"), path + ".file");
  if (!plain_file_name(info.file) || info.file == kPackManifestName || info.file == kPackDenseName)
    f.bad(path + ".file", str("'", info.file, "' is not a plain data file name in the pack directory"));
  info.record_bytes = f.u64(f.member(v, path, "record_bytes"), path + ".record_bytes", kPackMaxRecordBytes);
  info.record_stride = f.u64(f.member(v, path, "record_stride"), path + ".record_stride", kPackMaxRecordBytes);
  if (info.record_bytes == 0) f.bad(path + ".record_bytes", "is 0");
  if (info.record_stride < info.record_bytes)
    f.bad(path + ".record_stride", str(info.record_stride, " is smaller than a record (", info.record_bytes, " bytes)"));
  if (info.record_stride % kPackRecordAlign)
    f.bad(path + ".record_stride", str(info.record_stride, " is not a multiple of ", kPackRecordAlign));
  uint64_t file_bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(m.n_records()), info.record_stride, &file_bytes) ||
      file_bytes > kPackMaxFileBytes)
    f.bad(path, str(m.n_records(), " records of ", info.record_stride, " bytes exceed the limit of ", kPackMaxFileBytes, " bytes"));
  info.gate = parse_block(f.member(v, path, "gate"), f, path + ".gate", *kind, m.n_ff, m.n_embd, info.record_bytes);
  info.up = parse_block(f.member(v, path, "up"), f, path + ".up", *kind, m.n_ff, m.n_embd, info.record_bytes);
  info.down = parse_block(f.member(v, path, "down"), f, path + ".down", *kind, m.n_embd, m.n_ff, info.record_bytes);
  const bool biases = v.contains("gate_bias") || v.contains("up_bias") || v.contains("down_bias");
  if (biases) {  // version 4: all three
    if (m.version < 4) f.bad(path, str("has expert biases, which need pack format version 4 (the manifest says ", m.version, ")"));
    info.gate_bias = parse_bias(f.member(v, path, "gate_bias"), f, path + ".gate_bias", m.n_ff, info.record_bytes);
    info.up_bias = parse_bias(f.member(v, path, "up_bias"), f, path + ".up_bias", m.n_ff, info.record_bytes);
    info.down_bias = parse_bias(f.member(v, path, "down_bias"), f, path + ".down_bias", m.n_embd, info.record_bytes);
  }
  std::vector<Range> ranges;
  for (const PackRange& r : pack_kind_ranges(info)) ranges.push_back({r.offset, r.bytes, r.name});
  check_disjoint(ranges, f, path);
  const json& sums = f.array(f.member(v, path, "checksums"), path + ".checksums");
  if (static_cast<int64_t>(sums.size()) != m.n_records())
    f.bad(path + ".checksums", str("has ", sums.size(), " entries for ", m.n_records(), " records (", m.moe_layers.size(),
                                   " MoE layers x ", m.n_expert, " experts)"));
  info.checksums.reserve(sums.size());
  for (size_t i = 0; i < sums.size(); ++i) info.checksums.push_back(f.checksum(sums[i], str(path, ".checksums[", i, "]")));
  return info;
}

// A dense tensor entry; `version` decides whether quantized matrices may appear (3).
PackDenseTensor parse_dense_tensor(const json& v, const Fields& f, const std::string& path, DType dense_dtype,
                                   uint64_t file_bytes, int version) {
  f.object(v, path);
  PackDenseTensor t;
  t.name = f.string(f.member(v, path, "name"), path + ".name");
  const std::string where = str(path, " (", t.name.substr(0, 200), ")");
  if (t.name.empty()) f.bad(path + ".name", "is empty");
  const std::string& dtype = f.string(f.member(v, path, "dtype"), where + ".dtype");
  std::optional<DType> dt = dtype_from_name(dtype);
  if (!dt) f.bad(where + ".dtype", str("unknown dtype '", dtype, "'"));
  t.dtype = *dt;
  const bool is_float = t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16;
  const bool quantized = dtype_is_quantized(t.dtype);
  if (quantized && !is_dense_quant_dtype(t.dtype))
    f.bad(where + ".dtype", str(dtype, " does not fit a dense tensor (dense tensors are float, integer, q8 or q4)"));
  if (quantized && version < 3) f.bad(where + ".dtype", str(dtype, " (a quantized dense tensor) needs pack format version 3"));
  // f32 beside a narrower dense dtype: a tensor the family needs unrounded (a router's correction bias).
  if (is_float && t.dtype != dense_dtype && t.dtype != DType::f32)
    f.bad(where + ".dtype", str(dtype, " but the pack's dense dtype is ", dtype_name(dense_dtype)));
  const json& shape = f.array(f.member(v, path, "shape"), where + ".shape");
  if (shape.empty() || shape.size() > 4) f.bad(where + ".shape", str("has ", shape.size(), " dimensions (1 to 4)"));
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t d = f.count(shape[i], str(where, ".shape[", i, "]"), 0, kPackMaxDim);
    t.shape.push_back(d);
    overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel);
  }
  t.offset = f.u64(f.member(v, path, "offset"), where + ".offset", kPackMaxFileBytes);
  t.bytes = f.u64(f.member(v, path, "bytes"), where + ".bytes", kPackMaxFileBytes);
  uint64_t want = 0;
  if (quantized) {
    if (!dense_quantizable_shape(t.shape))
      f.bad(where + ".shape", str("is not a matrix [rows, cols] with cols a positive multiple of 32, as a ", dtype,
                                  " dense tensor must be"));
    // rows, cols <= 2^22: no product below overflows.
    const auto rows = static_cast<uint64_t>(t.shape[0]);
    want = rows * static_cast<uint64_t>(quant_row_bytes(t.dtype, t.shape[1]));
    t.scale_offset = f.u64(f.member(v, where, "scale_offset"), where + ".scale_offset", kPackMaxFileBytes);
    t.scale_bytes = f.u64(f.member(v, where, "scale_bytes"), where + ".scale_bytes", kPackMaxFileBytes);
    const uint64_t want_scales = rows * static_cast<uint64_t>(quant_scale_row_bytes(t.dtype, t.shape[1]));
    if (want_scales != t.scale_bytes) f.bad(where + ".scale_bytes", str(t.scale_bytes, " but shape and dtype need ", want_scales));
    if (t.scale_offset % kPackBlockAlign || t.scale_offset < kPackHeaderBytes)
      f.bad(where + ".scale_offset", str(t.scale_offset, " is not a ", kPackBlockAlign, "-aligned offset after the header page"));
    if (t.scale_offset + t.scale_bytes > file_bytes)
      f.bad(where, str("scales [", t.scale_offset, ", ", t.scale_offset + t.scale_bytes, ") run past the end of ",
                       kPackDenseName, " (", file_bytes, " bytes)"));
  } else if (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &want)) {
    f.bad(where + ".shape", "x dtype overflows 64 bits");
  }
  if (want != t.bytes) f.bad(where + ".bytes", str(t.bytes, " but shape and dtype need ", want));
  if (t.offset % kPackBlockAlign || t.offset < kPackHeaderBytes)
    f.bad(where + ".offset", str(t.offset, " is not a ", kPackBlockAlign, "-aligned offset after the header page"));
  if (t.offset + t.bytes > file_bytes)
    f.bad(where, str("[", t.offset, ", ", t.offset + t.bytes, ") runs past the end of ", kPackDenseName, " (", file_bytes, " bytes)"));
  return t;
}

PackRowTable parse_row_table(const json& v, const Fields& f, const std::string& path, DType dtype, uint64_t file_bytes) {
  f.object(v, path);
  PackRowTable t;
  t.prefix = f.string(f.member(v, path, "prefix"), path + ".prefix");
  if (t.prefix.empty()) f.bad(path + ".prefix", "is empty");
  const json& sources = f.array(f.member(v, path, "sources"), path + ".sources");
  if (sources.empty() || sources.size() > 4096) f.bad(path + ".sources", str("has ", sources.size(), " entries (1 to 4096)"));
  for (size_t i = 0; i < sources.size(); ++i) t.sources.push_back(f.string(sources[i], str(path, ".sources[", i, "]")));
  t.rows = f.count(f.member(v, path, "rows"), path + ".rows", 1, kPackMaxTableRows);
  t.cols = f.count(f.member(v, path, "cols"), path + ".cols", 1, kPackMaxDim);
  t.offset = f.u64(f.member(v, path, "offset"), path + ".offset", kPackMaxFileBytes);
  t.row_stride = f.u64(f.member(v, path, "row_stride"), path + ".row_stride", kPackMaxRecordBytes);
  t.chunk_rows = f.count(f.member(v, path, "chunk_rows"), path + ".chunk_rows", 1, kPackMaxTableRows);
  const uint64_t row_bytes = static_cast<uint64_t>(t.cols) * dtype_size(dtype);  // below 2^25
  if (t.row_stride < row_bytes) f.bad(path + ".row_stride", str(t.row_stride, " is smaller than a row (", row_bytes, " bytes)"));
  const bool pow2 = t.row_stride <= kPackRecordAlign && (t.row_stride & (t.row_stride - 1)) == 0;
  if (!pow2 && t.row_stride % kPackRecordAlign)
    f.bad(path + ".row_stride", str(t.row_stride, " is neither a power of two up to ", kPackRecordAlign, " nor a multiple of it"));
  if (t.offset < kPackHeaderBytes || t.offset % kPackRecordAlign)
    f.bad(path + ".offset", str(t.offset, " is not a ", kPackRecordAlign, "-aligned offset after the header page"));
  uint64_t bytes = 0, chunk = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(t.rows), t.row_stride, &bytes) || bytes > kPackMaxFileBytes ||
      t.offset + bytes > file_bytes)
    f.bad(path, str(t.rows, " rows of ", t.row_stride, " bytes from offset ", t.offset, " run past the end of the file (",
                    file_bytes, " bytes)"));
  if (__builtin_mul_overflow(static_cast<uint64_t>(t.chunk_rows), t.row_stride, &chunk) || chunk % kPackRecordAlign)
    f.bad(path + ".chunk_rows", str(t.chunk_rows, " rows of ", t.row_stride, " bytes are not a multiple of ", kPackRecordAlign,
                                    " bytes (chunks start page-aligned)"));
  if (t.n_chunks() > kPackMaxTableChunks) f.bad(path + ".chunk_rows", str("gives ", t.n_chunks(), " chunks (at most ", kPackMaxTableChunks, ")"));
  const json& sums = f.array(f.member(v, path, "checksums"), path + ".checksums");
  if (static_cast<int64_t>(sums.size()) != t.n_chunks())
    f.bad(path + ".checksums", str("has ", sums.size(), " entries for ", t.n_chunks(), " chunks of ", t.chunk_rows, " rows"));
  for (size_t i = 0; i < sums.size(); ++i) t.checksums.push_back(f.checksum(sums[i], str(path, ".checksums[", i, "]")));
  return t;
}

PackPleInfo parse_ple(const json& v, const Fields& f) {
  f.object(v, "ple");
  PackPleInfo p;
  p.file = f.string(f.member(v, "ple", "file"), "ple.file");
  if (!plain_file_name(p.file) || p.file == kPackManifestName || p.file == kPackDenseName)
    f.bad("ple.file", str("'", p.file, "' is not a plain data file name in the pack directory"));
  const std::string& dt = f.string(f.member(v, "ple", "dtype"), "ple.dtype");
  std::optional<DType> dtype = dtype_from_name(dt);
  if (!dtype || !(*dtype == DType::f32 || *dtype == DType::bf16 || *dtype == DType::f16))
    f.bad("ple.dtype", str("'", dt, "' does not fit n-gram tables (f32, bf16 or f16)"));
  p.dtype = *dtype;
  p.file_bytes = f.u64(f.member(v, "ple", "bytes"), "ple.bytes", kPackMaxFileBytes);
  if (p.file_bytes < kPackHeaderBytes || p.file_bytes % kPackRecordAlign)
    f.bad("ple.bytes", str(p.file_bytes, " is not a multiple of ", kPackRecordAlign, " holding the header page"));
  const json& tables = f.array(f.member(v, "ple", "tables"), "ple.tables");
  if (tables.empty() || tables.size() > static_cast<size_t>(kPackMaxLayers))
    f.bad("ple.tables", str("has ", tables.size(), " entries (1 to ", kPackMaxLayers, ")"));
  std::set<std::string> prefixes;
  std::vector<Range> ranges;
  for (size_t i = 0; i < tables.size(); ++i) {
    const std::string path = str("ple.tables[", i, "]");
    PackRowTable t = parse_row_table(tables[i], f, path, p.dtype, p.file_bytes);
    if (!prefixes.insert(t.prefix).second) f.bad(path + ".prefix", str("'", t.prefix.substr(0, 200), "' is repeated"));
    if (!p.tables.empty() && t.offset <= p.tables.back().offset) f.bad(path + ".offset", "tables must ascend");
    ranges.push_back({t.offset, static_cast<uint64_t>(t.rows) * t.row_stride, path});
    p.tables.push_back(std::move(t));
  }
  check_disjoint(std::move(ranges), f, "ple.tables");
  return p;
}

}  // namespace

PackRowTable pack_row_table_layout(int64_t rows, int64_t cols, DType dtype, uint64_t offset) {
  PackRowTable t;
  t.rows = rows;
  t.cols = cols;
  t.offset = offset;
  const uint64_t row_bytes = static_cast<uint64_t>(cols) * dtype_size(dtype);
  if (row_bytes <= kPackRecordAlign) {
    t.row_stride = 1;
    while (t.row_stride < row_bytes) t.row_stride *= 2;
  } else {
    t.row_stride = round_up(row_bytes, kPackRecordAlign);
  }
  // A chunk is one page (or one row) while that keeps the count at kPleTargetChunks; larger
  // tables double it until it does. A one-page chunk is what an on-demand read fetches
  // anyway, so every row read of such a table is verified at no extra cost.
  uint64_t chunk = std::max<uint64_t>(kPackRecordAlign, t.row_stride);
  while ((static_cast<uint64_t>(rows) * t.row_stride + chunk - 1) / chunk > static_cast<uint64_t>(kPleTargetChunks)) chunk *= 2;
  t.chunk_rows = static_cast<int64_t>(chunk / t.row_stride);
  return t;
}

PackManifest parse_pack_manifest(std::string_view text, std::string_view file_name) {
  json root;
  try {
    // The callback bounds nesting, so neither the parser nor the destructor can recurse deep.
    root = json::parse(text.begin(), text.end(), [&](int depth, json::parse_event_t, json&) {
      if (depth > kPackMaxJsonDepth) fail(Status::corrupt, file_name, ": JSON nested deeper than ", kPackMaxJsonDepth, " levels");
      return true;
    });
  } catch (const json::exception& e) {
    fail(Status::corrupt, file_name, ": invalid JSON (truncated?): ", describe_json_error(e, text));
  }
  const Fields f(file_name);
  SLUICE_CHECK(root.is_object(), Status::corrupt, file_name, ": not a JSON object (not a sluice pack manifest)");
  PackManifest m;
  const json* format = f.optional(root, "format");
  if (!format || !format->is_string() || format->get_ref<const std::string&>() != kPackFormatName)
    fail(Status::corrupt, file_name, ": \"format\" is not \"", kPackFormatName, "\" (not a sluice pack manifest)");
  const json& version = f.member(root, "", "version");
  if (!version.is_number_integer()) f.bad("version", "is not an integer");
  if (version < kPackMinFormatVersion || version > kPackFormatVersion)
    fail(Status::unsupported, file_name, ": pack format version ", version.dump(), "; this sluice reads versions ",
         kPackMinFormatVersion, " to ", kPackFormatVersion, " (convert the checkpoint again)");
  m.version = version.get<int>();
  m.family = f.string(f.member(root, "", "family"), "family");
  if (m.family.empty()) f.bad("family", "is empty");
  m.config = f.object(f.member(root, "", "config"), "config");

  std::set<std::string> files = {kPackManifestName, kPackDenseName};
  const json& tok = f.array(f.member(root, "", "tokenizer_files"), "tokenizer_files");
  for (size_t i = 0; i < tok.size(); ++i) {
    const std::string& name = f.string(tok[i], str("tokenizer_files[", i, "]"));
    if (!plain_file_name(name) || !files.insert(name).second)
      f.bad(str("tokenizer_files[", i, "]"), str("'", name, "' is not a distinct plain file name in the pack directory"));
    m.tokenizer_files.push_back(name);
  }
  if (const json* sums = f.optional(root, "tokenizer_checksums")) {
    f.object(*sums, "tokenizer_checksums");
    for (auto it = sums->begin(); it != sums->end(); ++it) {
      if (std::find(m.tokenizer_files.begin(), m.tokenizer_files.end(), it.key()) == m.tokenizer_files.end())
        f.bad("tokenizer_checksums", str("names '", it.key().substr(0, 200), "', which tokenizer_files does not list"));
      m.tokenizer_checksums[it.key()] = f.checksum(*it, "tokenizer_checksums." + it.key().substr(0, 200));
    }
    for (const std::string& name : m.tokenizer_files)
      if (!m.tokenizer_checksums.count(name)) f.bad("tokenizer_checksums", str("has no checksum of '", name, "'"));
  }
  if (const json* sum = f.optional(root, "settings_checksum")) m.settings_checksum = f.checksum(*sum, "settings_checksum");

  // Experts first: the kinds' checks need n_expert and the layer count.
  // Version 2: a model without routed experts has none (layers empty, sizes 0, no kinds).
  const json& ex = f.object(f.member(root, "", "experts"), "experts");
  const json& layers = f.array(f.member(ex, "experts", "layers"), "experts.layers");
  if (layers.empty() && m.version < 2) f.bad("experts.layers", "is empty (a version-1 pack holds routed experts)");
  const int64_t min_size = layers.empty() ? 0 : 1, max_size = layers.empty() ? 0 : kPackMaxDim;
  m.n_expert = f.count(f.member(ex, "experts", "n_expert"), "experts.n_expert", min_size, layers.empty() ? 0 : kPackMaxExperts);
  m.n_embd = f.count(f.member(ex, "experts", "n_embd"), "experts.n_embd", min_size, max_size);
  m.n_ff = f.count(f.member(ex, "experts", "n_ff"), "experts.n_ff", min_size, max_size);
  if (layers.size() > static_cast<size_t>(kPackMaxLayers)) f.bad("experts.layers", str("has more than ", kPackMaxLayers, " entries"));
  std::set<std::string> prefixes;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string path = str("experts.layers[", i, "]");
    f.object(layers[i], path);
    int64_t layer = f.count(f.member(layers[i], path, "layer"), path + ".layer", 0, kPackMaxLayers);
    if (!m.moe_layers.empty() && layer <= m.moe_layers.back())
      f.bad(path + ".layer", str(layer, " does not follow layer ", m.moe_layers.back(), " (layers must ascend)"));
    const std::string& prefix = f.string(f.member(layers[i], path, "prefix"), path + ".prefix");
    if (prefix.empty() || !prefixes.insert(prefix).second) f.bad(path + ".prefix", "is empty or repeated");
    m.moe_layers.push_back(layer);
    m.expert_prefixes.push_back(prefix);
    m.expert_sources.push_back(f.string(f.member(layers[i], path, "source"), path + ".source"));
  }

  const json& dense = f.object(f.member(root, "", "dense"), "dense");
  const std::string& dense_file = f.string(f.member(dense, "dense", "file"), "dense.file");
  if (dense_file != kPackDenseName) f.bad("dense.file", str("is '", dense_file, "', expected ", kPackDenseName));
  const std::string& ddt = f.string(f.member(dense, "dense", "dtype"), "dense.dtype");
  std::optional<DType> dense_dtype = dtype_from_name(ddt);
  if (!dense_dtype || !(*dense_dtype == DType::f32 || *dense_dtype == DType::bf16 || *dense_dtype == DType::f16))
    f.bad("dense.dtype", str("'", ddt, "' does not fit dense weights (f32, bf16 or f16)"));
  m.dense_dtype = *dense_dtype;
  m.dense_file_bytes = f.u64(f.member(dense, "dense", "bytes"), "dense.bytes", kPackMaxFileBytes);
  if (m.dense_file_bytes < kPackHeaderBytes) f.bad("dense.bytes", str(m.dense_file_bytes, " is smaller than the header page"));
  m.dense_checksum = f.checksum(f.member(dense, "dense", "checksum"), "dense.checksum");
  const json& tensors = f.array(f.member(dense, "dense", "tensors"), "dense.tensors");
  std::set<std::string> names;
  std::vector<Range> ranges;
  for (size_t i = 0; i < tensors.size(); ++i) {
    PackDenseTensor t =
        parse_dense_tensor(tensors[i], f, str("dense.tensors[", i, "]"), m.dense_dtype, m.dense_file_bytes, m.version);
    if (!names.insert(t.name).second) f.bad(str("dense.tensors[", i, "]"), str("tensor '", t.name.substr(0, 200), "' is listed twice"));
    ranges.push_back({t.offset, t.bytes, "tensor '" + t.name.substr(0, 200) + "'"});
    if (t.scale_bytes) ranges.push_back({t.scale_offset, t.scale_bytes, "the scales of tensor '" + t.name.substr(0, 200) + "'"});
    m.dense.push_back(std::move(t));
  }
  check_disjoint(std::move(ranges), f, "dense.tensors");

  const json& kinds = f.object(f.member(root, "", "kinds"), "kinds");
  if (kinds.empty() && !m.moe_layers.empty()) f.bad("kinds", "is empty (a pack with routed experts holds at least one kind)");
  if (!kinds.empty() && m.moe_layers.empty()) f.bad("kinds", "lists expert kinds but the pack has no routed experts");
  for (auto it = kinds.begin(); it != kinds.end(); ++it) {
    PackKindInfo info = parse_kind(it.key(), *it, f, m);
    if (!files.insert(info.file).second) f.bad("kinds." + it.key() + ".file", str("'", info.file, "' is used twice"));
    m.kinds[info.kind] = std::move(info);
  }
  if (const json* ple = f.optional(root, "ple")) {
    if (m.version < 2) f.bad("ple", "needs pack format version 2");
    m.ple = parse_ple(*ple, f);
    if (!files.insert(m.ple->file).second) f.bad("ple.file", str("'", m.ple->file, "' is used twice"));
  }
  return m;
}

}  // namespace sluice
