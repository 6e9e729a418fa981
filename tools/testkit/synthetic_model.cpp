// Synthetic qwen3_moe checkpoints, streamed to disk.
#include "testkit/synthetic_model.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <xxhash.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "format/file_io.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

struct Entry {
  std::string name;
  std::vector<int64_t> shape;
  bool norm;  // values near 1 instead of near 0
  uint64_t bytes() const {
    uint64_t n = 2;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};

std::vector<Entry> entries(const SyntheticSpec& s) {
  const int64_t d = s.n_embd, hq = s.n_head * s.head_dim, hkv = s.n_head_kv * s.head_dim;
  std::vector<Entry> out = {{"model.embed_tokens.weight", {s.n_vocab, d}, false},
                            {"model.norm.weight", {d}, true},
                            {"lm_head.weight", {s.n_vocab, d}, false}};
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {d}, true});
    out.push_back({p + "post_attention_layernorm.weight", {d}, true});
    out.push_back({p + "self_attn.q_proj.weight", {hq, d}, false});
    out.push_back({p + "self_attn.k_proj.weight", {hkv, d}, false});
    out.push_back({p + "self_attn.v_proj.weight", {hkv, d}, false});
    out.push_back({p + "self_attn.o_proj.weight", {d, hq}, false});
    out.push_back({p + "self_attn.q_norm.weight", {s.head_dim}, true});
    out.push_back({p + "self_attn.k_norm.weight", {s.head_dim}, true});
    out.push_back({p + "mlp.gate.weight", {s.n_expert, d}, false});
    for (int64_t e = 0; e < s.n_expert; ++e) {
      const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
      out.push_back({ep + "gate_proj.weight", {s.n_ff, d}, false});
      out.push_back({ep + "up_proj.weight", {s.n_ff, d}, false});
      out.push_back({ep + "down_proj.weight", {d, s.n_ff}, false});
    }
  }
  return out;
}

uint64_t layer_bytes(const SyntheticSpec& s) {
  const int64_t d = s.n_embd;
  return 2 * static_cast<uint64_t>(2 * d + 2 * s.n_head * s.head_dim * d + 2 * s.n_head_kv * s.head_dim * d + 2 * s.head_dim +
                                   s.n_expert * d + s.n_expert * 3 * s.n_ff * d);
}

nlohmann::ordered_json synthetic_config(const SyntheticSpec& s) {
  return {
      {"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"vocab_size", s.n_vocab},
      {"hidden_size", s.n_embd}, {"num_hidden_layers", s.n_layer}, {"num_attention_heads", s.n_head},
      {"num_key_value_heads", s.n_head_kv}, {"head_dim", s.head_dim}, {"intermediate_size", 4 * s.n_embd},
      {"moe_intermediate_size", s.n_ff}, {"num_experts", s.n_expert}, {"num_experts_per_tok", s.n_expert_used},
      {"norm_topk_prob", true}, {"decoder_sparse_step", 1}, {"mlp_only_layers", nlohmann::json::array()},
      {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 4096},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}}, {"tie_word_embeddings", false}};
}

// xorshift64*: fast, deterministic.
struct Rng {
  uint64_t x;
  explicit Rng(uint64_t seed) : x(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return x * 0x2545F4914F6CDD1Dull;
  }
};

// Random bf16 weights in about +-amplitude (norms: 1 +- amplitude).
void fill_bf16(Rng& rng, uint16_t* out, size_t n, bool norm, float amplitude = 0.05f) {
  for (size_t i = 0; i < n; ++i) {
    const float u = static_cast<float>(static_cast<int32_t>(rng.next() >> 32)) * (amplitude / 2147483648.0f);
    out[i] = f32_to_bf16(norm ? 1.0f + u : u);
  }
}

// Random bytes: n rounded down to whole words, the tail byte by byte.
void fill_bytes(Rng& rng, uint8_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng.next();
    std::memcpy(out + i, &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<uint8_t>(rng.next() >> 56);
}

// One block of a record: values and scales that dequantize to small weights (|w| < 0.02).
void fill_block(Rng& rng, DType kind, const PackBlock& b, uint8_t* rec) {
  uint8_t* v = rec + b.offset;
  switch (kind) {
    case DType::bf16: {
      // sign and mantissa random, exponent 2^-7: |w| in [0.0078, 0.0156)
      auto* w = reinterpret_cast<uint16_t*>(v);
      const size_t n = b.bytes / 2;
      for (size_t i = 0; i + 4 <= n; i += 4) {
        const uint64_t r = rng.next();
        for (int j = 0; j < 4; ++j) w[i + j] = static_cast<uint16_t>(((r >> (16 * j)) & 0x807F) | 0x3C00);
      }
      for (size_t i = n / 4 * 4; i < n; ++i) w[i] = static_cast<uint16_t>((rng.next() & 0x807F) | 0x3C00);
      return;
    }
    case DType::q8: {
      fill_bytes(rng, v, b.bytes);
      for (uint64_t i = 0; i < b.bytes; ++i)
        if (v[i] == 0x80) v[i] = 0x81;  // the quantizer's range is [-127, 127]
      auto* sc = reinterpret_cast<float*>(rec + b.scale_offset);
      for (uint64_t i = 0; i < b.scale_bytes / 4; ++i) sc[i] = 1e-4f * (1.0f + static_cast<float>(rng.next() >> 40) * 0x1p-24f);
      return;
    }
    case DType::q4:
    case DType::q2: {
      // Every 4-bit and 2-bit code is valid. The weights must average zero, or every expert
      // adds the same direction to the residual stream and routing collapses onto a few
      // experts: q4 scales get a random sign (codes average 7.5, not the zero point 8), q2
      // offsets sit at -1.5 scales (codes 0..3 give -1.5, -0.5, 0.5, 1.5 scales).
      fill_bytes(rng, v, b.bytes);
      auto* sc = reinterpret_cast<uint16_t*>(rec + b.scale_offset);
      const size_t n = b.scale_bytes / 2;
      for (size_t i = 0; i < n; ++i) {
        const uint64_t r = rng.next();
        const uint16_t m = static_cast<uint16_t>(r & 0x3FF);
        if (kind == DType::q4) {
          sc[i] = static_cast<uint16_t>(0x1000 | m | ((r >> 20) & 1) << 15);  // +-2^-11 (1 + m)
        } else {
          const uint16_t scale = 0x1400 | m;  // 2^-10 (1 + m)
          sc[i] = scale;
          sc[i + 1] = f32_to_f16(-1.5f * f16_to_f32(scale));
          ++i;
        }
      }
      return;
    }
    default: break;
  }
}

void write_all_at(int fd, const void* p, size_t n, uint64_t offset, const fs::path& path) {
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::pwrite(fd, static_cast<const char*>(p) + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail(Status::io, path.string(), ": write failed: ", errno_text(errno));
    done += static_cast<size_t>(w);
  }
}

struct OutFd {
  int fd;
  fs::path path;
  explicit OutFd(const fs::path& p) : fd(::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)), path(p) {
    if (fd < 0) fail(Status::io, p.string(), ": cannot create: ", errno_text(errno));
  }
  void sync_close() {
    const bool ok = ::fsync(fd) == 0;
    const int err = errno;
    ::close(fd);
    fd = -1;
    if (!ok) fail(Status::io, path.string(), ": fsync failed: ", errno_text(err));
  }
  ~OutFd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

SyntheticSpec synthetic_spec_for_bytes(uint64_t bytes) {
  SyntheticSpec s;
  const uint64_t fixed = 2 * static_cast<uint64_t>(2 * s.n_vocab * s.n_embd + s.n_embd);
  const uint64_t per_layer = layer_bytes(s);
  s.n_layer = std::max<int64_t>(1, static_cast<int64_t>((bytes > fixed ? bytes - fixed : 0) + per_layer / 2) /
                                       static_cast<int64_t>(per_layer));
  return s;
}

uint64_t write_synthetic_checkpoint(const fs::path& dir, const SyntheticSpec& s, uint64_t seed) {
  fs::create_directories(dir);
  const nlohmann::ordered_json config = synthetic_config(s);
  std::ofstream(dir / "config.json") << config.dump(2) << "\n";

  const std::vector<Entry> list = entries(s);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const Entry& e : list) {
    header[e.name] = {{"dtype", "BF16"}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes()}}};
    offset += e.bytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const fs::path path = dir / "model.safetensors";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(Status::io, path.string(), ": cannot create: ", errno_text(errno));
  auto write_all = [&](const void* p, size_t n) {
    size_t done = 0;
    while (done < n) {
      ssize_t w = ::write(fd, static_cast<const char*>(p) + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        int err = errno;
        ::close(fd);
        fail(Status::io, path.string(), ": write failed: ", errno_text(err));
      }
      done += static_cast<size_t>(w);
    }
  };
  uint64_t len = text.size();
  write_all(&len, 8);  // little-endian host
  write_all(text.data(), text.size());
  Rng rng(seed);
  std::vector<uint16_t> buf(size_t{4} << 20);
  for (const Entry& e : list) {
    uint64_t left = e.bytes() / 2;
    while (left) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
      fill_bf16(rng, buf.data(), n, e.norm);
      write_all(buf.data(), n * 2);
      left -= n;
    }
  }
  if (::close(fd) != 0) fail(Status::io, path.string(), ": close failed: ", errno_text(errno));
  return 8 + text.size() + offset;
}

}  // namespace sluice

namespace sluice {

uint64_t write_synthetic_pack(const fs::path& dir, const SyntheticSpec& s, const std::vector<DType>& kinds_in,
                              uint64_t seed) {
  SLUICE_CHECK(!kinds_in.empty(), Status::invalid_argument, "synthetic pack: no expert kinds");
  SLUICE_CHECK(!Pack::is_pack(dir), Status::invalid_argument, dir.string(), " already holds a pack");
  fs::create_directories(dir);
  PackManifest m;
  m.family = "qwen3_moe";
  m.config = nlohmann::json::parse(synthetic_config(s).dump());
  m.dense_dtype = DType::bf16;
  m.n_expert = s.n_expert;
  m.n_embd = s.n_embd;
  m.n_ff = s.n_ff;
  for (int64_t l = 0; l < s.n_layer; ++l) {
    m.moe_layers.push_back(l);
    m.expert_prefixes.push_back("model.layers." + std::to_string(l) + ".mlp.experts.");
    m.expert_sources.push_back("gate_proj,up_proj,down_proj");
  }

  // dense.bin: the header page, then every non-expert tensor 64-byte aligned.
  {
    OutFd out(dir / kPackDenseName);
    XXH3_state_t* st = XXH3_createState();
    SLUICE_CHECK(st, Status::out_of_memory, "synthetic pack: XXH3 state");
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> guard(st, XXH3_freeState);
    XXH3_64bits_reset(st);
    uint64_t at = kPackHeaderBytes;
    Rng rng(seed ^ 0xD1B54A32D192ED03ull);
    std::vector<uint16_t> buf;
    const uint8_t zeros[kPackBlockAlign] = {};
    for (const Entry& e : entries(s)) {
      if (e.name.find(".mlp.experts.") != std::string::npos) continue;
      const uint64_t pad = (at + kPackBlockAlign - 1) / kPackBlockAlign * kPackBlockAlign - at;
      if (pad) {
        write_all_at(out.fd, zeros, pad, at, out.path);
        XXH3_64bits_update(st, zeros, pad);
        at += pad;
      }
      m.dense.push_back({e.name, DType::bf16, e.shape, at, e.bytes()});
      // The token's own signal must dominate the residual stream, or the attention output
      // (an average over the context, nearly the same for every later position) does and
      // every token routes to the same few experts: embeddings of +-1, o_proj of +-0.002.
      const bool embd = e.name == "model.embed_tokens.weight";
      const bool o_proj = std::string_view(e.name).ends_with("o_proj.weight");
      const float amplitude = embd ? 1.0f : o_proj ? 0.002f : 0.05f;
      for (uint64_t left = e.bytes() / 2; left;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(left, uint64_t{4} << 20));
        buf.resize(n);
        fill_bf16(rng, buf.data(), n, e.norm, amplitude);
        write_all_at(out.fd, buf.data(), n * 2, at, out.path);
        XXH3_64bits_update(st, buf.data(), n * 2);
        at += n * 2;
        left -= n;
      }
    }
    m.dense_file_bytes = at;
    m.dense_checksum = XXH3_64bits_digest(st);
    const std::vector<uint8_t> header = pack_file_header("dense", at - kPackHeaderBytes);
    write_all_at(out.fd, header.data(), header.size(), 0, out.path);
    out.sync_close();
  }

  // experts.<kind>.bin: records generated in parallel a batch at a time.
  std::vector<DType> kinds = kinds_in;
  std::sort(kinds.begin(), kinds.end());
  kinds.erase(std::unique(kinds.begin(), kinds.end()), kinds.end());
  uint64_t expert_bytes = 0;
  const int64_t n_records = m.n_records();
  for (DType kind : kinds) {
    PackKindInfo info = pack_kind_layout(kind, s.n_embd, s.n_ff);
    info.checksums.assign(static_cast<size_t>(n_records), 0);
    OutFd out(dir / info.file);
    const std::vector<uint8_t> header = pack_file_header(expert_kind_name(kind), static_cast<uint64_t>(n_records) * info.record_stride);
    write_all_at(out.fd, header.data(), header.size(), 0, out.path);
    // About 64 MiB of records per batch (at least one).
    const int64_t per_batch = std::max<int64_t>(1, static_cast<int64_t>((uint64_t{64} << 20) / info.record_stride));
    std::vector<uint8_t> batch(static_cast<size_t>(per_batch * static_cast<int64_t>(info.record_stride)));
    for (int64_t r0 = 0; r0 < n_records; r0 += per_batch) {
      const int64_t count = std::min(per_batch, n_records - r0);
      std::fill(batch.begin(), batch.begin() + count * static_cast<int64_t>(info.record_stride), 0);
      ThreadPool::global().parallel_for(count, 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t r = r0 + i;
          uint8_t* rec = batch.data() + i * static_cast<int64_t>(info.record_stride);
          Rng rng(seed * 1000003 + static_cast<uint64_t>(r) * 8 + static_cast<uint64_t>(kind) + 1);
          for (const PackBlock* b : {&info.gate, &info.up, &info.down}) fill_block(rng, kind, *b, rec);
          info.checksums[static_cast<size_t>(r)] = XXH3_64bits(rec, info.record_bytes);
        }
      });
      write_all_at(out.fd, batch.data(), static_cast<size_t>(count * static_cast<int64_t>(info.record_stride)),
                   kPackHeaderBytes + static_cast<uint64_t>(r0) * info.record_stride, out.path);
    }
    out.sync_close();
    expert_bytes += static_cast<uint64_t>(n_records) * info.record_stride;
    m.kinds[kind] = std::move(info);
  }

  // The manifest last: a directory without it is not a pack.
  const std::string manifest = pack_manifest_to_json(m);
  const std::span<const uint8_t> part(reinterpret_cast<const uint8_t*>(manifest.data()), manifest.size());
  write_file_atomic(dir / kPackManifestName, std::span<const std::span<const uint8_t>>(&part, 1));
  Pack::open(dir, false);  // checks what was written
  return expert_bytes;
}

}  // namespace sluice
