// The registry of environment switches (core/switches.h): docs/configuration.md lists exactly
// its entries (name, kind, values, default, meaning), the library reads the environment
// nowhere else, and values follow the one rule: a flag 1 or 0, integers within bounds, unset
// or empty the default, anything else an error naming the variable that leaves the values in
// use as they were.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/models/fixture_util.h"
#include "core/error.h"
#include "core/switches.h"

using namespace sluice;
namespace fs = std::filesystem;

namespace {

// docs/configuration.md's row of a switch, as the registry says it should read.
std::string expected_row(const switches::Info& s) {
  return str("| `", s.name, "` | ", switches::kind_name(s.kind), " | ", switches::takes(s), " | `", s.default_value,
             "` | ", s.meaning, " |");
}

// The table rows of docs/configuration.md that name a variable ("| `SLUICE_..."), by name.
std::map<std::string, std::string> documented_rows() {
  std::ifstream f(test::source_dir() / "docs" / "configuration.md");
  EXPECT_TRUE(f.good()) << "docs/configuration.md is missing";
  std::map<std::string, std::string> rows;
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("| `SLUICE_", 0) != 0) continue;
    const size_t end = line.find('`', 3);
    rows[line.substr(3, end - 3)] = line;
  }
  return rows;
}

// (name, value) pairs; a null value: unset.
using Vars = std::vector<std::pair<std::string, const char*>>;

// Sets (or unsets) environment variables for a scope and, on exit, puts them back and reloads
// the registry, so that no other test sees the values.
class ScopedSwitches {
 public:
  explicit ScopedSwitches(Vars vars) {
    for (auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      old_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      set(name, value);
    }
  }
  ~ScopedSwitches() {
    for (auto& [name, old] : old_) set(name, old ? old->c_str() : nullptr);
    switches::reload();
  }
  ScopedSwitches(const ScopedSwitches&) = delete;
  ScopedSwitches& operator=(const ScopedSwitches&) = delete;
  static void set(const std::string& name, const char* value) {
    if (value) setenv(name.c_str(), value, 1);
    else unsetenv(name.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> old_;
};

std::string reload_error() {
  try {
    switches::reload();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
    return e.what();
  }
  return "";
}

TEST(Switches, DocsListEveryRegistryEntry) {
  std::map<std::string, std::string> rows = documented_rows();
  for (const switches::Info& s : switches::kSwitches) {
    const auto it = rows.find(s.name);
    if (it == rows.end()) {
      ADD_FAILURE() << s.name << " is not in docs/configuration.md; its row:\n" << expected_row(s);
      continue;
    }
    EXPECT_EQ(it->second, expected_row(s)) << "docs/configuration.md's row of " << s.name;
    rows.erase(it);
  }
  for (const auto& [name, row] : rows)
    ADD_FAILURE() << "docs/configuration.md lists " << name << ", which the registry (core/switches.h) does not";
}

// Nothing under src/ but the registry reads the environment.
TEST(Switches, OnlyTheRegistryReadsTheEnvironment) {
  const fs::path src = test::source_dir() / "src";
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    ++files;
    std::ifstream f(e.path());
    std::stringstream text;
    text << f.rdbuf();
    const std::string body = text.str();
    if (e.path().filename() == "switches.cpp") continue;
    EXPECT_EQ(body.find("getenv"), std::string::npos)
        << fs::relative(e.path(), src).string() << " reads the environment: declare the switch in core/switches.h";
  }
  EXPECT_GT(files, 100) << "src/ not found at " << src;
}

// Every switch unset for a scope.
Vars every_switch_unset() {
  Vars vars;
  for (const switches::Info& s : switches::kSwitches) vars.emplace_back(s.name, nullptr);
  return vars;
}

TEST(Switches, DefaultsWhenUnsetOrEmpty) {
  ScopedSwitches env(every_switch_unset());
  ScopedSwitches::set("SLUICE_CUDA_GRAPHS", "");
  switches::reload();
  EXPECT_EQ(switches::integer(Switch::threads), 0);
  EXPECT_TRUE(switches::on(Switch::cuda_graphs));
  EXPECT_FALSE(switches::on(Switch::cuda_host_routed));
  EXPECT_EQ(switches::integers(Switch::cuda_gqa_shape), (std::vector<int64_t>{0, 0, 0, 0}));
  // Every default is itself a valid value of its switch.
  for (const switches::Info& s : switches::kSwitches) ScopedSwitches::set(s.name, s.default_value);
  EXPECT_EQ(reload_error(), "");
}

TEST(Switches, ValuesAsSet) {
  ScopedSwitches env({{"SLUICE_THREADS", "12"},
                      {"SLUICE_CUDA_GRAPHS", "0"},
                      {"SLUICE_CUDA_HOST_ROUTED", "1"},
                      {"SLUICE_CUDA_GQA_SHAPE", "2,1,3,16"}});
  switches::reload();
  EXPECT_EQ(switches::integer(Switch::threads), 12);
  EXPECT_FALSE(switches::on(Switch::cuda_graphs));
  EXPECT_TRUE(switches::on(Switch::cuda_host_routed));
  EXPECT_EQ(switches::integers(Switch::cuda_gqa_shape), (std::vector<int64_t>{2, 1, 3, 16}));
  // A switch changed for a scope and reloaded: the next read sees the new value.
  ScopedSwitches::set("SLUICE_CUDA_GRAPHS", "1");
  EXPECT_FALSE(switches::on(Switch::cuda_graphs)) << "read once, until a reload";
  switches::reload();
  EXPECT_TRUE(switches::on(Switch::cuda_graphs));
}

TEST(Switches, AnyOtherValueIsAnErrorNamingTheVariable) {
  ScopedSwitches env({{"SLUICE_THREADS", "3"}, {"SLUICE_CUDA_GRAPHS", nullptr}, {"SLUICE_CUDA_GQA_SHAPE", nullptr}});
  switches::reload();
  const struct {
    const char* name;
    const char* value;
    const char* says;
  } bad[] = {
      {"SLUICE_CUDA_GRAPHS", "yes", "SLUICE_CUDA_GRAPHS=yes: the switch takes 1 (on) or 0 (off) (unset: 1"},
      {"SLUICE_CUDA_GRAPHS", "true", "1 (on) or 0 (off)"},
      {"SLUICE_CUDA_GRAPHS", " 1", "1 (on) or 0 (off)"},
      {"SLUICE_CUDA_GRAPHS", "01", "1 (on) or 0 (off)"},
      {"SLUICE_THREADS", "abc", "SLUICE_THREADS=abc: the switch takes an integer from 0 to 1024"},
      {"SLUICE_THREADS", "-1", "an integer from 0 to 1024"},
      {"SLUICE_THREADS", "1025", "an integer from 0 to 1024"},
      {"SLUICE_THREADS", "4x", "an integer from 0 to 1024"},
      {"SLUICE_THREADS", "99999999999999999999", "an integer from 0 to 1024"},
      {"SLUICE_CUDA_GQA_SHAPE", "1,2,3", "4 integers from 0 to 64 separated by commas"},
      {"SLUICE_CUDA_GQA_SHAPE", "1,2,3,4,5", "4 integers"},
      {"SLUICE_CUDA_GQA_SHAPE", "1,,3,4", "4 integers"},
      {"SLUICE_CUDA_GQA_SHAPE", "1,2,3,65", "4 integers"},
  };
  for (const auto& b : bad) {
    ScopedSwitches one(Vars{{b.name, b.value}});
    const std::string err = reload_error();
    EXPECT_NE(err.find(b.says), std::string::npos) << b.name << "=" << b.value << ": " << err;
    EXPECT_NE(err.find("docs/configuration.md"), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << "one line: " << err;
    // The values in use stay as they were.
    EXPECT_EQ(switches::integer(Switch::threads), 3);
    EXPECT_TRUE(switches::on(Switch::cuda_graphs));
  }
}

TEST(Switches, ReadAsItsOwnTypeOnly) {
  EXPECT_THROW(switches::on(Switch::threads), Error);
  EXPECT_THROW(switches::integer(Switch::cuda_graphs), Error);
  EXPECT_THROW(switches::integers(Switch::threads), Error);
}

}  // namespace
