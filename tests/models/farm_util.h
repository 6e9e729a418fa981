// The fixture farm (tests/fixtures/farm, tools/make_farm.py): the list of its configs and the
// check every backend runs on each (tests/models/farm_test.cpp on the CPU,
// tests/gpu/cuda_parity_test.cpp on CUDA).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace sluice::test {

std::filesystem::path farm_dir();

// Every farm config (directory names, sorted).
std::vector<std::string> farm_entries();

// Loads farm config `name` on `backend` and expects every position's logits within
// `tolerance` (max |a - b| per row) of transformers', both for one teacher-forced pass and for
// two uneven prefill chunks followed by token-by-token decode. `label` prefixes the messages.
void expect_farm_entry_matches(Backend& backend, const std::string& name, float tolerance, const std::string& label);

}  // namespace sluice::test
