// Shared pack-writing pieces of convert and synth: expert discovery by name, output files,
// the record writer thread, staging and the final load check.
#include "convert/pack_writer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "core/bits.h"
#include "core/error.h"
#include "core/log.h"
#include "format/file_io.h"
#include "models/load.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {



// Splits a routed-expert tensor name into prefix and parts; false for everything else.
bool parse_expert_name(const std::string& name, std::string& prefix, ExpertTensor& t, std::string& proj_name) {
  static const std::string marker = "experts.";
  for (size_t pos = name.rfind(marker); pos != std::string::npos; pos = pos ? name.rfind(marker, pos - 1) : std::string::npos) {
    if (pos > 0 && name[pos - 1] != '.') continue;  // "experts." must start a name component
    const size_t rest_at = pos + marker.size();
    const std::string rest = name.substr(rest_at);
    static const std::set<std::string> whole = {"gate_up_proj",        "down_proj",          "gate_up_proj_bias",
                                                "down_proj_bias",      "gate_up_proj_blocks", "gate_up_proj_scales",
                                                "down_proj_blocks",    "down_proj_scales"};
    if (whole.count(rest)) {  // one tensor over all experts
      prefix = name.substr(0, rest_at);
      t = {name, -1, rest.rfind("down_proj", 0) == 0 ? ExpertProj::down : ExpertProj::gate};  // gate: gate + up
      proj_name = rest;
      return true;
    }
    size_t dot = rest.find('.');
    if (dot == std::string::npos || dot == 0 || dot > 9) continue;
    const std::string digits = rest.substr(0, dot);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (digits.size() > 1 && digits[0] == '0') continue;
    const std::string tail = rest.substr(dot + 1);
    static const std::map<std::string, ExpertProj> projs = {
        {"gate_proj.weight", ExpertProj::gate}, {"up_proj.weight", ExpertProj::up}, {"down_proj.weight", ExpertProj::down},
        {"w1.weight", ExpertProj::gate},        {"w3.weight", ExpertProj::up},      {"w2.weight", ExpertProj::down}};
    auto it = projs.find(tail);
    if (it == projs.end()) continue;
    prefix = name.substr(0, rest_at);
    t = {name, std::stoll(digits), it->second};
    proj_name = tail.substr(0, tail.size() - 7);  // without ".weight"
    return true;
  }
  return false;
}

// The model layer number in a prefix: the integer after "layers." (or "layer."/"h."), else -1.
int64_t layer_number(const std::string& prefix) {
  for (const char* key : {"layers.", "layer.", "h.", "blocks."}) {
    size_t pos = prefix.find(key);
    while (pos != std::string::npos) {
      if (pos == 0 || prefix[pos - 1] == '.') {
        size_t at = pos + std::strlen(key), end = at;
        while (end < prefix.size() && end - at < 9 && prefix[end] >= '0' && prefix[end] <= '9') ++end;
        if (end > at && end < prefix.size() && prefix[end] == '.') return std::stoll(prefix.substr(at, end - at));
      }
      pos = prefix.find(key, pos + 1);
    }
  }
  return -1;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

// ---- finding the experts ----

std::vector<ExpertLayer> find_expert_layers(const std::vector<TensorDecl>& all, const std::string& where_dir,
                                            std::set<std::string>& expert_names, FusedExperts fused, bool allow_none) {
  std::map<std::string, const TensorDecl*> by_name;
  for (const TensorDecl& t : all) by_name[t.name] = &t;
  auto entry = [&](const std::string& name) -> const TensorDecl& { return *by_name.at(name); };
  auto has = [&](const std::string& name) { return by_name.count(name) != 0; };

  std::map<std::string, ExpertLayer> by_prefix;
  std::map<std::string, std::string> scheme_of;  // prefix -> the first per-expert naming scheme seen
  for (const auto& [name, decl] : by_name) {
    std::string prefix, proj_name;
    ExpertTensor t;
    if (!parse_expert_name(name, prefix, t, proj_name)) continue;
    ExpertLayer& l = by_prefix[prefix];
    l.prefix = prefix;
    const bool hf = proj_name.find("_proj") != std::string::npos;
    if (t.expert >= 0) {
      const std::string scheme = hf ? "gate_proj,up_proj,down_proj" : "w1,w3,w2";
      auto [it, fresh] = scheme_of.emplace(prefix, scheme);
      SLUICE_CHECK(it->second == scheme, Status::corrupt, where_dir, ": experts under ", prefix,
                   " mix the names gate_proj/up_proj/down_proj and w1/w3/w2 (", name, ")");
    }
    l.tensors.push_back(t);
    expert_names.insert(name);
  }
  std::vector<ExpertLayer> layers;
  for (auto& [prefix, l] : by_prefix) {
    const std::string where = where_dir + ": experts " + prefix + "*";
    l.layer = layer_number(prefix);
    SLUICE_CHECK(l.layer >= 0, Status::unsupported, where, ": cannot tell the model layer of this prefix (expected ",
                 "\"...layers.<n>....experts.\")");
    size_t n_fused = std::count_if(l.tensors.begin(), l.tensors.end(), [](const ExpertTensor& t) { return t.expert < 0; });
    SLUICE_CHECK(n_fused == 0 || n_fused == l.tensors.size(), Status::corrupt, where,
                 ": holds both fused (gate_up_proj/down_proj) and per-expert tensors");
    auto check_float = [&](const std::string& name) {
      DType dt = entry(name).dtype;
      SLUICE_CHECK(dtype_is_float(dt), Status::unsupported, where_dir, ": expert tensor ", name, " has dtype ", dtype_name(dt),
                   "; experts must be f32, bf16 or f16");
    };
    // A tensor of the layout: present, this shape, this dtype (nullopt: any float dtype).
    auto expect_tensor = [&](const std::string& name, std::optional<DType> dtype, const std::vector<int64_t>& shape) {
      SLUICE_CHECK(has(name), Status::corrupt, where, ": has no ", name);
      SLUICE_CHECK(entry(name).shape == shape, Status::corrupt, where_dir, ": tensor ", name, " has shape ",
                   shape_text(entry(name).shape), ", expected ", shape_text(shape));
      if (dtype)
        SLUICE_CHECK(entry(name).dtype == *dtype, Status::corrupt, where_dir, ": tensor ", name, " has dtype ",
                     dtype_name(entry(name).dtype), ", expected ", dtype_name(*dtype));
      else
        check_float(name);
    };
    // gpt-oss: the sizes from the biases (gate_up_proj_bias [E, 2 n_ff], down_proj_bias [E,
    // n_embd]: unambiguous where n_embd == 2 n_ff), and exactly the layout's tensors.
    auto gpt_oss_sizes = [&](ExpertLayer& layer, const std::string& w) {
      const std::string gb = prefix + "gate_up_proj_bias", db = prefix + "down_proj_bias";
      SLUICE_CHECK(has(gb) && has(db), Status::corrupt, w, ": gpt-oss experts need both ", gb, " and ", db);
      const auto &s_gb = entry(gb).shape, &s_db = entry(db).shape;
      SLUICE_CHECK(s_gb.size() == 2 && s_gb[0] > 0 && s_gb[1] > 0 && s_gb[1] % 2 == 0, Status::corrupt, where_dir,
                   ": tensor ", gb, " has shape ", shape_text(s_gb), ", expected [n_expert, 2 * n_ff]");
      layer.n_expert = s_gb[0];
      layer.n_ff = s_gb[1] / 2;
      SLUICE_CHECK(s_db.size() == 2 && s_db[0] == layer.n_expert && s_db[1] > 0, Status::corrupt, where_dir, ": tensor ",
                   db, " has shape ", shape_text(s_db), ", expected [", layer.n_expert, ", n_embd]");
      layer.n_embd = s_db[1];
      check_float(gb);
      check_float(db);
      const bool mx = layer.layout == ExpertLayout::gpt_oss_mxfp4;
      std::set<std::string> want = {gb, db};
      for (const char* n : {"gate_up_proj", "down_proj"}) {
        if (mx) {
          want.insert(prefix + n + "_blocks");
          want.insert(prefix + n + "_scales");
        } else {
          want.insert(prefix + n);
        }
      }
      for (const ExpertTensor& t : layer.tensors)
        SLUICE_CHECK(want.count(t.name), Status::corrupt, w, ": tensor ", t.name, " does not belong to gpt-oss's ",
                     mx ? "MXFP4" : "float", " expert layout");
    };
    if (n_fused && has(prefix + "gate_up_proj_blocks")) {  // gpt-oss, MXFP4 as it ships
      l.layout = ExpertLayout::gpt_oss_mxfp4;
      l.source = "gpt_oss_mxfp4";
      l.biases = true;
      gpt_oss_sizes(l, where);
      const int64_t E = l.n_expert, d = l.n_embd, ff = l.n_ff;
      SLUICE_CHECK(d % 32 == 0 && ff % 32 == 0, Status::corrupt, where, ": MXFP4 experts need n_embd (", d,
                   ") and n_ff (", ff, ") to be multiples of 32");
      expect_tensor(prefix + "gate_up_proj_blocks", DType::u8, {E, 2 * ff, d / 32, 16});
      expect_tensor(prefix + "gate_up_proj_scales", DType::u8, {E, 2 * ff, d / 32});
      expect_tensor(prefix + "down_proj_blocks", DType::u8, {E, d, ff / 32, 16});
      expect_tensor(prefix + "down_proj_scales", DType::u8, {E, d, ff / 32});
    } else if (n_fused && (has(prefix + "gate_up_proj_bias") || fused == FusedExperts::inputs_first_interleaved)) {
      // gpt-oss, float
      l.layout = ExpertLayout::gpt_oss;
      l.source = "gpt_oss";
      l.biases = true;
      gpt_oss_sizes(l, where);
      const int64_t E = l.n_expert, d = l.n_embd, ff = l.n_ff;
      expect_tensor(prefix + "gate_up_proj", std::nullopt, {E, d, 2 * ff});
      expect_tensor(prefix + "down_proj", std::nullopt, {E, ff, d});
    } else if (n_fused && fused == FusedExperts::inputs_first_halves) {  // Llama 4
      l.layout = ExpertLayout::fused_inputs_first;
      l.source = "fused_inputs_first";
      const std::string gu = prefix + "gate_up_proj", dn = prefix + "down_proj";
      SLUICE_CHECK(has(gu) && has(dn), Status::corrupt, where, ": needs both ", gu, " and ", dn);
      for (const ExpertTensor& t : l.tensors)
        SLUICE_CHECK(t.name == gu || t.name == dn, Status::corrupt, where, ": tensor ", t.name,
                     " does not belong to the fused expert layout (gate_up_proj, down_proj)");
      const auto& s_gu = entry(gu).shape;
      SLUICE_CHECK(s_gu.size() == 3 && s_gu[2] % 2 == 0 && s_gu[0] > 0 && s_gu[1] > 0 && s_gu[2] > 0, Status::corrupt,
                   where_dir, ": tensor ", gu, " has shape ", shape_text(s_gu), ", expected [n_expert, n_embd, 2 * n_ff]");
      l.n_expert = s_gu[0];
      l.n_embd = s_gu[1];
      l.n_ff = s_gu[2] / 2;
      expect_tensor(dn, std::nullopt, {l.n_expert, l.n_ff, l.n_embd});
      check_float(gu);
    } else if (n_fused) {
      l.layout = ExpertLayout::fused;
      l.source = "fused";
      const std::string gu = prefix + "gate_up_proj", dn = prefix + "down_proj";
      for (const ExpertTensor& t : l.tensors)
        SLUICE_CHECK(t.name == gu || t.name == dn, Status::corrupt, where, ": tensor ", t.name,
                     " without the rest of gpt-oss's expert layout (", prefix, "gate_up_proj_bias)");
      SLUICE_CHECK(has(gu), Status::corrupt, where, ": has ", dn, " but no ", gu);
      SLUICE_CHECK(has(dn), Status::corrupt, where, ": has ", gu, " but no ", dn);
      const auto &s_gu = entry(gu).shape, &s_dn = entry(dn).shape;
      SLUICE_CHECK(s_gu.size() == 3 && s_gu[1] % 2 == 0 && s_gu[0] > 0 && s_gu[1] > 0 && s_gu[2] > 0, Status::corrupt,
                   where_dir, ": tensor ", gu, " has shape ", shape_text(s_gu), ", expected [n_expert, 2 * n_ff, n_embd]");
      l.n_expert = s_gu[0];
      l.n_ff = s_gu[1] / 2;
      l.n_embd = s_gu[2];
      SLUICE_CHECK(s_dn == (std::vector<int64_t>{l.n_expert, l.n_embd, l.n_ff}), Status::corrupt, where_dir, ": tensor ",
                   dn, " has shape ", shape_text(s_dn), ", expected ", shape_text({l.n_expert, l.n_embd, l.n_ff}),
                   " to match ", gu, " ", shape_text(s_gu));
      check_float(gu);
      check_float(dn);
    } else {
      l.source = scheme_of.at(prefix);
      int64_t max_e = -1;
      for (const ExpertTensor& t : l.tensors) max_e = std::max(max_e, t.expert);
      l.n_expert = max_e + 1;
      l.names.assign(static_cast<size_t>(l.n_expert), {});
      for (const ExpertTensor& t : l.tensors) l.names[t.expert][static_cast<int>(t.proj)] = t.name;
      const bool hf = l.source[0] == 'g';
      const char* proj_names[3] = {hf ? "gate_proj" : "w1", hf ? "up_proj" : "w3", hf ? "down_proj" : "w2"};
      for (int64_t e = 0; e < l.n_expert; ++e)
        for (int p = 0; p < 3; ++p)
          SLUICE_CHECK(!l.names[e][p].empty(), Status::corrupt, where, ": expert ", e, " has no ", proj_names[p], " (",
                       prefix, e, ".", proj_names[p], ".weight)");
      const auto& g0 = entry(l.names[0][0]).shape;
      SLUICE_CHECK(g0.size() == 2 && g0[0] > 0 && g0[1] > 0, Status::corrupt, where_dir, ": tensor ", l.names[0][0],
                   " has shape ", shape_text(g0), ", expected [n_ff, n_embd]");
      l.n_ff = g0[0];
      l.n_embd = g0[1];
      for (int64_t e = 0; e < l.n_expert; ++e)
        for (int p = 0; p < 3; ++p) {
          const std::string& name = l.names[e][p];
          const std::vector<int64_t> want = p == 2 ? std::vector<int64_t>{l.n_embd, l.n_ff} : std::vector<int64_t>{l.n_ff, l.n_embd};
          SLUICE_CHECK(entry(name).shape == want, Status::corrupt, where_dir, ": tensor ", name, " has shape ",
                       shape_text(entry(name).shape), ", expected ", shape_text(want), " like ", l.names[0][0], " ",
                       shape_text(g0));
          check_float(name);
        }
    }
    layers.push_back(std::move(l));
  }
  std::sort(layers.begin(), layers.end(), [](const ExpertLayer& a, const ExpertLayer& b) { return a.layer < b.layer; });
  for (size_t i = 1; i < layers.size(); ++i) {
    SLUICE_CHECK(layers[i].layer != layers[i - 1].layer, Status::corrupt, where_dir, ": layer ", layers[i].layer,
                 " has experts under two prefixes: ", layers[i - 1].prefix, " and ", layers[i].prefix);
    const ExpertLayer &a = layers[0], &b = layers[i];
    SLUICE_CHECK(a.biases == b.biases, Status::unsupported, where_dir, ": experts of ", a.prefix,
                 a.biases ? " have" : " have no", " biases, those of ", b.prefix, b.biases ? " do" : " do not");
    SLUICE_CHECK(a.n_expert == b.n_expert && a.n_embd == b.n_embd && a.n_ff == b.n_ff, Status::unsupported, where_dir,
                 ": experts differ in size between layers (", a.prefix, ": ", a.n_expert, " x [", a.n_ff, ", ", a.n_embd,
                 "], ", b.prefix, ": ", b.n_expert, " x [", b.n_ff, ", ", b.n_embd, "]); a pack holds one expert size");
  }
  SLUICE_CHECK(!layers.empty() || allow_none, Status::unsupported, where_dir,
               ": no routed experts found (tensors named <prefix>experts.<e>.gate_proj.weight, ...w1.weight, or "
               "<prefix>experts.gate_up_proj); a pack is for Mixture-of-Experts models");
  return layers;
}

void pack_manifest_set_experts(PackManifest& m, const std::vector<ExpertLayer>& layers,
                               const std::vector<DType>& kinds) {
  m.n_expert = layers.empty() ? 0 : layers.front().n_expert;
  m.n_embd = layers.empty() ? 0 : layers.front().n_embd;
  m.n_ff = layers.empty() ? 0 : layers.front().n_ff;
  m.moe_layers.clear();
  m.expert_prefixes.clear();
  m.expert_sources.clear();
  for (const ExpertLayer& l : layers) {
    m.moe_layers.push_back(l.layer);
    m.expert_prefixes.push_back(l.prefix);
    m.expert_sources.push_back(l.source);
  }
  m.kinds.clear();
  if (layers.empty()) return;
  for (DType k : kinds) {
    PackKindInfo info = pack_kind_layout(k, m.n_embd, m.n_ff, layers.front().biases);
    info.checksums.assign(static_cast<size_t>(m.n_records()), 0);
    m.kinds[k] = std::move(info);
  }
}

// ---- files ----

OutFile::OutFile(const fs::path& path, bool direct) : path_(path) {
  int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  if (direct) {
    fd_ = ::open(path.c_str(), flags | O_DIRECT, 0644);
    if (fd_ >= 0) direct_ = true;
    else if (errno != EINVAL) fail(Status::io, path.string(), ": cannot create: ", errno_text(errno));
  }
  if (fd_ < 0) fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0) fail(Status::io, path.string(), ": cannot create: ", errno_text(errno));
}

OutFile::OutFile(const fs::path& path, bool direct, uint64_t keep) : path_(path) {
  const int flags = O_WRONLY | O_CLOEXEC;
  if (direct) {
    fd_ = ::open(path.c_str(), flags | O_DIRECT);
    if (fd_ >= 0) direct_ = true;
  }
  if (fd_ < 0) fd_ = ::open(path.c_str(), flags);
  if (fd_ < 0) fail(Status::io, path.string(), ": cannot open to resume: ", errno_text(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || static_cast<uint64_t>(st.st_size) < keep)
    fail(Status::io, path.string(), ": holds ", static_cast<uint64_t>(st.st_size), " bytes, fewer than the ", keep,
         " to resume after");
  if (::ftruncate(fd_, static_cast<off_t>(keep)) != 0 || ::lseek(fd_, static_cast<off_t>(keep), SEEK_SET) < 0)
    fail(Status::io, path.string(), ": cannot cut to ", keep, " bytes: ", errno_text(errno));
  size_ = synced_ = keep;
}

OutFile::~OutFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutFile::write(const uint8_t* p, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::write(fd_, p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EINVAL && direct_ && done == 0) {  // O_DIRECT refused after all: go buffered
      int flags = ::fcntl(fd_, F_GETFL);
      ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT);
      direct_ = false;
      continue;
    }
    if (w < 0) fail(Status::io, path_.string(), ": write of ", n - done, " bytes at offset ", size_ + done,
                    " failed: ", errno_text(errno), errno == ENOSPC ? " (disk full)" : "");
    done += static_cast<size_t>(w);
  }
  size_ += n;
  if (!direct_ && size_ - synced_ >= (uint64_t{64} << 20)) {  // start write-back of what is written so far
    ::sync_file_range(fd_, static_cast<off_t>(synced_), static_cast<off_t>(size_ - synced_), SYNC_FILE_RANGE_WRITE);
    synced_ = size_;
  }
}

void OutFile::finish() {
  if (::fsync(fd_) != 0) fail(Status::io, path_.string(), ": fsync failed: ", errno_text(errno));
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail(Status::io, path_.string(), ": close failed: ", errno_text(errno));
  }
  fd_ = -1;
}

void write_small_file(const fs::path& path, const void* data, size_t n) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail(Status::io, path.string(), ": cannot create: ", errno_text(errno));
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::write(fd, static_cast<const char*>(data) + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      int err = errno;
      ::close(fd);
      fail(Status::io, path.string(), ": write failed: ", errno_text(err));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) fail(Status::io, path.string(), ": fsync/close failed: ", errno_text(errno));
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(Status::io, dir.string(), ": cannot open directory: ", errno_text(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail(Status::io, dir.string(), ": fsync failed: ", errno_text(errno));
}

DenseFileWriter::DenseFileWriter(const fs::path& path, bool direct) : path_(path), out_(path, direct) {
  state_ = XXH3_createState();
  SLUICE_CHECK(state_, Status::out_of_memory, "pack writer: XXH3 state");
  XXH3_64bits_reset(state_);
  std::vector<uint8_t> header = pack_file_header("dense", 0);  // placeholder, rewritten by finish()
  AlignedBuffer page(kPackHeaderBytes);  // aligned, so that a direct file stays direct
  std::memcpy(page.data(), header.data(), header.size());
  out_.write(page.data(), kPackHeaderBytes);
}

DenseFileWriter::~DenseFileWriter() { XXH3_freeState(state_); }

uint64_t DenseFileWriter::begin_tensor() {
  static const uint8_t zeros[kPackBlockAlign] = {};
  const uint64_t pad = round_up(out_.size(), kPackBlockAlign) - out_.size();
  if (pad) write(zeros, pad);
  return out_.size();
}

void DenseFileWriter::write(const uint8_t* p, size_t n) {
  out_.write(p, n);
  XXH3_64bits_update(state_, p, n);
}

void DenseFileWriter::finish(PackManifest& m) {
  m.dense_file_bytes = out_.size();
  m.dense_checksum = XXH3_64bits_digest(state_);
  out_.finish();
  const std::vector<uint8_t> header = pack_file_header("dense", m.dense_file_bytes - kPackHeaderBytes);
  int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  SLUICE_CHECK(fd >= 0, Status::io, path_.string(), ": cannot reopen: ", errno_text(errno));
  ssize_t w = ::pwrite(fd, header.data(), header.size(), 0);
  int err = errno;
  bool ok = w == static_cast<ssize_t>(header.size()) && ::fsync(fd) == 0;
  ::close(fd);
  SLUICE_CHECK(ok, Status::io, path_.string(), ": header write failed: ", errno_text(err));
}

std::unique_ptr<OutFile> open_expert_file(const fs::path& dir, const PackKindInfo& info, int64_t n_records,
                                          int64_t first_record) {
  if (first_record > 0)
    return std::make_unique<OutFile>(dir / info.file, true,
                                     kPackHeaderBytes + static_cast<uint64_t>(first_record) * info.record_stride);
  std::error_code ec;
  fs::remove(dir / info.file, ec);  // a resumed convert that starts the experts over
  auto file = std::make_unique<OutFile>(dir / info.file, true);
  AlignedBuffer h(kPackHeaderBytes);
  std::vector<uint8_t> header =
      pack_file_header(expert_kind_name(info.kind), static_cast<uint64_t>(n_records) * info.record_stride);
  std::memcpy(h.data(), header.data(), header.size());
  file->write(h.data(), kPackHeaderBytes);
  return file;
}

void pack_record_zero_gaps(const PackKindInfo& info, uint8_t* rec) {
  std::vector<std::pair<uint64_t, uint64_t>> used;
  for (const PackRange& r : pack_kind_ranges(info)) used.push_back({r.offset, r.bytes});
  std::sort(used.begin(), used.end());
  uint64_t at = 0;
  for (auto [off, n] : used) {
    if (!n) continue;
    if (off > at) std::memset(rec + at, 0, off - at);
    at = std::max(at, off + n);
  }
  std::memset(rec + at, 0, info.record_stride - at);
}

// ---- the record writer ----

RecordBatchWriter::RecordBatchWriter(std::vector<OutFile*> files, std::vector<PackKindInfo*> kinds, bool checksum,
                                     std::function<void(const RecordBatch&)> written)
    : files_(std::move(files)),
      kinds_(std::move(kinds)),
      checksum_(checksum),
      written_(std::move(written)),
      thread_([this] { run(); }) {}

RecordBatchWriter::~RecordBatchWriter() {
  {
    std::lock_guard<std::mutex> l(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void RecordBatchWriter::push(RecordBatch* b) {
  std::unique_lock<std::mutex> l(m_);
  cv_.wait(l, [&] { return queued_ == nullptr || error_; });
  if (error_) std::rethrow_exception(error_);
  queued_ = b;
  cv_.notify_all();
}

void RecordBatchWriter::drain() {
  std::unique_lock<std::mutex> l(m_);
  cv_.wait(l, [&] { return (queued_ == nullptr && !busy_) || error_; });
  if (error_) std::rethrow_exception(error_);
}

void RecordBatchWriter::wait_free(const RecordBatch* b) {
  std::unique_lock<std::mutex> l(m_);
  cv_.wait(l, [&] { return (queued_ != b && writing_ != b) || error_; });
  if (error_) std::rethrow_exception(error_);
}

void RecordBatchWriter::run() {
  std::unique_lock<std::mutex> l(m_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || queued_; });
    if (!queued_) return;
    RecordBatch* b = queued_;
    queued_ = nullptr;
    writing_ = b;
    busy_ = true;
    cv_.notify_all();
    l.unlock();
    try {
      for (size_t k = 0; k < kinds_.size(); ++k) {
        PackKindInfo& info = *kinds_[k];
        const uint8_t* base = b->out[k]->data();
        if (checksum_)
          for (int64_t i = 0; i < b->count; ++i)
            info.checksums[static_cast<size_t>(b->r0 + i)] = XXH3_64bits(base + i * info.record_stride, info.record_bytes);
        files_[k]->write(base, static_cast<size_t>(b->count * info.record_stride));
      }
      if (written_) written_(*b);
    } catch (...) {
      std::lock_guard<std::mutex> g(m_);
      error_ = std::current_exception();
    }
    l.lock();
    writing_ = nullptr;
    busy_ = false;
    cv_.notify_all();
  }
}

// ---- staging ----

namespace {

// The staging directories this process is writing (a process may write several packs, one
// after the other or at once).
std::mutex staging_in_use_mutex;
std::set<fs::path> staging_in_use;

// The staging directories ".NAME.partial-PID" in `parent` whose writer is gone (killed, or
// interrupted and keeping its partial pack): PID names no live process, or names this one
// and no writer of it uses the directory. A directory whose PID is alive, or reused by
// another process, is left alone. Newest first.
std::vector<std::pair<fs::path, pid_t>> stale_partials(const fs::path& parent, const std::string& name) {
  const std::string prefix = "." + name + ".partial-";
  std::vector<std::pair<fs::path, pid_t>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
    const std::string file = e.path().filename().string();
    if (!file.starts_with(prefix) || !e.is_directory(ec)) continue;
    const std::string digits = file.substr(prefix.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid == ::getpid()) {
      std::lock_guard<std::mutex> lock(staging_in_use_mutex);
      if (staging_in_use.count(e.path())) continue;
    } else if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) {
      continue;  // alive, or not ours to judge (EPERM)
    }
    out.emplace_back(e.path(), pid);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    std::error_code e1, e2;
    return fs::last_write_time(a.first, e1) > fs::last_write_time(b.first, e2);
  });
  return out;
}

}  // namespace

PackStaging::PackStaging(const fs::path& out_arg, bool force, std::string tool,
                         const std::function<bool(const fs::path&)>& adopt)
    : tool_(std::move(tool)) {
  std::error_code ec;
  out_ = fs::absolute(out_arg).lexically_normal();
  if (out_.filename().empty()) out_ = out_.parent_path();  // "pack/"
  parent_ = out_.parent_path();
  SLUICE_CHECK(!out_.filename().empty(), Status::invalid_argument, tool_, ": bad output directory ", out_arg.string());
  SLUICE_CHECK(fs::is_directory(parent_, ec), Status::not_found, tool_, ": the parent of the output, ", parent_.string(),
               ", is not a directory");
  if (fs::exists(out_, ec)) {
    const bool is_pack = Pack::is_pack(out_);
    const bool empty_dir = fs::is_directory(out_, ec) && fs::is_empty(out_, ec);
    SLUICE_CHECK(is_pack || empty_dir, Status::invalid_argument, tool_, ": ", out_.string(),
                 " exists and is not a sluice pack; refusing to replace it");
    SLUICE_CHECK(!is_pack || force, Status::invalid_argument, tool_, ": ", out_.string(),
                 " already holds a pack; pass --force to replace it");
    replace_ = is_pack;
  }
  tmp_ = parent_ / ("." + out_.filename().string() + ".partial-" + std::to_string(::getpid()));
  // The partial packs to adopt or remove are listed before this writer claims its own name
  // (which a partial pack this process kept may already have).
  const auto stale_list = stale_partials(parent_, out_.filename().string());
  {
    std::lock_guard<std::mutex> lock(staging_in_use_mutex);
    SLUICE_CHECK(!staging_in_use.count(tmp_), Status::invalid_argument, tool_, ": ", out_.string(),
                 " is being written already");
    staging_in_use.insert(tmp_);
  }
  try {
    for (const auto& [stale, pid] : stale_list) {
      if (!resumed_ && adopt && adopt(stale)) {
        if (stale != tmp_ && ::rename(stale.c_str(), tmp_.c_str()) != 0)
          fail(Status::io, tool_, ": cannot rename ", stale.string(), " to ", tmp_.string(), ": ", errno_text(errno));
        resumed_ = true;
        continue;
      }
      fs::remove_all(stale, ec);
      if (ec) LOG_WARN(tool_, ": cannot remove the stale ", stale.string(), ": ", ec.message());
      else LOG_INFO(tool_, ": removed ", stale.string(), ", left by an earlier run (process ", pid, ")");
    }
    if (!resumed_) {
      fs::remove_all(tmp_, ec);
      fs::create_directory(tmp_, ec);
      SLUICE_CHECK(!ec, Status::io, tmp_.string(), ": cannot create: ", ec.message());
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(staging_in_use_mutex);
    staging_in_use.erase(tmp_);
    throw;
  }
}

PackStaging::~PackStaging() {
  {
    std::lock_guard<std::mutex> lock(staging_in_use_mutex);
    staging_in_use.erase(tmp_);
  }
  if (!armed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void PackStaging::commit() {
  if (replace_) {
    if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, out_.c_str(), RENAME_EXCHANGE) != 0)
      fail(Status::io, tool_, ": cannot swap ", tmp_.string(), " with ", out_.string(), ": ", errno_text(errno));
    // tmp_ now holds the old pack; the destructor removes it.
  } else {
    if (::rename(tmp_.c_str(), out_.c_str()) != 0)
      fail(Status::io, tool_, ": cannot rename ", tmp_.string(), " to ", out_.string(), ": ", errno_text(errno));
    armed_ = false;
  }
  fsync_dir(parent_);
}

void check_pack_loads(const fs::path& dir, const std::vector<DType>& kinds, std::string_view tool) {
  if (kinds.empty()) {  // a pack without routed experts
    try {
      auto backend = make_cpu_backend();
      load_model(dir, *backend);
    } catch (const Error& e) {
      fail(Status::internal, tool, ": the written pack does not load: ", e.what());
    }
  }
  for (DType k : kinds) {
    try {
      auto backend = make_cpu_backend();
      LoadOptions lo;
      lo.expert_kind = k;
      load_model(dir, *backend, lo);
    } catch (const Error& e) {
      fail(Status::internal, tool, ": the written pack does not load at kind ", expert_kind_name(k), ": ", e.what());
    }
  }
}

}  // namespace sluice
