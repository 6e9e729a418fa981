// RoPE inverse frequencies, following transformers' modeling_rope_utils.py step by step in
// f32 (the reference computes them in f32; doing it in double would differ in the last bits).
#include "models/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/thread_pool.h"

namespace sluice {
namespace {

double get_number(const nlohmann::json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) fail(Status::corrupt, "rope parameter ", key, " is not a number");
  return it->get<double>();
}

// 1 / base^(2i / dim) for i < dim/2, in f32 like torch.
std::vector<float> default_inv_freq(double base, int64_t dim) {
  std::vector<float> inv(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(base), exponent);
  }
  return inv;
}

}  // namespace

RopeConfig rope_config_from_json(const nlohmann::json& cfg, const std::string& family, int64_t head_dim,
                                 int64_t max_position_embeddings, double default_theta) {
  nlohmann::json params = nlohmann::json::object();
  if (auto it = cfg.find("rope_parameters"); it != cfg.end() && it->is_object()) {
    params = *it;
  } else if (auto it2 = cfg.find("rope_scaling"); it2 != cfg.end() && it2->is_object()) {
    params = *it2;
  }
  RopeConfig rope;
  rope.theta = get_number(params, "rope_theta", get_number(cfg, "rope_theta", default_theta));
  if (auto it = params.find("rope_type"); it != params.end() && it->is_string()) rope.type = *it;
  else if (auto it2 = params.find("type"); it2 != params.end() && it2->is_string()) rope.type = *it2;
  double partial = get_number(params, "partial_rotary_factor", get_number(cfg, "partial_rotary_factor", 1.0));
  SLUICE_CHECK(partial > 0 && partial <= 1, Status::corrupt, family, ": partial_rotary_factor (", partial,
               ") must be in (0, 1]");
  rope.rot_dim = static_cast<int64_t>(static_cast<double>(head_dim) * partial);
  SLUICE_CHECK(rope.rot_dim >= 2 && rope.rot_dim % 2 == 0, Status::corrupt, family,
               ": rotary dimension (", rope.rot_dim, ") must be even and at least 2");
  SLUICE_CHECK(rope.theta > 0, Status::corrupt, family, ": rope_theta (", rope.theta, ") must be positive");
  const int64_t dim = rope.rot_dim;

  if (rope.type == "default") {
    rope.inv_freq = default_inv_freq(rope.theta, dim);
  } else if (rope.type == "proportional") {
    // Gemma 4's full-attention layers: all head_dim dims take part (rot_dim = head_dim, neox
    // pairs i, i + head_dim / 2), the first int(partial head_dim / 2) pairs at 1 /
    // base^(2i / head_dim) / factor, the rest at frequency 0 (cos 1, sin 0: unrotated).
    const double factor = get_number(params, "factor", 1.0);
    SLUICE_CHECK(factor > 0, Status::corrupt, family, ": proportional rope needs factor > 0");
    rope.rot_dim = head_dim;
    rope.inv_freq.assign(static_cast<size_t>(head_dim / 2), 0.0f);
    const int64_t angles = static_cast<int64_t>(partial * static_cast<double>(head_dim) / 2);
    for (int64_t i = 0; i < angles; ++i) {
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
      rope.inv_freq[static_cast<size_t>(i)] =
          1.0f / std::pow(static_cast<float>(rope.theta), exponent) / static_cast<float>(factor);
    }
  } else if (rope.type == "linear") {
    double factor = get_number(params, "factor", 0);
    SLUICE_CHECK(factor > 0, Status::corrupt, family, ": linear rope needs factor > 0");
    rope.inv_freq = default_inv_freq(rope.theta, dim);
    for (float& f : rope.inv_freq) f /= static_cast<float>(factor);
  } else if (rope.type == "yarn") {
    // transformers' standardize_rope_params: a top-level original_max_position_embeddings
    // wins, then rope_parameters', then max_position_embeddings.
    const double orig = get_number(cfg, "original_max_position_embeddings",
                                   get_number(params, "original_max_position_embeddings",
                                              static_cast<double>(max_position_embeddings)));
    SLUICE_CHECK(orig > 0, Status::corrupt, family, ": yarn rope needs original_max_position_embeddings > 0");
    double factor = get_number(params, "factor", static_cast<double>(max_position_embeddings) / orig);
    auto mscale_of = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    double attention_factor = get_number(params, "attention_factor", -1);
    if (attention_factor < 0) {
      double ms = get_number(params, "mscale", 0), ms_all = get_number(params, "mscale_all_dim", 0);
      attention_factor = (ms != 0 && ms_all != 0) ? mscale_of(factor, ms) / mscale_of(factor, ms_all)
                                                  : mscale_of(factor, 1.0);
    }
    double beta_fast = get_number(params, "beta_fast", 0), beta_slow = get_number(params, "beta_slow", 0);
    if (beta_fast == 0) beta_fast = 32;
    if (beta_slow == 0) beta_slow = 1;
    bool truncate = true;
    if (auto it = params.find("truncate"); it != params.end() && it->is_boolean()) truncate = *it;
    auto correction_dim = [&](double rotations) {
      return (static_cast<double>(dim) * std::log(orig / (rotations * 2 * std::numbers::pi))) /
             (2 * std::log(rope.theta));
    };
    double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
    if (truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // as the reference: avoid a zero-width ramp
    rope.inv_freq.resize(dim / 2);
    for (int64_t i = 0; i < dim / 2; ++i) {
      float pos_freq = std::pow(static_cast<float>(rope.theta), static_cast<float>(2 * i) / static_cast<float>(dim));
      float extrapolation = 1.0f / pos_freq;
      float interpolation = 1.0f / (static_cast<float>(factor) * pos_freq);
      float ramp = (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low);
      ramp = std::clamp(ramp, 0.0f, 1.0f);
      float extrapolation_factor = 1.0f - ramp;
      rope.inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
    rope.attention_factor = static_cast<float>(attention_factor);
  } else if (rope.type == "llama3") {
    double factor = get_number(params, "factor", 0), low_ff = get_number(params, "low_freq_factor", 0),
           high_ff = get_number(params, "high_freq_factor", 0),
           old_ctx = get_number(params, "original_max_position_embeddings", 0);
    // low == high (Llama 4 Scout: both 1): no band between the kept and the scaled frequencies
    // (transformers' smoothing would divide by zero there, at a wavelength no frequency has).
    SLUICE_CHECK(factor > 0 && low_ff > 0 && high_ff >= low_ff && old_ctx > 0, Status::corrupt, family,
                 ": llama3 rope needs factor, low_freq_factor <= high_freq_factor and "
                 "original_max_position_embeddings");
    rope.inv_freq = default_inv_freq(rope.theta, dim);
    float low_wavelen = static_cast<float>(old_ctx / low_ff), high_wavelen = static_cast<float>(old_ctx / high_ff);
    for (float& f : rope.inv_freq) {
      float wavelen = 2.0f * static_cast<float>(std::numbers::pi) / f;
      float scaled = wavelen > low_wavelen ? f / static_cast<float>(factor) : f;
      if (high_ff > low_ff && !(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        float smooth = (static_cast<float>(old_ctx) / wavelen - static_cast<float>(low_ff)) /
                       static_cast<float>(high_ff - low_ff);
        scaled = (1.0f - smooth) * scaled / static_cast<float>(factor) + smooth * scaled;
      }
      f = scaled;
    }
  } else {
    fail(Status::unsupported, family, ": rope type '", rope.type,
         "' is not supported (supported: default, linear, yarn, llama3, proportional)");
  }
  return rope;
}

void rope_tables(const RopeConfig& rope, std::span<const int64_t> positions, std::vector<float>& cos,
                 std::vector<float>& sin) {
  const size_t half = rope.inv_freq.size();
  cos.resize(positions.size() * half);
  sin.resize(positions.size() * half);
  auto rows = [&](int64_t p0, int64_t p1) {
    for (auto p = static_cast<size_t>(p0); p < static_cast<size_t>(p1); ++p) {
      float pos = static_cast<float>(positions[p]);
      for (size_t i = 0; i < half; ++i) {
        float angle = rope.inv_freq[i] * pos;  // f32 product, as the reference's f32 matmul
        cos[p * half + i] = static_cast<float>(std::cos(static_cast<double>(angle))) * rope.attention_factor;
        sin[p * half + i] = static_cast<float>(std::sin(static_cast<double>(angle))) * rope.attention_factor;
      }
    }
  };
  // ~1.2 us a position of 64 pairs on one core (double cos and sin): an 8192-token prompt's
  // tables are ~10 ms, so long runs of positions go over the pool (the same values: each
  // element is computed alone).
  const auto n = static_cast<int64_t>(positions.size());
  constexpr int64_t kPositionsAChunk = 256;
  if (n >= 2 * kPositionsAChunk) ThreadPool::global().parallel_for(n, kPositionsAChunk, rows);
  else rows(0, n);
}

}  // namespace sluice
