// The fixture farm's shared check (farm_util.h).
#include "tests/models/farm_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tests/models/fixture_util.h"
#include "format/json_file.h"
#include "format/npy.h"
#include "models/load.h"

namespace fs = std::filesystem;

namespace sluice::test {
namespace {

// The rows (positions) of got whose largest difference from want exceeds tolerance, and the
// largest difference overall. got, want: [n, vocab].
std::pair<std::vector<int64_t>, float> compare_rows(const std::vector<float>& got, const std::vector<float>& want,
                                                    int64_t vocab, float tolerance) {
  std::vector<int64_t> bad;
  float worst = 0;
  for (int64_t i = 0; i * vocab < static_cast<int64_t>(want.size()); ++i) {
    float d = 0;
    for (int64_t v = 0; v < vocab; ++v) d = std::max(d, std::fabs(got[i * vocab + v] - want[i * vocab + v]));
    if (!(d <= tolerance)) bad.push_back(i);  // NaN counts as bad
    worst = std::max(worst, d);
  }
  return {bad, worst};
}

std::string first_positions(const std::vector<int64_t>& bad) {
  std::string s;
  for (size_t i = 0; i < bad.size() && i < 12; ++i) s += (i ? ", " : "") + std::to_string(bad[i]);
  return s + (bad.size() > 12 ? ", ..." : "");
}

}  // namespace

fs::path farm_dir() { return source_dir() / "tests" / "fixtures" / "farm"; }

std::vector<std::string> farm_entries() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(farm_dir(), ec))
    if (fs::exists(e.path() / "reference.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void expect_farm_entry_matches(Backend& backend, const std::string& name, float tolerance, const std::string& label) {
  const nlohmann::json ref = read_json_file(farm_dir() / name / "reference.json");
  const std::vector<int32_t> ids = ref.at("prompt_ids").get<std::vector<int32_t>>();
  const NpyArray want = read_npy(farm_dir() / name / "logits.npy");
  LoadedModel m = load_model(farm_dir() / name, backend);
  const int64_t V = m.model->info().n_vocab, n = static_cast<int64_t>(ids.size());
  ASSERT_EQ(want.shape, (std::vector<int64_t>{n, V})) << name;

  // One teacher-forced pass.
  auto state = m.model->new_state(n);
  std::vector<float> got(n * V);
  m.model->forward(ids, *state, got, true);
  auto [bad, worst] = compare_rows(got, want.data, V, tolerance);
  std::printf("%s %s: teacher-forced max |logit - reference| = %.3g\n", label.c_str(), name.c_str(), worst);
  EXPECT_TRUE(bad.empty()) << label << " " << name << ": teacher-forced logits differ by up to " << worst
                           << " at positions " << first_positions(bad);

  // Two uneven prefill chunks, then one token at a time.
  auto st = m.model->new_state(n);
  std::vector<float> stepped(n * V), row(V);
  const int64_t first = std::max<int64_t>(1, n / 3), second = n / 2 - first;
  int64_t pos = 0;
  for (int64_t chunk : {first, second}) {
    if (chunk <= 0) continue;
    std::vector<float> part(chunk * V);
    m.model->forward(std::span(ids).subspan(pos, chunk), *st, part, true);
    std::copy(part.begin(), part.end(), stepped.begin() + pos * V);
    pos += chunk;
  }
  for (; pos < n; ++pos) {
    m.model->forward(std::span(ids).subspan(pos, 1), *st, row, false);
    std::copy(row.begin(), row.end(), stepped.begin() + pos * V);
  }
  auto [bad2, worst2] = compare_rows(stepped, want.data, V, tolerance);
  EXPECT_TRUE(bad2.empty()) << label << " " << name << ": chunked prefill + decode differs by up to " << worst2
                            << " at positions " << first_positions(bad2);
}

}  // namespace sluice::test
