// The pack: expert kinds and record layouts, the manifest writer, the read-only mappings of an
// open pack and expert views. Parsing the manifest is pack_manifest.cpp, verify is
// pack_verify.cpp.
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

std::optional<DType> dense_dtype_from_name(std::string_view s) {
  for (DType t : {DType::f32, DType::bf16, DType::q8, DType::q4})
    if (s == dense_dtype_name(t)) return t;
  return std::nullopt;
}

std::string_view dense_dtype_name(DType t) { return t == DType::q8 ? "int8" : dtype_name(t); }

std::vector<DType> parse_expert_kinds(std::string_view list) {
  std::vector<DType> kinds;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = std::min(list.find(',', pos), list.size());
    std::string_view item = list.substr(pos, comma - pos);
    std::optional<DType> k = expert_kind_from_name(item);
    SLUICE_CHECK(k, Status::invalid_argument, "unknown expert kind '", item, "' (kinds: bf16, int8, q4, q2, mxfp4)");
    SLUICE_CHECK(std::find(kinds.begin(), kinds.end(), *k) == kinds.end(), Status::invalid_argument,
                 "expert kind '", item, "' is listed twice");
    kinds.push_back(*k);
    pos = comma + 1;
  }
  return kinds;
}

DType default_expert_kind(const std::vector<DType>& available) {
  for (DType k : {DType::q4, DType::mxfp4, DType::q8, DType::bf16, DType::q2})
    if (std::find(available.begin(), available.end(), k) != available.end()) return k;
  fail(Status::invalid_argument, "the pack holds no expert kind");
}

std::pair<uint64_t, uint64_t> pack_block_bytes(DType kind, int64_t rows, int64_t cols) {
  if (kind == DType::bf16) return {static_cast<uint64_t>(rows * cols * 2), 0};
  return {static_cast<uint64_t>(rows * quant_row_bytes(kind, cols)),
          static_cast<uint64_t>(rows * quant_scale_row_bytes(kind, cols))};
}

PackKindInfo pack_kind_layout(DType kind, int64_t n_embd, int64_t n_ff, bool biases) {
  PackKindInfo info;
  info.kind = kind;
  info.file = str("experts.", expert_kind_name(kind), ".bin");
  uint64_t at = 0;
  auto place = [&](PackBlock& b, int64_t rows, int64_t cols) {
    b.rows = rows;
    b.cols = cols;
    auto [bytes, scale_bytes] = pack_block_bytes(kind, rows, cols);
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
  if (biases) {
    at = round_up(info.record_bytes, kPackBlockAlign);
    for (auto [b, n] : {std::pair{&info.gate_bias, n_ff}, {&info.up_bias, n_ff}, {&info.down_bias, n_embd}}) {
      b->n = n;
      b->offset = at;
      b->bytes = static_cast<uint64_t>(n) * sizeof(float);
      info.record_bytes = at + b->bytes;
      at = round_up(info.record_bytes, kPackBlockAlign);
    }
  }
  info.record_stride = round_up(std::max<uint64_t>(info.record_bytes, 1), kPackRecordAlign);
  return info;
}

std::vector<PackRange> pack_kind_ranges(const PackKindInfo& info) {
  return {{info.gate.offset, info.gate.bytes, "gate"},
          {info.gate.scale_offset, info.gate.scale_bytes, "gate scales"},
          {info.up.offset, info.up.bytes, "up"},
          {info.up.scale_offset, info.up.scale_bytes, "up scales"},
          {info.down.offset, info.down.bytes, "down"},
          {info.down.scale_offset, info.down.scale_bytes, "down scales"},
          {info.gate_bias.offset, info.gate_bias.bytes, "gate bias"},
          {info.up_bias.offset, info.up_bias.bytes, "up bias"},
          {info.down_bias.offset, info.down_bias.bytes, "down bias"}};
}

// ---- manifest writing ----

uint64_t pack_settings_checksum(const PackManifest& m) {
  // nlohmann::json keeps object keys sorted and prints numbers in their shortest round-trip
  // form: the text is the same for the same settings however the manifest was laid out.
  const std::string text = m.family + '\n' + m.config.dump();
  return XXH3_64bits(text.data(), text.size());
}

std::string pack_manifest_to_json(const PackManifest& m) {
  using ojson = nlohmann::ordered_json;
  ojson root;
  root["format"] = kPackFormatName;
  root["version"] = m.needed_version();
  root["family"] = m.family;
  root["config"] = m.config;
  root["tokenizer_files"] = m.tokenizer_files;
  if (!m.tokenizer_checksums.empty()) {
    ojson sums = ojson::object();
    for (const auto& [name, sum] : m.tokenizer_checksums) sums[name] = hex16(sum);
    root["tokenizer_checksums"] = std::move(sums);
  }
  root["settings_checksum"] = hex16(pack_settings_checksum(m));
  ojson dense;
  dense["file"] = kPackDenseName;
  dense["dtype"] = dtype_name(m.dense_dtype);
  dense["bytes"] = m.dense_file_bytes;
  dense["checksum"] = hex16(m.dense_checksum);
  dense["tensors"] = ojson::array();
  for (const PackDenseTensor& t : m.dense) {
    ojson j = {{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"offset", t.offset}, {"bytes", t.bytes}};
    if (dtype_is_quantized(t.dtype)) {
      j["scale_offset"] = t.scale_offset;
      j["scale_bytes"] = t.scale_bytes;
    }
    dense["tensors"].push_back(std::move(j));
  }
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
    if (k.has_biases()) {  // version 4
      auto bias = [](const PackBias& b) { return ojson{{"n", b.n}, {"offset", b.offset}, {"bytes", b.bytes}}; };
      j["gate_bias"] = bias(k.gate_bias);
      j["up_bias"] = bias(k.up_bias);
      j["down_bias"] = bias(k.down_bias);
    }
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
  if (d.scale_bytes) t.scales = const_cast<uint8_t*>(dense_bytes_ + d.scale_offset);
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
  auto bias = [&](const PackBias& b) {
    if (!b.bytes) return Tensor{};
    return Tensor(DType::f32, {b.n}, base + b.offset, std::shared_ptr<void>(owner, base + b.offset));
  };
  return {view(kind.gate), view(kind.up), view(kind.down), bias(kind.gate_bias), bias(kind.up_bias),
          bias(kind.down_bias)};
}

}  // namespace sluice
