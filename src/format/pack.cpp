// The pack: manifest parsing and validation (hostile-input code: every number is bounded and
// every offset checked before use, nothing allocated from a size the manifest states), the
// manifest writer, record layouts, the read-only mappings of an open pack, expert views and
// verify.
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

// ---- kinds ----

bool is_expert_kind(DType t) { return std::find(std::begin(kExpertKinds), std::end(kExpertKinds), t) != std::end(kExpertKinds); }

int expert_kind_index(DType k) {
  for (int i = 0; i < kExpertKindCount; ++i)
    if (kExpertKinds[i] == k) return i;
  fail(Status::internal, "dtype ", dtype_name(k), " is not an expert kind");
}

std::string_view expert_kind_name(DType k) {
  if (k == DType::q8) return "int8";
  return is_expert_kind(k) ? dtype_name(k) : "?";
}

std::optional<DType> expert_kind_from_name(std::string_view s) {
  for (DType k : kExpertKinds)
    if (s == expert_kind_name(k)) return k;
  return std::nullopt;
}

std::vector<DType> parse_expert_kinds(std::string_view list) {
  std::vector<DType> kinds;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = std::min(list.find(',', pos), list.size());
    std::string_view item = list.substr(pos, comma - pos);
    std::optional<DType> k = expert_kind_from_name(item);
    SLUICE_CHECK(k, Status::invalid_argument, "unknown expert kind '", item, "' (kinds: bf16, int8, q4, q2)");
    SLUICE_CHECK(std::find(kinds.begin(), kinds.end(), *k) == kinds.end(), Status::invalid_argument,
                 "expert kind '", item, "' is listed twice");
    kinds.push_back(*k);
    pos = comma + 1;
  }
  return kinds;
}

DType default_expert_kind(const std::vector<DType>& available) {
  for (DType k : {DType::q4, DType::q8, DType::bf16, DType::q2})
    if (std::find(available.begin(), available.end(), k) != available.end()) return k;
  fail(Status::invalid_argument, "the pack holds no expert kind");
}

namespace {


// Packed-value and scale bytes of a [rows, cols] block of a kind.
std::pair<uint64_t, uint64_t> block_bytes(DType kind, int64_t rows, int64_t cols) {
  DType t = kind;
  if (t == DType::bf16) return {static_cast<uint64_t>(rows * cols * 2), 0};
  return {static_cast<uint64_t>(rows * quant_row_bytes(t, cols)), static_cast<uint64_t>(rows * quant_scale_row_bytes(t, cols))};
}

}  // namespace

PackKindInfo pack_kind_layout(DType kind, int64_t n_embd, int64_t n_ff) {
  PackKindInfo info;
  info.kind = kind;
  info.file = str("experts.", expert_kind_name(kind), ".bin");
  uint64_t at = 0;
  auto place = [&](PackBlock& b, int64_t rows, int64_t cols) {
    b.rows = rows;
    b.cols = cols;
    auto [bytes, scale_bytes] = block_bytes(kind, rows, cols);
    b.offset = at;
    b.bytes = bytes;
    at = round_up(at + bytes, kPackBlockAlign);
    b.scale_offset = scale_bytes ? at : 0;
    b.scale_bytes = scale_bytes;
    at = round_up(at + scale_bytes, kPackBlockAlign);
  };
  place(info.gate, n_ff, n_embd);
  place(info.up, n_ff, n_embd);
  place(info.down, n_embd, n_ff);
  const PackBlock& last = info.down;
  info.record_bytes = last.scale_bytes ? last.scale_offset + last.scale_bytes : last.offset + last.bytes;
  info.record_stride = round_up(std::max<uint64_t>(info.record_bytes, 1), kPackRecordAlign);
  return info;
}

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
  auto [want, want_scales] = block_bytes(kind, rows, cols);
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

PackKindInfo parse_kind(const std::string& name, const json& v, const Fields& f, const PackManifest& m) {
  const std::string path = "kinds." + name;
  f.object(v, path);
  std::optional<DType> kind = expert_kind_from_name(name);
  if (!kind) f.bad(path, "unknown expert kind (kinds: bf16, int8, q4, q2)", Status::unsupported);
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
  check_disjoint({{info.gate.offset, info.gate.bytes, "gate"}, {info.gate.scale_offset, info.gate.scale_bytes, "gate scales"},
                  {info.up.offset, info.up.bytes, "up"}, {info.up.scale_offset, info.up.scale_bytes, "up scales"},
                  {info.down.offset, info.down.bytes, "down"}, {info.down.scale_offset, info.down.scale_bytes, "down scales"}},
                 f, path);
  const json& sums = f.array(f.member(v, path, "checksums"), path + ".checksums");
  if (static_cast<int64_t>(sums.size()) != m.n_records())
    f.bad(path + ".checksums", str("has ", sums.size(), " entries for ", m.n_records(), " records (", m.moe_layers.size(),
                                   " MoE layers x ", m.n_expert, " experts)"));
  info.checksums.reserve(sums.size());
  for (size_t i = 0; i < sums.size(); ++i) info.checksums.push_back(f.checksum(sums[i], str(path, ".checksums[", i, "]")));
  return info;
}

PackDenseTensor parse_dense_tensor(const json& v, const Fields& f, const std::string& path, DType dense_dtype,
                                   uint64_t file_bytes) {
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
  if (dtype_is_quantized(t.dtype))
    f.bad(where + ".dtype", str(dtype, " does not fit a dense tensor (quantized kinds are for expert records only)"));
  if (is_float && t.dtype != dense_dtype)
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
  if (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &want))
    f.bad(where + ".shape", "x dtype overflows 64 bits");
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
    PackDenseTensor t = parse_dense_tensor(tensors[i], f, str("dense.tensors[", i, "]"), m.dense_dtype, m.dense_file_bytes);
    if (!names.insert(t.name).second) f.bad(str("dense.tensors[", i, "]"), str("tensor '", t.name.substr(0, 200), "' is listed twice"));
    ranges.push_back({t.offset, t.bytes, "tensor '" + t.name.substr(0, 200) + "'"});
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

// ---- manifest writing ----

std::string pack_manifest_to_json(const PackManifest& m) {
  using ojson = nlohmann::ordered_json;
  ojson root;
  root["format"] = kPackFormatName;
  root["version"] = m.needed_version();
  root["family"] = m.family;
  root["config"] = m.config;
  root["tokenizer_files"] = m.tokenizer_files;
  ojson dense;
  dense["file"] = kPackDenseName;
  dense["dtype"] = dtype_name(m.dense_dtype);
  dense["bytes"] = m.dense_file_bytes;
  dense["checksum"] = hex16(m.dense_checksum);
  dense["tensors"] = ojson::array();
  for (const PackDenseTensor& t : m.dense)
    dense["tensors"].push_back(
        {{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"offset", t.offset}, {"bytes", t.bytes}});
  root["dense"] = std::move(dense);
  ojson ex;
  ex["n_expert"] = m.n_expert;
  ex["n_embd"] = m.n_embd;
  ex["n_ff"] = m.n_ff;
  ex["layers"] = ojson::array();
  for (size_t i = 0; i < m.moe_layers.size(); ++i)
    ex["layers"].push_back({{"layer", m.moe_layers[i]}, {"prefix", m.expert_prefixes[i]}, {"source", m.expert_sources[i]}});
  root["experts"] = std::move(ex);
  ojson kinds = ojson::object();
  for (const auto& [kind, k] : m.kinds) {
    auto block = [](const PackBlock& b) {
      return ojson{{"rows", b.rows},   {"cols", b.cols},
                   {"offset", b.offset}, {"bytes", b.bytes},
                   {"scale_offset", b.scale_offset}, {"scale_bytes", b.scale_bytes}};
    };
    ojson j;
    j["dtype"] = dtype_name(kind);
    j["file"] = k.file;
    j["record_bytes"] = k.record_bytes;
    j["record_stride"] = k.record_stride;
    j["gate"] = block(k.gate);
    j["up"] = block(k.up);
    j["down"] = block(k.down);
    j["checksums"] = ojson::array();
    for (uint64_t c : k.checksums) j["checksums"].push_back(hex16(c));
    kinds[std::string(expert_kind_name(kind))] = std::move(j);
  }
  root["kinds"] = std::move(kinds);
  if (m.ple) {
    ojson ple;
    ple["file"] = m.ple->file;
    ple["dtype"] = dtype_name(m.ple->dtype);
    ple["bytes"] = m.ple->file_bytes;
    ple["tables"] = ojson::array();
    for (const PackRowTable& t : m.ple->tables) {
      ojson j;
      j["prefix"] = t.prefix;
      j["sources"] = t.sources;
      j["rows"] = t.rows;
      j["cols"] = t.cols;
      j["offset"] = t.offset;
      j["row_stride"] = t.row_stride;
      j["chunk_rows"] = t.chunk_rows;
      j["checksums"] = ojson::array();
      for (uint64_t c : t.checksums) j["checksums"].push_back(hex16(c));
      ple["tables"].push_back(std::move(j));
    }
    root["ple"] = std::move(ple);
  }
  return root.dump(1) + "\n";
}

std::vector<uint8_t> pack_file_header(std::string_view kind, uint64_t payload_bytes) {
  std::vector<uint8_t> h(kPackHeaderBytes, 0);
  std::memcpy(h.data(), kPackFileMagic, 8);
  const uint32_t version = kPackDataVersion;
  std::memcpy(h.data() + 8, &version, 4);
  std::memcpy(h.data() + 16, kind.data(), std::min<size_t>(kind.size(), 15));
  std::memcpy(h.data() + 32, &payload_bytes, 8);
  return h;
}

// ---- Pack ----

namespace {

struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
};

// Checks a data file's header page against the manifest.
void check_data_header(const uint8_t* h, uint64_t size, const std::string& name, std::string_view kind) {
  SLUICE_CHECK(std::memcmp(h, kPackFileMagic, 8) == 0, Status::corrupt, name, ": bad magic (not a sluice pack data file)");
  uint32_t version;
  std::memcpy(&version, h + 8, 4);
  SLUICE_CHECK(version == kPackDataVersion, Status::unsupported, name, ": pack data version ", version,
               "; this sluice reads version ", kPackDataVersion);
  char got_kind[16] = {};
  std::memcpy(got_kind, h + 16, 15);
  SLUICE_CHECK(kind == got_kind, Status::corrupt, name, ": holds '", std::string(got_kind).substr(0, 15),
               "' data, the manifest expects '", kind, "'");
  uint64_t payload;
  std::memcpy(&payload, h + 32, 8);
  SLUICE_CHECK(payload == size - kPackHeaderBytes, Status::corrupt, name, ": header says ", payload,
               " payload bytes, the file holds ", size - kPackHeaderBytes);
}

// Checks `path`'s size and header against the manifest and, when `map` is set, maps it
// read-only (null otherwise: a streamed kind is read record by record, never mapped).
std::shared_ptr<Mapping> open_data_file(const fs::path& path, uint64_t want_bytes, std::string_view kind, bool map) {
  const std::string name = path.string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) fail(Status::not_found, name, ": no such file (a pack data file the manifest lists)");
    fail(Status::io, name, ": cannot open: ", errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(Status::io, name, ": not a readable regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size != want_bytes) {
    ::close(fd);
    fail(Status::corrupt, name, ": ", size, " bytes but the manifest says ", want_bytes,
         size < want_bytes ? " (truncated?)" : " (trailing bytes?)");
  }
  if (!map) {
    uint8_t h[64] = {};
    ssize_t n = ::pread(fd, h, sizeof h, 0);
    const int err = errno;
    ::close(fd);
    if (n != static_cast<ssize_t>(sizeof h)) fail(Status::io, name, ": cannot read the header: ", n < 0 ? errno_text(err) : "short read");
    check_data_header(h, size, name, kind);
    return nullptr;
  }
  auto m = std::make_shared<Mapping>();
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (addr == MAP_FAILED) fail(Status::io, name, ": mmap of ", size, " bytes failed: ", errno_text(err));
  m->addr = addr;
  m->size = size;
  check_data_header(static_cast<const uint8_t*>(addr), size, name, kind);
  return m;
}

}  // namespace

bool Pack::is_pack(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kPackManifestName, ec);
}

std::shared_ptr<Pack> Pack::open(const fs::path& dir, bool map_experts) {
  std::error_code ec;
  SLUICE_CHECK(fs::is_directory(dir, ec), Status::not_found, dir.string(), ": no such pack directory (it ",
               path_kind_text(dir), ")");
  const fs::path manifest_path = dir / kPackManifestName;
  std::string text = read_file_bytes(manifest_path, kPackManifestMaxBytes, "a pack manifest");
  auto pack = std::shared_ptr<Pack>(new Pack());
  pack->dir_ = dir;
  pack->manifest_ = parse_pack_manifest(text, manifest_path.string());
  const PackManifest& m = pack->manifest_;

  auto dense = open_data_file(dir / kPackDenseName, m.dense_file_bytes, "dense", true);
  pack->dense_bytes_ = static_cast<const uint8_t*>(dense->addr);
  pack->dense_size_ = dense->size;
  pack->dense_map_ = dense;
  for (size_t i = 0; i < m.dense.size(); ++i) pack->dense_index_[m.dense[i].name] = i;
  for (const auto& [kind, info] : m.kinds) {
    const uint64_t bytes = kPackHeaderBytes + static_cast<uint64_t>(m.n_records()) * info.record_stride;
    auto map = open_data_file(dir / info.file, bytes, expert_kind_name(kind), map_experts);
    if (!map) continue;
    pack->expert_bytes_[kind] = {static_cast<const uint8_t*>(map->addr), map->size};
    pack->expert_maps_[kind] = map;
  }
  // The n-gram tables are never mapped: rows are read on demand (models/pack_ngram_table.h).
  if (m.ple) open_data_file(dir / m.ple->file, m.ple->file_bytes, kPackPleRole, false);
  return pack;
}

const PackRowTable* Pack::row_table(const std::string& prefix) const {
  if (!manifest_.ple) return nullptr;
  for (const PackRowTable& t : manifest_.ple->tables)
    if (t.prefix == prefix) return &t;
  return nullptr;
}

fs::path Pack::ple_file() const {
  SLUICE_CHECK(manifest_.ple.has_value(), Status::internal, dir_.string(), ": the pack has no n-gram tables");
  return dir_ / manifest_.ple->file;
}

const PackKindInfo& Pack::kind(DType k) const {
  auto it = manifest_.kinds.find(k);
  if (it != manifest_.kinds.end()) return it->second;
  std::string have;
  for (const auto& [kind, info] : manifest_.kinds) have += (have.empty() ? "" : ", ") + std::string(expert_kind_name(kind));
  fail(Status::invalid_argument, dir_.string(), ": the pack has no ", expert_kind_name(k), " experts (it has ", have, ")");
}

bool Pack::has_dense(const std::string& name) const { return dense_index_.count(name) != 0; }

Tensor Pack::dense(const std::string& name) const {
  auto it = dense_index_.find(name);
  if (it == dense_index_.end()) fail(Status::not_found, dir_.string(), ": the pack has no dense tensor ", name);
  const PackDenseTensor& d = manifest_.dense[it->second];
  Tensor t;
  t.dtype = d.dtype;
  for (int64_t s : d.shape) t.shape[t.ndim++] = s;
  t.data = const_cast<uint8_t*>(dense_bytes_ + d.offset);  // read-only mapping: never written
  t.storage = std::shared_ptr<void>(dense_map_, t.data);
  return t;
}

std::vector<std::string> Pack::dense_names() const {
  std::vector<std::string> out;
  for (const auto& [name, i] : dense_index_) out.push_back(name);
  return out;
}

fs::path Pack::expert_file(DType k) const { return dir_ / kind(k).file; }

uint64_t Pack::record_offset(DType k, int64_t record) const {
  SLUICE_CHECK(record >= 0 && record < manifest_.n_records(), Status::internal, "record ", record, " outside [0, ",
               manifest_.n_records(), ")");
  return kPackHeaderBytes + static_cast<uint64_t>(record) * kind(k).record_stride;
}

std::span<const uint8_t> Pack::mapped_record(DType k, int64_t record) const {
  const uint64_t off = record_offset(k, record);
  SLUICE_CHECK(expert_bytes_.count(k), Status::internal, dir_.string(), ": the ", expert_kind_name(k),
               " experts are not mapped (the pack was opened for streaming)");
  return {expert_bytes_.at(k).first + off, kind(k).record_bytes};
}

int64_t Pack::moe_layer_of_prefix(const std::string& prefix) const {
  const auto& p = manifest_.expert_prefixes;
  auto it = std::find(p.begin(), p.end(), prefix);
  return it == p.end() ? -1 : static_cast<int64_t>(it - p.begin());
}

std::string Pack::describe_record(DType k, int64_t record) const {
  const int64_t E = manifest_.n_expert;
  return str("layer ", manifest_.moe_layers[static_cast<size_t>(record / E)], ", expert ", record % E, ", kind ",
             expert_kind_name(k));
}

ExpertWeights expert_view(const PackKindInfo& kind, const void* record, std::shared_ptr<void> owner) {
  const DType dt = kind.kind;
  auto* base = static_cast<uint8_t*>(const_cast<void*>(record));  // views of read-only memory are never written
  auto view = [&](const PackBlock& b) {
    Tensor t(dt, {b.rows, b.cols}, base + b.offset, std::shared_ptr<void>(owner, base + b.offset));
    if (b.scale_bytes) t.scales = base + b.scale_offset;
    return t;
  };
  return {view(kind.gate), view(kind.up), view(kind.down)};
}

// ---- verify ----

namespace {

struct Fd {
  int fd;
  explicit Fd(const fs::path& p) : fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd < 0) fail(Status::io, p.string(), ": cannot open: ", errno_text(errno));
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  ~Fd() { ::close(fd); }
};

constexpr size_t kVerifyChunk = size_t{64} << 20;  // bytes per read

}  // namespace

PackVerifyResult verify_pack(const fs::path& dir, const std::function<void(const PackVerifyProgress&)>& progress,
                             size_t max_problems) {
  std::shared_ptr<Pack> pack = Pack::open(dir);
  const PackManifest& m = pack->manifest();
  PackVerifyResult r;
  PackVerifyProgress p;
  p.bytes_total = m.dense_file_bytes - kPackHeaderBytes;
  for (const auto& [kind, info] : m.kinds) p.bytes_total += static_cast<uint64_t>(m.n_records()) * info.record_stride;
  if (m.ple)
    for (const PackRowTable& t : m.ple->tables) p.bytes_total += static_cast<uint64_t>(t.rows) * t.row_stride;
  auto problem = [&](std::string what) {
    r.ok = false;
    if (r.problems.size() < max_problems) r.problems.push_back(std::move(what));
  };

  for (const std::string& name : m.tokenizer_files) {
    std::error_code ec;
    if (!fs::is_regular_file(dir / name, ec)) problem(str((dir / name).string(), ": listed in the manifest but missing"));
  }
  std::vector<uint8_t> buf;
  {  // dense.bin
    const fs::path path = dir / kPackDenseName;
    Fd fd(path);
    XXH3_state_t* st = XXH3_createState();
    SLUICE_CHECK(st, Status::out_of_memory, "verify: XXH3 state");
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> guard(st, XXH3_freeState);
    XXH3_64bits_reset(st);
    for (uint64_t off = kPackHeaderBytes; off < m.dense_file_bytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kVerifyChunk, m.dense_file_bytes - off));
      buf.resize(n);
      pread_all(fd.fd, buf.data(), n, off, path.string());
      XXH3_64bits_update(st, buf.data(), n);
      off += n;
      p.bytes_done += n;
      r.bytes_checked += n;
      if (progress) progress(p);
    }
    const uint64_t got = XXH3_64bits_digest(st);
    if (got != m.dense_checksum)
      problem(str(path.string(), ": checksum mismatch (manifest ", hex16(m.dense_checksum), ", file ", hex16(got), ")"));
  }
  // Expert files are read in chunks of at most kVerifyChunk bytes whatever the record size
  // (a record is hashed incrementally), so memory stays bounded even for huge records.
  XXH3_state_t* st = XXH3_createState();
  SLUICE_CHECK(st, Status::out_of_memory, "verify: XXH3 state");
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st_guard(st, XXH3_freeState);
  for (const auto& [kind, info] : m.kinds) {
    const fs::path path = dir / info.file;
    Fd fd(path);
    const uint64_t total = static_cast<uint64_t>(m.n_records()) * info.record_stride;
    int64_t rec = 0;
    uint64_t in_rec = 0;  // bytes of record `rec` seen so far
    bool padding_ok = true;
    XXH3_64bits_reset(st);
    for (uint64_t off = 0; off < total;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kVerifyChunk, total - off));
      buf.resize(n);
      pread_all(fd.fd, buf.data(), n, kPackHeaderBytes + off, path.string());
      for (size_t at = 0; at < n;) {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(n - at, info.record_stride - in_rec));
        const uint8_t* b = buf.data() + at;
        const size_t hashed = in_rec < info.record_bytes ? static_cast<size_t>(std::min<uint64_t>(take, info.record_bytes - in_rec)) : 0;
        if (hashed) XXH3_64bits_update(st, b, hashed);
        padding_ok = padding_ok && std::all_of(b + hashed, b + take, [](uint8_t c) { return c == 0; });
        in_rec += take;
        at += take;
        if (in_rec == info.record_stride) {
          const uint64_t got = XXH3_64bits_digest(st);
          if (got != info.checksums[static_cast<size_t>(rec)])
            problem(str(path.string(), ": record ", rec, " (", pack->describe_record(kind, rec), ") at offset ",
                        pack->record_offset(kind, rec), ": checksum mismatch (manifest ", hex16(info.checksums[rec]),
                        ", data ", hex16(got), ")"));
          else if (!padding_ok)
            problem(str(path.string(), ": record ", rec, " (", pack->describe_record(kind, rec),
                        "): the padding after the record is not zero"));
          ++r.records_checked;
          ++rec;
          in_rec = 0;
          padding_ok = true;
          XXH3_64bits_reset(st);
        }
      }
      off += n;
      p.bytes_done += n;
      r.bytes_checked += n;
      if (progress) progress(p);
    }
  }
  // The n-gram tables: each chunk's checksum and the zero padding of each row, read in
  // pieces of whole rows.
  if (m.ple) {
    const fs::path path = dir / m.ple->file;
    Fd fd(path);
    const uint64_t row_bytes_of = dtype_size(m.ple->dtype);
    for (size_t ti = 0; ti < m.ple->tables.size(); ++ti) {
      const PackRowTable& t = m.ple->tables[ti];
      const uint64_t row_bytes = static_cast<uint64_t>(t.cols) * row_bytes_of;
      const uint64_t piece_rows = std::max<uint64_t>(1, kVerifyChunk / t.row_stride);
      for (int64_t c = 0; c < t.n_chunks(); ++c) {
        const int64_t r0 = c * t.chunk_rows, r1 = std::min(t.rows, r0 + t.chunk_rows);
        XXH3_64bits_reset(st);
        bool padding_ok = true;
        for (int64_t at = r0; at < r1;) {
          const int64_t nr = std::min<int64_t>(static_cast<int64_t>(piece_rows), r1 - at);
          const size_t n = static_cast<size_t>(nr) * t.row_stride;
          buf.resize(n);
          pread_all(fd.fd, buf.data(), n, t.row_offset(at), path.string());
          XXH3_64bits_update(st, buf.data(), n);
          for (int64_t i = 0; i < nr; ++i) {
            const uint8_t* row = buf.data() + static_cast<size_t>(i) * t.row_stride;
            padding_ok = padding_ok && std::all_of(row + row_bytes, row + t.row_stride, [](uint8_t b) { return b == 0; });
          }
          at += nr;
          p.bytes_done += n;
          r.bytes_checked += n;
          if (progress) progress(p);
        }
        const uint64_t got = XXH3_64bits_digest(st);
        if (got != t.checksums[static_cast<size_t>(c)])
          problem(str(path.string(), ": n-gram table ", t.prefix, " rows [", r0, ", ", r1, ") (chunk ", c, ") at offset ",
                      t.row_offset(r0), ": checksum mismatch (manifest ", hex16(t.checksums[static_cast<size_t>(c)]),
                      ", data ", hex16(got), ")"));
        else if (!padding_ok)
          problem(str(path.string(), ": n-gram table ", t.prefix, " rows [", r0, ", ", r1, "): the padding after a row is not zero"));
        ++r.table_chunks_checked;
      }
    }
  }
  return r;
}

}  // namespace sluice
