// Fixture reference reading.
#include "fixture_util.h"

#include <cmath>

#include "format/json_file.h"

namespace sluice::test {

FixtureReference read_reference(const std::string& name) {
  nlohmann::json j = read_json_file(fixture_dir(name) / "reference.json");
  FixtureReference r;
  r.prompt_ids = j.at("prompt_ids").get<std::vector<int32_t>>();
  r.continuation_ids = j.at("continuation_ids").get<std::vector<int32_t>>();
  r.min_router_margin = j.at("min_router_topk_margin").get<double>();
  return r;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace sluice::test
