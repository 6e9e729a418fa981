// ConfigReader: field lookup with aliases, type checks and range checks.
#include "models/config_reader.h"

#include "core/error.h"

namespace sluice {

ConfigReader::ConfigReader(const nlohmann::json& cfg, std::string family) : cfg_(cfg), family_(std::move(family)) {
  SLUICE_CHECK(cfg_.is_object(), Status::corrupt, family_, ": config is not a JSON object");
}

const nlohmann::json* ConfigReader::find(std::initializer_list<const char*> names, std::string* found) const {
  for (const char* n : names) {
    auto it = cfg_.find(n);
    if (it != cfg_.end() && !it->is_null()) {
      if (found) *found = n;
      return &*it;
    }
  }
  return nullptr;
}

std::string ConfigReader::names_str(std::initializer_list<const char*> names) const {
  std::string s;
  for (const char* n : names) s += (s.empty() ? "" : " / ") + std::string(n);
  return s;
}

bool ConfigReader::has(std::initializer_list<const char*> names) const { return find(names, nullptr) != nullptr; }

void ConfigReader::invalid(const std::string& message) const { fail(Status::corrupt, family_, ": ", message); }

int64_t ConfigReader::integer(std::initializer_list<const char*> names, std::optional<int64_t> fallback,
                              int64_t min, int64_t max) const {
  std::string name;
  const nlohmann::json* v = find(names, &name);
  if (!v) {
    if (fallback) return *fallback;
    invalid("config.json lacks " + names_str(names));
  }
  if (!v->is_number_integer()) {
    // Some writers store integral values as floats (2048.0).
    if (!(v->is_number_float() && v->get<double>() == static_cast<double>(static_cast<int64_t>(v->get<double>()))))
      invalid(name + " is not an integer");
  }
  int64_t x = v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(v->get<double>());
  if (x < min || x > max) invalid(str(name, " (", x, ") is outside [", min, ", ", max, "]"));
  return x;
}

double ConfigReader::number(std::initializer_list<const char*> names, std::optional<double> fallback) const {
  std::string name;
  const nlohmann::json* v = find(names, &name);
  if (!v) {
    if (fallback) return *fallback;
    invalid("config.json lacks " + names_str(names));
  }
  if (!v->is_number()) invalid(name + " is not a number");
  return v->get<double>();
}

bool ConfigReader::boolean(std::initializer_list<const char*> names, std::optional<bool> fallback) const {
  std::string name;
  const nlohmann::json* v = find(names, &name);
  if (!v) {
    if (fallback) return *fallback;
    invalid("config.json lacks " + names_str(names));
  }
  if (!v->is_boolean()) invalid(name + " is not true or false");
  return v->get<bool>();
}

std::string ConfigReader::string(std::initializer_list<const char*> names, std::optional<std::string> fallback) const {
  std::string name;
  const nlohmann::json* v = find(names, &name);
  if (!v) {
    if (fallback) return *fallback;
    invalid("config.json lacks " + names_str(names));
  }
  if (!v->is_string()) invalid(name + " is not a string");
  return v->get<std::string>();
}

std::vector<int64_t> ConfigReader::integer_list(std::initializer_list<const char*> names,
                                                std::vector<int64_t> fallback) const {
  std::string name;
  const nlohmann::json* v = find(names, &name);
  if (!v) return fallback;
  if (!v->is_array()) invalid(name + " is not a list");
  std::vector<int64_t> out;
  for (const auto& e : *v) {
    if (!e.is_number_integer()) invalid(name + " holds a value that is not an integer");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

std::vector<std::string> ConfigReader::layer_types(int64_t n_layer,
                                                  std::initializer_list<const char*> allowed) const {
  const auto it = cfg_.find("layer_types");
  if (it == cfg_.end() || it->is_null()) return {};
  if (!it->is_array() || static_cast<int64_t>(it->size()) != n_layer)
    invalid(str("layer_types must list num_hidden_layers (", n_layer, ") entries"));
  std::string names;
  for (const char* a : allowed) names += (names.empty() ? "" : " or ") + std::string(a);
  std::vector<std::string> out;
  for (size_t l = 0; l < it->size(); ++l) {
    const auto& t = (*it)[l];
    bool ok = false;
    if (t.is_string())
      for (const char* a : allowed) ok = ok || t == a;
    if (!ok) invalid(str("layer_types[", l, "] is ", t.dump(), " (", names, ")"));
    out.push_back(t.get<std::string>());
  }
  return out;
}

std::optional<int64_t> ConfigReader::optional_id(const char* name) const {
  auto it = cfg_.find(name);
  if (it == cfg_.end() || it->is_null()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) return (*it)[0].get<int64_t>();
  return std::nullopt;
}

}  // namespace sluice
