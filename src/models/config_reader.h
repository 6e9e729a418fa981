// ConfigReader: typed, validated access to a family's config.json fields. Every message
// names the family and the field ("qwen3_moe: num_experts_per_tok (12) exceeds num_experts
// (8)"). A field may have aliases (real checkpoints spell some fields differently).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sluice {

class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& cfg, std::string family);

  const nlohmann::json& json() const { return cfg_; }
  const std::string& family() const { return family_; }
  bool has(std::initializer_list<const char*> names) const;

  // The first alias present and non-null; absent without a fallback is an error.
  int64_t integer(std::initializer_list<const char*> names, std::optional<int64_t> fallback = {},
                  int64_t min = 1, int64_t max = int64_t{1} << 40) const;
  double number(std::initializer_list<const char*> names, std::optional<double> fallback = {}) const;
  bool boolean(std::initializer_list<const char*> names, std::optional<bool> fallback = {}) const;
  std::string string(std::initializer_list<const char*> names, std::optional<std::string> fallback = {}) const;
  std::vector<int64_t> integer_list(std::initializer_list<const char*> names,
                                    std::vector<int64_t> fallback = {}) const;
  // layer_types: one name per layer, each one of `allowed`; empty when absent or null (the
  // family applies its default pattern).
  std::vector<std::string> layer_types(int64_t n_layer, std::initializer_list<const char*> allowed) const;
  // An optional id (bos/eos); a list takes its first entry.
  std::optional<int64_t> optional_id(const char* name) const;

  // "family: message" as a corrupt-config error.
  [[noreturn]] void invalid(const std::string& message) const;

 private:
  const nlohmann::json* find(std::initializer_list<const char*> names, std::string* found) const;
  std::string names_str(std::initializer_list<const char*> names) const;

  const nlohmann::json& cfg_;
  std::string family_;
};

}  // namespace sluice
