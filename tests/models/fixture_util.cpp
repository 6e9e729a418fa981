// Fixture reference reading.
#include "tests/models/fixture_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

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

size_t floats_differing(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

void decode_in_chunks(Model& model, const std::vector<int32_t>& ids, size_t prompt_len, std::vector<float>& got) {
  const int64_t V = model.info().n_vocab;
  auto state = model.new_state(static_cast<int64_t>(ids.size()));
  std::vector<float> row(V);
  size_t pos = 0;
  for (size_t chunk : {size_t{5}, size_t{1}, prompt_len - 6}) {
    std::vector<float> part(chunk * V);
    model.forward(std::span(ids).subspan(pos, chunk), *state, part, true);
    std::copy(part.begin(), part.end(), got.begin() + pos * V);
    pos += chunk;
  }
  for (; pos < ids.size(); ++pos) {
    model.forward(std::span(ids).subspan(pos, 1), *state, row, false);
    std::copy(row.begin(), row.end(), got.begin() + pos * V);
  }
}

}  // namespace sluice::test
