// Helpers for the tests that run packs: packs of the reference fixtures, converted once per
// test process (all four kinds) into a temporary directory that is removed at exit, and the
// teacher-forced and greedy runs the pack tests compare.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "models/load.h"

namespace sluice::test {

// tests/fixtures/<name> converted with kinds bf16, int8, q4, q2 and the default dense dtype.
const std::filesystem::path& fixture_pack(const std::string& name);

// A fresh temporary directory for one test (removed at exit).
std::filesystem::path pack_test_dir(const std::string& name);

// A fixture converted with `--dense dense` (and one expert kind), for the quantized dense
// weight tests (CPU and GPU): into a fresh directory named after the case; `summary`, when
// given, receives convert's.
struct DensePackCase {
  std::string fixture;
  DType dense;
};
void PrintTo(const DensePackCase& c, std::ostream* os);
std::filesystem::path dense_pack(const DensePackCase& c, DType kind, ConvertSummary* summary = nullptr);

// A copy of the fixture's files (in a fresh directory named after `name`) whose config.json
// `edit` changed.
std::filesystem::path fixture_with_config(const std::string& fixture, const std::string& name,
                                          const std::function<void(nlohmann::json&)>& edit);

// The fixture's prompt ids followed by its continuation ids (reference.json).
std::vector<int32_t> full_ids(const std::string& fixture);

// One teacher-forced pass of the model at `dir` (checkpoint or pack) on the CPU backend:
// logits [ids.size(), n_vocab].
std::vector<float> teacher_forced(const std::filesystem::path& dir, std::span<const int32_t> ids,
                                  const LoadOptions& lo = {});

// The first n tokens greedy decoding (temperature 0) generates after the prompt.
std::vector<int32_t> greedy(Model& m, const std::vector<int32_t>& prompt, int64_t n);

// A fixture's model against its transformers reference: max |logit - logits_full.npy|
// teacher-forced in one pass and decoded through the cache (decode_in_chunks), and the greedy
// continuation of the prompt (as long as the reference's).
struct ReferenceRun {
  float forced = 0, decoded = 0;
  std::vector<int32_t> continuation;
};
ReferenceRun run_against_reference(Model& m, const std::string& fixture);

}  // namespace sluice::test
