// The Jinja tests' reference: @huggingface/jinja 0.5.11 run by node on the same templates
// and variables at test time (jinja_reference.mjs), and the comparison of sluice's render
// with it, byte for byte, or error for error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace sluice::test {

struct JinjaCase {
  JinjaCase(std::string name_, std::string source_, std::string context_ = "{}", std::optional<int64_t> now = std::nullopt)
      : name(std::move(name_)), source(std::move(source_)), context(std::move(context_)), now_ms(now) {}
  std::string name;               // names the case in failure messages
  std::string source;             // the template
  std::string context;            // the variables, a JSON object (its key order is kept)
  std::optional<int64_t> now_ms;  // fixes the clock (UTC) for strftime_now
};

struct ReferenceRender {
  bool ok = false;
  std::string output;  // when ok
  std::string phase;   // "parse" or "render" when not ok
  std::string error;
};

// Runs `node tests/format/SCRIPT ARGS...` (node found on PATH; TZ=UTC); a missing node or a
// failed run is a test failure (with the script's stderr) and returns false.
bool run_node_script(const std::string& script, const std::vector<std::string>& args);

// Renders every case with @huggingface/jinja under node (found on PATH; the package from
// SLUICE_NPM_DIR). A missing node or package, or a node failure, is a test failure and
// returns an empty list.
std::vector<ReferenceRender> reference_renders(const std::vector<JinjaCase>& cases);

// Renders each case with sluice's interpreter and compares it with the reference: the same
// bytes, or an Error in the same phase where the reference throws. Returns how many cases
// were compared.
size_t expect_cases_match_reference(const std::vector<JinjaCase>& cases);

}  // namespace sluice::test
