// Packs of the reference fixtures for the tests, converted once per test process (all four
// kinds) into a temporary directory that is removed at exit.
#pragma once

#include <filesystem>
#include <string>

namespace sluice::test {

// tests/fixtures/<name> converted with kinds bf16, int8, q4, q2 and the default dense dtype.
const std::filesystem::path& fixture_pack(const std::string& name);

// A fresh temporary directory for one test (removed at exit).
std::filesystem::path pack_test_dir(const std::string& name);

}  // namespace sluice::test
