// convert_checkpoint: finds the routed experts of a checkpoint by name, validates the
// checkpoint against its family, then writes dense.bin and one experts.<kind>.bin per kind
// in a temporary directory, fsyncs, checks that the result loads, and renames it into place.
#include "convert/convert.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "backends/cpu/simd.h"
#include "core/error.h"
#include "core/log.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "format/checkpoint.h"
#include "format/file_io.h"
#include "format/json_file.h"
#include "models/load.h"
#include "models/registry.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// ---- finding the experts ----

enum class Proj { gate, up, down };

struct ExpertTensor {
  std::string name;
  int64_t expert = -1;  // -1: fused over all experts
  Proj proj;
};

// One MoE layer's experts as the checkpoint stores them.
struct ExpertLayer {
  std::string prefix;  // "model.layers.3.mlp.experts."
  int64_t layer = -1;  // model layer number
  bool fused = false;
  std::string source;  // "gate_proj,up_proj,down_proj", "w1,w3,w2" or "fused"
  std::vector<ExpertTensor> tensors;
  int64_t n_expert = 0, n_embd = 0, n_ff = 0;
  // Per expert, the checkpoint tensor of each projection (per-expert layout).
  std::vector<std::array<std::string, 3>> names;
};

// Splits a routed-expert tensor name into prefix and parts; false for everything else.
bool parse_expert_name(const std::string& name, std::string& prefix, ExpertTensor& t, std::string& proj_name) {
  static const std::string marker = "experts.";
  for (size_t pos = name.rfind(marker); pos != std::string::npos; pos = pos ? name.rfind(marker, pos - 1) : std::string::npos) {
    if (pos > 0 && name[pos - 1] != '.') continue;  // "experts." must start a name component
    const size_t rest_at = pos + marker.size();
    const std::string rest = name.substr(rest_at);
    if (rest == "gate_up_proj" || rest == "down_proj") {
      prefix = name.substr(0, rest_at);
      t = {name, -1, rest == "down_proj" ? Proj::down : Proj::gate};  // gate: the fused gate+up
      proj_name = rest;
      return true;
    }
    size_t dot = rest.find('.');
    if (dot == std::string::npos || dot == 0 || dot > 9) continue;
    const std::string digits = rest.substr(0, dot);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (digits.size() > 1 && digits[0] == '0') continue;
    const std::string tail = rest.substr(dot + 1);
    static const std::map<std::string, Proj> projs = {{"gate_proj.weight", Proj::gate}, {"up_proj.weight", Proj::up},
                                                      {"down_proj.weight", Proj::down}, {"w1.weight", Proj::gate},
                                                      {"w3.weight", Proj::up},          {"w2.weight", Proj::down}};
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

std::vector<ExpertLayer> find_expert_layers(const Checkpoint& ck, std::set<std::string>& expert_names) {
  std::map<std::string, ExpertLayer> by_prefix;
  std::map<std::string, std::string> scheme_of;  // prefix -> the first per-expert naming scheme seen
  for (const std::string& name : ck.names()) {
    std::string prefix, proj_name;
    ExpertTensor t;
    if (!parse_expert_name(name, prefix, t, proj_name)) continue;
    ExpertLayer& l = by_prefix[prefix];
    l.prefix = prefix;
    const bool hf = proj_name.find("_proj") != std::string::npos;
    if (t.expert >= 0) {
      const std::string scheme = hf ? "gate_proj,up_proj,down_proj" : "w1,w3,w2";
      auto [it, fresh] = scheme_of.emplace(prefix, scheme);
      SLUICE_CHECK(it->second == scheme, Status::corrupt, ck.dir().string(), ": experts under ", prefix,
                   " mix the names gate_proj/up_proj/down_proj and w1/w3/w2 (", name, ")");
    }
    l.tensors.push_back(t);
    expert_names.insert(name);
  }
  std::vector<ExpertLayer> layers;
  for (auto& [prefix, l] : by_prefix) {
    const std::string where = ck.dir().string() + ": experts " + prefix + "*";
    l.layer = layer_number(prefix);
    SLUICE_CHECK(l.layer >= 0, Status::unsupported, where, ": cannot tell the model layer of this prefix (expected ",
                 "\"...layers.<n>....experts.\")");
    size_t n_fused = std::count_if(l.tensors.begin(), l.tensors.end(), [](const ExpertTensor& t) { return t.expert < 0; });
    SLUICE_CHECK(n_fused == 0 || n_fused == l.tensors.size(), Status::corrupt, where,
                 ": holds both fused (gate_up_proj/down_proj) and per-expert tensors");
    auto check_float = [&](const std::string& name) {
      DType dt = ck.entry(name).dtype;
      SLUICE_CHECK(is_float(dt), Status::unsupported, ck.dir().string(), ": expert tensor ", name, " has dtype ",
                   dtype_name(dt), "; experts must be f32, bf16 or f16");
    };
    if (n_fused) {
      l.fused = true;
      l.source = "fused";
      const std::string gu = prefix + "gate_up_proj", dn = prefix + "down_proj";
      SLUICE_CHECK(ck.has(gu), Status::corrupt, where, ": has ", dn, " but no ", gu);
      SLUICE_CHECK(ck.has(dn), Status::corrupt, where, ": has ", gu, " but no ", dn);
      const auto &s_gu = ck.entry(gu).shape, &s_dn = ck.entry(dn).shape;
      SLUICE_CHECK(s_gu.size() == 3 && s_gu[1] % 2 == 0 && s_gu[0] > 0 && s_gu[1] > 0 && s_gu[2] > 0, Status::corrupt,
                   ck.dir().string(), ": tensor ", gu, " has shape ", shape_text(s_gu), ", expected [n_expert, 2 * n_ff, n_embd]");
      l.n_expert = s_gu[0];
      l.n_ff = s_gu[1] / 2;
      l.n_embd = s_gu[2];
      SLUICE_CHECK(s_dn == (std::vector<int64_t>{l.n_expert, l.n_embd, l.n_ff}), Status::corrupt, ck.dir().string(),
                   ": tensor ", dn, " has shape ", shape_text(s_dn), ", expected ",
                   shape_text({l.n_expert, l.n_embd, l.n_ff}), " to match ", gu, " ", shape_text(s_gu));
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
          SLUICE_CHECK(!l.names[e][p].empty(), Status::corrupt, where, ": expert ", e, " has no ", proj_names[p],
                       " (", prefix, e, ".", proj_names[p], ".weight)");
      const auto& g0 = ck.entry(l.names[0][0]).shape;
      SLUICE_CHECK(g0.size() == 2 && g0[0] > 0 && g0[1] > 0, Status::corrupt, ck.dir().string(), ": tensor ",
                   l.names[0][0], " has shape ", shape_text(g0), ", expected [n_ff, n_embd]");
      l.n_ff = g0[0];
      l.n_embd = g0[1];
      for (int64_t e = 0; e < l.n_expert; ++e)
        for (int p = 0; p < 3; ++p) {
          const std::string& name = l.names[e][p];
          const std::vector<int64_t> want = p == 2 ? std::vector<int64_t>{l.n_embd, l.n_ff} : std::vector<int64_t>{l.n_ff, l.n_embd};
          SLUICE_CHECK(ck.entry(name).shape == want, Status::corrupt, ck.dir().string(), ": tensor ", name, " has shape ",
                       shape_text(ck.entry(name).shape), ", expected ", shape_text(want), " like ", l.names[0][0], " ",
                       shape_text(g0));
          check_float(name);
        }
    }
    layers.push_back(std::move(l));
  }
  std::sort(layers.begin(), layers.end(), [](const ExpertLayer& a, const ExpertLayer& b) { return a.layer < b.layer; });
  for (size_t i = 1; i < layers.size(); ++i) {
    SLUICE_CHECK(layers[i].layer != layers[i - 1].layer, Status::corrupt, ck.dir().string(), ": layer ", layers[i].layer,
                 " has experts under two prefixes: ", layers[i - 1].prefix, " and ", layers[i].prefix);
    const ExpertLayer &a = layers[0], &b = layers[i];
    SLUICE_CHECK(a.n_expert == b.n_expert && a.n_embd == b.n_embd && a.n_ff == b.n_ff, Status::unsupported,
                 ck.dir().string(), ": experts differ in size between layers (", a.prefix, ": ", a.n_expert, " x [", a.n_ff,
                 ", ", a.n_embd, "], ", b.prefix, ": ", b.n_expert, " x [", b.n_ff, ", ", b.n_embd,
                 "]); a pack holds one expert size");
  }
  SLUICE_CHECK(!layers.empty(), Status::unsupported, ck.dir().string(),
               ": no routed experts found (tensors named <prefix>experts.<e>.gate_proj.weight, ...w1.weight, or "
               "<prefix>experts.gate_up_proj); a pack is for Mixture-of-Experts models");
  return layers;
}

// Where one projection of one expert lies in the checkpoint: one contiguous byte range.
struct SourceBlock {
  int fd = -1;
  std::string name;        // tensor, for messages
  uint64_t offset = 0;     // file offset of row 0
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0;
  int64_t row0 = 0;        // first row inside the tensor (fused layout), for messages
};

// ---- output files ----

// A data file being written: large sequential writes, O_DIRECT when the file system takes
// it (expert files: every write is 4096-aligned in address, size and offset), periodic
// write-back so the final fsync does not wait for gigabytes at once.
class OutFile {
 public:
  OutFile(const fs::path& path, bool direct) : path_(path) {
    int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    if (direct) {
      fd_ = ::open(path.c_str(), flags | O_DIRECT, 0644);
      if (fd_ >= 0) direct_ = true;
      else if (errno != EINVAL) fail(Status::io, path.string(), ": cannot create: ", errno_text(errno));
    }
    if (fd_ < 0) fd_ = ::open(path.c_str(), flags, 0644);
    if (fd_ < 0) fail(Status::io, path.string(), ": cannot create: ", errno_text(errno));
  }
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const uint8_t* p, size_t n) {
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
  void finish() {
    if (::fsync(fd_) != 0) fail(Status::io, path_.string(), ": fsync failed: ", errno_text(errno));
    if (::close(fd_) != 0) {
      fd_ = -1;
      fail(Status::io, path_.string(), ": close failed: ", errno_text(errno));
    }
    fd_ = -1;
  }
  uint64_t size() const { return size_; }
  bool direct() const { return direct_; }

 private:
  fs::path path_;
  int fd_ = -1;
  bool direct_ = false;
  uint64_t size_ = 0, synced_ = 0;
};

// 4096-aligned heap buffer (O_DIRECT needs aligned addresses).
struct AlignedBuffer {
  uint8_t* p = nullptr;
  size_t n = 0;
  explicit AlignedBuffer(size_t bytes) : n(bytes) {
    if (bytes) {
      p = static_cast<uint8_t*>(std::aligned_alloc(kPackRecordAlign, round_up(bytes, kPackRecordAlign)));
      SLUICE_CHECK(p, Status::out_of_memory, "convert: ", bytes, "-byte buffer");
    }
  }
  ~AlignedBuffer() { std::free(p); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};

void pread_all(int fd, uint8_t* buf, size_t size, uint64_t offset, const std::string& what) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, buf + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(Status::io, what, ": read failed: ", errno_text(errno));
    if (n == 0) fail(Status::corrupt, what, ": file ends early (truncated while converting?)");
    done += static_cast<size_t>(n);
  }
}

// Row `count` elements of src (dtype t) as f32.
void to_f32(const uint8_t* src, DType t, int64_t count, float* dst) {
  switch (t) {
    case DType::f32: std::memcpy(dst, src, static_cast<size_t>(count) * 4); return;
    case DType::bf16: cpu::convert_row<DType::bf16>(reinterpret_cast<const uint16_t*>(src), dst, count); return;
    case DType::f16: cpu::convert_row<DType::f16>(reinterpret_cast<const uint16_t*>(src), dst, count); return;
    default: SLUICE_ASSERT(is_float(t));
  }
}

// Converts `count` elements from dtype `from` to dtype `to` (floats; or a copy when equal).
void convert_elements(const uint8_t* src, DType from, uint8_t* dst, DType to, int64_t count, std::vector<float>& tmp) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(count) * dtype_size(from));
    return;
  }
  tmp.resize(static_cast<size_t>(count));
  to_f32(src, from, count, tmp.data());
  if (to == DType::f32) {
    std::memcpy(dst, tmp.data(), static_cast<size_t>(count) * 4);
  } else if (to == DType::bf16) {
    auto* o = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < count; ++i) o[i] = f32_to_bf16(tmp[i]);
  } else {
    SLUICE_ASSERT(to == DType::f16);
    auto* o = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < count; ++i) o[i] = f32_to_f16(tmp[i]);
  }
}

// Writes `dir` as a file with its contents fsynced (small files: manifest, tokenizer).
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

// Removes the temporary directory unless released (a failed or cancelled convert).
struct TempDirGuard {
  fs::path dir;
  bool armed = true;
  ~TempDirGuard() {
    if (!armed) return;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

// A batch of records in flight: one output buffer per kind.
struct Batch {
  int64_t r0 = 0, count = 0;
  std::vector<std::unique_ptr<AlignedBuffer>> out;  // per kind: count * stride bytes
};

// The writer thread: writes batches in order and checksums each record.
class BatchWriter {
 public:
  BatchWriter(std::vector<OutFile*> files, std::vector<PackKindInfo*> kinds)
      : files_(std::move(files)), kinds_(std::move(kinds)), thread_([this] { run(); }) {}
  ~BatchWriter() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Hands a batch over; waits while one is still queued (so at most two exist besides the
  // one being computed). Rethrows a write error.
  void push(Batch* b) {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return queued_ == nullptr || error_; });
    if (error_) std::rethrow_exception(error_);
    queued_ = b;
    cv_.notify_all();
  }
  // Waits until every batch handed over is written; rethrows a write error.
  void drain() {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return (queued_ == nullptr && !busy_) || error_; });
    if (error_) std::rethrow_exception(error_);
  }
  // True once `b` may be refilled.
  void wait_free(const Batch* b) {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return (queued_ != b && writing_ != b) || error_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run() {
    std::unique_lock<std::mutex> l(m_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || queued_; });
      if (!queued_) return;
      Batch* b = queued_;
      queued_ = nullptr;
      writing_ = b;
      busy_ = true;
      cv_.notify_all();
      l.unlock();
      try {
        for (size_t k = 0; k < kinds_.size(); ++k) {
          PackKindInfo& info = *kinds_[k];
          const uint8_t* base = b->out[k]->p;
          for (int64_t i = 0; i < b->count; ++i)
            info.checksums[static_cast<size_t>(b->r0 + i)] = XXH3_64bits(base + i * info.record_stride, info.record_bytes);
          files_[k]->write(base, static_cast<size_t>(b->count * info.record_stride));
        }
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

  std::vector<OutFile*> files_;
  std::vector<PackKindInfo*> kinds_;
  std::mutex m_;
  std::condition_variable cv_;
  Batch* queued_ = nullptr;
  const Batch* writing_ = nullptr;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

// The routed expert layers must be loaded by the family with exactly the pack's expert
// tensors; a dry run of the family loader over the checkpoint (which maps but does not read
// the weights) checks config, shapes and that every tensor is used, before anything is written.
void validate_against_family(const nlohmann::json& config, const Family& family, const fs::path& hf_dir) {
  auto backend = make_cpu_backend();
  CheckpointSource source(Checkpoint::open(hf_dir));
  family.load(config, source, *backend);
}

void check_cancel(const ConvertOptions& opt) {
  if (opt.cancel && opt.cancel->load()) fail(Status::io, "convert interrupted; nothing was written to the output");
}

}  // namespace

ConvertSummary convert_checkpoint(const fs::path& hf_dir, const fs::path& out_arg, const ConvertOptions& opt) {
  const auto t_start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t_start).count(); };
  SLUICE_CHECK(!opt.kinds.empty(), Status::invalid_argument, "convert: no expert kinds to write");

  // 1. The checkpoint and its family: fail before anything is written.
  std::error_code ec;
  SLUICE_CHECK(fs::is_directory(hf_dir, ec), Status::not_found, hf_dir.string(), ": no such checkpoint directory");
  SLUICE_CHECK(!Pack::is_pack(hf_dir), Status::invalid_argument, hf_dir.string(),
               " is already a sluice pack (convert reads an HF checkpoint directory)");
  const nlohmann::json config = read_json_file(hf_dir / "config.json");
  const Family& family = find_family(config);
  validate_against_family(config, family, hf_dir);
  Checkpoint ck = Checkpoint::open(hf_dir);
  std::set<std::string> expert_names;
  std::vector<ExpertLayer> layers = find_expert_layers(ck, expert_names);

  // 2. The output location.
  fs::path out_dir = fs::absolute(out_arg).lexically_normal();
  if (out_dir.filename().empty()) out_dir = out_dir.parent_path();  // "pack/"
  const fs::path parent = out_dir.parent_path();
  SLUICE_CHECK(!out_dir.filename().empty(), Status::invalid_argument, "convert: bad output directory ", out_arg.string());
  SLUICE_CHECK(fs::is_directory(parent, ec), Status::not_found, "convert: the parent of the output, ", parent.string(),
               ", is not a directory");
  bool replace = false;
  if (fs::exists(out_dir, ec)) {
    const bool is_pack = Pack::is_pack(out_dir);
    const bool empty_dir = fs::is_directory(out_dir, ec) && fs::is_empty(out_dir, ec);
    SLUICE_CHECK(is_pack || empty_dir, Status::invalid_argument, "convert: ", out_dir.string(),
                 " exists and is not a sluice pack; refusing to replace it");
    SLUICE_CHECK(!is_pack || opt.force, Status::invalid_argument, "convert: ", out_dir.string(),
                 " already holds a pack; pass --force to replace it");
    replace = is_pack;
  }
  TempDirGuard tmp{parent / ("." + out_dir.filename().string() + ".partial-" + std::to_string(::getpid()))};
  fs::remove_all(tmp.dir, ec);
  fs::create_directory(tmp.dir, ec);
  SLUICE_CHECK(!ec, Status::io, tmp.dir.string(), ": cannot create: ", ec.message());

  // 3. The manifest skeleton.
  const ExpertLayer& L0 = layers.front();
  PackManifest m;
  m.family = std::string(family.model_type);
  m.config = config;
  m.n_expert = L0.n_expert;
  m.n_embd = L0.n_embd;
  m.n_ff = L0.n_ff;
  for (const ExpertLayer& l : layers) {
    m.moe_layers.push_back(l.layer);
    m.expert_prefixes.push_back(l.prefix);
    m.expert_sources.push_back(l.source);
  }
  std::vector<std::string> dense_names;
  bool all_bf16 = true;
  uint64_t bytes_total = 0;
  for (const std::string& name : ck.names()) {
    const SafetensorsEntry& e = ck.entry(name);
    bytes_total += e.end - e.begin;
    if (expert_names.count(name)) continue;
    dense_names.push_back(name);
    if (is_float(e.dtype) && e.dtype != DType::bf16) all_bf16 = false;
  }
  m.dense_dtype = opt.dense_dtype.value_or(all_bf16 ? DType::bf16 : DType::f32);
  SLUICE_CHECK(is_float(m.dense_dtype), Status::invalid_argument, "convert: dense dtype must be f32 or bf16");
  std::vector<ExpertKind> kinds = opt.kinds;
  std::sort(kinds.begin(), kinds.end());
  for (ExpertKind k : kinds) {
    PackKindInfo info = pack_kind_layout(k, m.n_embd, m.n_ff);
    info.checksums.assign(static_cast<size_t>(m.n_records()), 0);
    m.kinds[k] = std::move(info);
  }

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
    OutFile out(tmp.dir / kPackDenseName, false);
    XXH3_state_t* st = XXH3_createState();
    SLUICE_CHECK(st, Status::out_of_memory, "convert: XXH3 state");
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st_guard(st, XXH3_freeState);
    XXH3_64bits_reset(st);
    // Header placeholder: the payload size is known only at the end; the header page is
    // rewritten then (it is outside the checksum).
    std::vector<uint8_t> header = pack_file_header("dense", 0);
    out.write(header.data(), header.size());
    constexpr size_t kChunkElems = size_t{4} << 20;
    std::vector<uint8_t> in_buf, out_buf;
    std::vector<float> tmpf;
    const uint8_t zeros[kPackBlockAlign] = {};
    for (const std::string& name : dense_names) {
      const SafetensorsEntry& e = ck.entry(name);
      SLUICE_CHECK(e.shape.size() >= 1 && e.shape.size() <= 4, Status::unsupported, ck.dir().string(), ": tensor ", name,
                   " has ", e.shape.size(), " dimensions (the pack holds 1 to 4)");
      const DType to = is_float(e.dtype) ? m.dense_dtype : e.dtype;
      const uint64_t pad = round_up(out.size(), kPackBlockAlign) - out.size();
      if (pad) {
        out.write(zeros, pad);
        XXH3_64bits_update(st, zeros, pad);
      }
      PackDenseTensor t{name, to, e.shape, out.size(), 0};
      const uint64_t n_elem = (e.end - e.begin) / dtype_size(e.dtype);
      const int fd = fd_of(name);
      for (uint64_t done = 0; done < n_elem;) {
        check_cancel(opt);
        const uint64_t cnt = std::min<uint64_t>(kChunkElems, n_elem - done);
        in_buf.resize(cnt * dtype_size(e.dtype));
        out_buf.resize(cnt * dtype_size(to));
        pread_all(fd, in_buf.data(), in_buf.size(), file_offset(name) + done * dtype_size(e.dtype),
                  str(ck.file_of(name).path().string(), ": tensor ", name));
        convert_elements(in_buf.data(), e.dtype, out_buf.data(), to, static_cast<int64_t>(cnt), tmpf);
        out.write(out_buf.data(), out_buf.size());
        XXH3_64bits_update(st, out_buf.data(), out_buf.size());
        done += cnt;
        t.bytes += out_buf.size();
        prog.bytes_done += in_buf.size();
        report("dense");
      }
      m.dense.push_back(std::move(t));
    }
    m.dense_file_bytes = out.size();
    m.dense_checksum = XXH3_64bits_digest(st);
    out.finish();
    bytes_out += m.dense_file_bytes;
    // The real header.
    header = pack_file_header("dense", m.dense_file_bytes - kPackHeaderBytes);
    int fd = ::open((tmp.dir / kPackDenseName).c_str(), O_WRONLY | O_CLOEXEC);
    SLUICE_CHECK(fd >= 0, Status::io, (tmp.dir / kPackDenseName).string(), ": cannot reopen: ", errno_text(errno));
    ssize_t w = ::pwrite(fd, header.data(), header.size(), 0);
    int err = errno;
    bool ok = w == static_cast<ssize_t>(header.size()) && ::fsync(fd) == 0;
    ::close(fd);
    SLUICE_CHECK(ok, Status::io, (tmp.dir / kPackDenseName).string(), ": header write failed: ", errno_text(err));
  }

  // 5. Expert records, a batch at a time.
  std::vector<std::unique_ptr<OutFile>> files;
  std::vector<OutFile*> file_ptrs;
  std::vector<PackKindInfo*> infos;
  for (ExpertKind k : kinds) {
    PackKindInfo& info = m.kinds[k];
    files.push_back(std::make_unique<OutFile>(tmp.dir / info.file, true));
    AlignedBuffer h(kPackHeaderBytes);
    std::vector<uint8_t> header = pack_file_header(expert_kind_name(k), static_cast<uint64_t>(m.n_records()) * info.record_stride);
    std::memcpy(h.p, header.data(), header.size());
    files.back()->write(h.p, kPackHeaderBytes);
    file_ptrs.push_back(files.back().get());
    infos.push_back(&info);
  }
  const int64_t E = m.n_expert, d = m.n_embd, ff = m.n_ff;
  const uint64_t src_elem = dtype_size(ck.entry(layers[0].fused ? layers[0].prefix + "gate_up_proj" : layers[0].names[0][0]).dtype);
  const uint64_t record_in_bytes = static_cast<uint64_t>(3 * ff * d) * std::max<uint64_t>(src_elem, 2);
  // Records per batch: about batch_bytes of checkpoint data, at least one record, and at
  // most four layers' worth (tiny experts would otherwise make one batch of everything).
  const int64_t per_batch = std::clamp<int64_t>(static_cast<int64_t>(opt.batch_bytes / std::max<uint64_t>(1, record_in_bytes)), 1, E * 4);
  Batch batches[2];
  for (Batch& b : batches)
    for (ExpertKind k : kinds) b.out.push_back(std::make_unique<AlignedBuffer>(per_batch * m.kinds[k].record_stride));

  // The source block of (record, projection).
  auto source_of = [&](int64_t rec, int p) {
    const ExpertLayer& l = layers[static_cast<size_t>(rec / E)];
    const int64_t e = rec % E;
    SourceBlock s;
    if (l.fused) {
      s.name = l.prefix + (p == 2 ? "down_proj" : "gate_up_proj");
      const SafetensorsEntry& en = ck.entry(s.name);
      s.dtype = en.dtype;
      s.rows = p == 2 ? d : ff;
      s.cols = p == 2 ? ff : d;
      s.row0 = p == 2 ? e * d : e * 2 * ff + (p == 1 ? ff : 0);
      s.offset = file_offset(s.name) + static_cast<uint64_t>(s.row0 * s.cols) * dtype_size(en.dtype);
    } else {
      s.name = l.names[static_cast<size_t>(e)][p];
      const SafetensorsEntry& en = ck.entry(s.name);
      s.dtype = en.dtype;
      s.rows = p == 2 ? d : ff;
      s.cols = p == 2 ? ff : d;
      s.offset = file_offset(s.name);
    }
    s.fd = fd_of(s.name);
    return s;
  };

  {
    BatchWriter writer(file_ptrs, infos);
    ThreadPool& pool = ThreadPool::global();
    constexpr int64_t kChunkBytes = int64_t{1} << 20;  // input bytes per work item
    int which = 0;
    for (int64_t r0 = 0; r0 < m.n_records(); r0 += per_batch, which ^= 1) {
      check_cancel(opt);
      Batch& b = batches[which];
      writer.wait_free(&b);
      b.r0 = r0;
      b.count = std::min(per_batch, m.n_records() - r0);
      // Work items: (record, projection, row chunk).
      struct Item {
        SourceBlock src;
        int64_t rec, row_begin, row_end;
        int proj;
      };
      std::vector<Item> items;
      for (int64_t i = 0; i < b.count; ++i)
        for (int p = 0; p < 3; ++p) {
          SourceBlock s = source_of(r0 + i, p);
          const int64_t row_bytes = s.cols * static_cast<int64_t>(dtype_size(s.dtype));
          const int64_t rows_per_item = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, row_bytes));
          for (int64_t r = 0; r < s.rows; r += rows_per_item) items.push_back({s, r0 + i, r, std::min(s.rows, r + rows_per_item), p});
        }
      std::atomic<uint64_t> bytes_in{0};
      pool.parallel_for(static_cast<int64_t>(items.size()), 1, [&](int64_t i0, int64_t i1) {
        std::vector<uint8_t> in;
        std::vector<float> row;
        for (int64_t it = i0; it < i1; ++it) {
          const Item& item = items[static_cast<size_t>(it)];
          const SourceBlock& s = item.src;
          const size_t esz = dtype_size(s.dtype);
          const size_t row_bytes = static_cast<size_t>(s.cols) * esz;
          in.resize(row_bytes * static_cast<size_t>(item.row_end - item.row_begin));
          pread_all(s.fd, in.data(), in.size(), s.offset + static_cast<uint64_t>(item.row_begin) * row_bytes,
                    str(ck.file_of(s.name).path().string(), ": tensor ", s.name));
          bytes_in += in.size();
          row.resize(static_cast<size_t>(s.cols));
          for (int64_t r = item.row_begin; r < item.row_end; ++r) {
            const uint8_t* src = in.data() + static_cast<size_t>(r - item.row_begin) * row_bytes;
            to_f32(src, s.dtype, s.cols, row.data());
            for (size_t k = 0; k < kinds.size(); ++k) {
              const PackKindInfo& info = *infos[k];
              const PackBlock& blk = item.proj == 0 ? info.gate : item.proj == 1 ? info.up : info.down;
              uint8_t* rec = b.out[k]->p + (item.rec - r0) * info.record_stride;
              if (info.kind == ExpertKind::bf16) {
                auto* o = reinterpret_cast<uint16_t*>(rec + blk.offset) + r * s.cols;
                if (s.dtype == DType::bf16) std::memcpy(o, src, row_bytes);
                else for (int64_t c = 0; c < s.cols; ++c) o[c] = f32_to_bf16(row[static_cast<size_t>(c)]);
                continue;
              }
              const DType qt = expert_kind_dtype(info.kind);
              const bool ok = quantize_row(qt, row.data(), s.cols, rec + blk.offset + r * quant_row_bytes(qt, s.cols),
                                           rec + blk.scale_offset + r * quant_scale_row_bytes(qt, s.cols));
              if (!ok)
                fail(Status::corrupt, ck.dir().string(), ": tensor ", s.name, " row ", s.row0 + r,
                     " holds a NaN or an infinity, or values beyond the f16 scale range (cannot quantize to ",
                     expert_kind_name(info.kind), ")");
            }
          }
        }
      });
      // Zero the record padding and the gaps between blocks (the buffers are reused).
      for (size_t k = 0; k < kinds.size(); ++k) {
        const PackKindInfo& info = *infos[k];
        std::vector<std::pair<uint64_t, uint64_t>> used = {{info.gate.offset, info.gate.bytes}, {info.gate.scale_offset, info.gate.scale_bytes},
                                                           {info.up.offset, info.up.bytes},     {info.up.scale_offset, info.up.scale_bytes},
                                                           {info.down.offset, info.down.bytes}, {info.down.scale_offset, info.down.scale_bytes}};
        std::sort(used.begin(), used.end());
        for (int64_t i = 0; i < b.count; ++i) {
          uint8_t* rec = b.out[k]->p + i * info.record_stride;
          uint64_t at = 0;
          for (auto [off, n] : used) {
            if (!n) continue;
            if (off > at) std::memset(rec + at, 0, off - at);
            at = std::max(at, off + n);
          }
          std::memset(rec + at, 0, info.record_stride - at);
        }
      }
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

  // 6. Tokenizer files and the manifest (last: a directory without it is not a pack).
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    if (!fs::is_regular_file(hf_dir / name, ec)) continue;
    std::string bytes = read_file_bytes(hf_dir / name, json_file_max, "a tokenizer file");
    write_small_file(tmp.dir / name, bytes.data(), bytes.size());
    m.tokenizer_files.push_back(name);
  }
  const std::string manifest = pack_manifest_to_json(m);
  write_small_file(tmp.dir / kPackManifestName, manifest.data(), manifest.size());
  fsync_dir(tmp.dir);

  // 7. The result must load as its family at every kind (cheap: weights are mapped, not read).
  for (ExpertKind k : kinds) {
    try {
      auto backend = make_cpu_backend();
      LoadOptions lo;
      lo.expert_kind = k;
      load_model(tmp.dir, *backend, lo);
    } catch (const Error& e) {
      fail(Status::internal, "convert: the written pack does not load at kind ", expert_kind_name(k), ": ", e.what());
    }
  }

  // 8. Into place.
  if (replace) {
    if (::renameat2(AT_FDCWD, tmp.dir.c_str(), AT_FDCWD, out_dir.c_str(), RENAME_EXCHANGE) != 0)
      fail(Status::io, "convert: cannot swap ", tmp.dir.string(), " with ", out_dir.string(), ": ", errno_text(errno));
    // tmp.dir now holds the old pack; the guard removes it.
  } else {
    if (::rename(tmp.dir.c_str(), out_dir.c_str()) != 0)
      fail(Status::io, "convert: cannot rename ", tmp.dir.string(), " to ", out_dir.string(), ": ", errno_text(errno));
    tmp.armed = false;
  }
  fsync_dir(parent);

  ConvertSummary s;
  s.out_dir = out_dir;
  s.family = m.family;
  s.n_records = m.n_records();
  s.bytes_in = bytes_total;
  s.bytes_out = bytes_out;
  s.seconds = elapsed();
  s.dense_dtype = m.dense_dtype;
  s.kinds = kinds;
  return s;
}

}  // namespace sluice
