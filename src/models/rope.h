// Rotary position embedding parameters: the inverse frequencies of every scaled variant that
// the supported configs use (default, linear, yarn, llama3), computed the way transformers
// computes them (in f32), and the per-position cos/sin tables the rope op consumes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sluice {

struct RopeConfig {
  std::string type = "default";  // default | linear | yarn | llama3
  double theta = 10000.0;
  int64_t rot_dim = 0;           // rotated dims per head (head_dim x partial_rotary_factor)
  bool interleaved = false;      // GPT-J pairing (2i, 2i+1) instead of neox (i, i + rot/2)
  std::vector<float> inv_freq;   // [rot_dim / 2]
  float attention_factor = 1.0f; // multiplies cos and sin (yarn)
};

// Reads rope_parameters (transformers 5) or rope_theta + rope_scaling (earlier files) from a
// config. `family` names the family in error messages.
RopeConfig rope_config_from_json(const nlohmann::json& cfg, const std::string& family, int64_t head_dim,
                                 int64_t max_position_embeddings, double default_theta = 10000.0);

// cos and sin, each [positions.size(), rot_dim / 2] row-major f32.
void rope_tables(const RopeConfig& rope, std::span<const int64_t> positions, std::vector<float>& cos,
                 std::vector<float>& sin);

}  // namespace sluice
