// Synthetic qwen3_moe checkpoints, streamed to disk.
#include "convert/synthetic.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
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
  nlohmann::ordered_json config = {
      {"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"vocab_size", s.n_vocab},
      {"hidden_size", s.n_embd}, {"num_hidden_layers", s.n_layer}, {"num_attention_heads", s.n_head},
      {"num_key_value_heads", s.n_head_kv}, {"head_dim", s.head_dim}, {"intermediate_size", 4 * s.n_embd},
      {"moe_intermediate_size", s.n_ff}, {"num_experts", s.n_expert}, {"num_experts_per_tok", s.n_expert_used},
      {"norm_topk_prob", true}, {"decoder_sparse_step", 1}, {"mlp_only_layers", nlohmann::json::array()},
      {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 4096},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}}, {"tie_word_embeddings", false}};
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
  // xorshift64*: fast, deterministic; values uniform in about +-0.05 (norms: 1 +- 0.05).
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::vector<uint16_t> buf(size_t{4} << 20);
  for (const Entry& e : list) {
    uint64_t left = e.bytes() / 2;
    while (left) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
      for (size_t i = 0; i < n; ++i) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        const uint64_t r = x * 0x2545F4914F6CDD1Dull;
        const float u = static_cast<float>(static_cast<int32_t>(r >> 32)) * (0.05f / 2147483648.0f);
        buf[i] = f32_to_bf16(e.norm ? 1.0f + u : u);
      }
      write_all(buf.data(), n * 2);
      left -= n;
    }
  }
  if (::close(fd) != 0) fail(Status::io, path.string(), ": close failed: ", errno_text(errno));
  return 8 + text.size() + offset;
}

}  // namespace sluice
