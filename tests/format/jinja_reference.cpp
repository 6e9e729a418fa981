// The reference runner and comparison of jinja_reference.h.
#include "tests/format/jinja_reference.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "tests/models/fixture_util.h"
#include "core/error.h"
#include "format/jinja/builtins.h"
#include "format/jinja/template.h"
#include "tests/format/format_test_util.h"

namespace sluice::test {

namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

std::optional<fs::path> find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (!path) return std::nullopt;
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    const fs::path candidate = fs::path(dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// sluice's render of one case, in the reference's result shape.
ReferenceRender sluice_render(const JinjaCase& c, std::string* message_problem) {
  ReferenceRender r;
  std::optional<jinja::Template> t;
  try {
    t = jinja::Template::parse(c.source);
  } catch (const Error& e) {
    r.phase = "parse";
    r.error = e.what();
    if (e.status() != Status::invalid_argument) *message_problem = "status is not invalid_argument";
    return r;
  }
  jinja::Variables vars;
  const ordered_json context = ordered_json::parse(c.context);
  for (auto it = context.begin(); it != context.end(); ++it) vars.emplace_back(it.key(), jinja::value_from_json(it.value(), it.key()));
  jinja::RenderOptions options;
  if (c.now_ms) {
    const std::time_t seconds = static_cast<std::time_t>(*c.now_ms / 1000);
    std::tm utc{};
    gmtime_r(&seconds, &utc);
    options.strftime_now = [utc](std::string_view format) { return jinja::js_strftime(utc, format); };
  }
  try {
    r.output = t->render(vars, options);
    r.ok = true;
  } catch (const Error& e) {
    r.phase = "render";
    r.error = e.what();
    if (e.status() != Status::invalid_argument) *message_problem = "status is not invalid_argument";
  }
  return r;
}

}  // namespace

bool run_node_script(const std::string& script, const std::vector<std::string>& args) {
  const auto node = find_on_path("node");
  if (!node) {
    ADD_FAILURE() << "node is not on PATH: this test compares against a JavaScript reference run by node "
                     "(Debian: apt-get install -y nodejs npm)";
    return false;
  }
  ScratchDir dir;
  // TZ=UTC: the fixed clock of strftime_now cases is read in UTC on both sides.
  std::string command = "TZ=UTC LC_ALL=C.UTF-8 " + shell_quote(node->string()) + " " +
                        shell_quote((sluice::test::source_dir() / "tests" / "format" / script).string());
  for (const std::string& a : args) command += " " + shell_quote(a);
  command += " 2> " + shell_quote((dir / "stderr.txt").string());
  const int rc = std::system(command.c_str());
  if (rc != 0) ADD_FAILURE() << "node " << script << " failed (exit " << rc << "): " << read_bytes(dir / "stderr.txt");
  return rc == 0;
}

std::vector<ReferenceRender> reference_renders(const std::vector<JinjaCase>& cases) {
  const fs::path modules = SLUICE_NPM_DIR;
  if (!fs::exists(modules / "@huggingface" / "jinja" / "package.json")) {
    ADD_FAILURE() << modules / "@huggingface/jinja" << " is missing: run scripts/fetch-test-data (make test does)";
    return {};
  }
  ScratchDir dir;
  ordered_json input = ordered_json::array();
  for (const JinjaCase& c : cases) {
    ordered_json item;
    item["template"] = c.source;
    item["context"] = ordered_json::parse(c.context);
    item["now"] = c.now_ms ? ordered_json(*c.now_ms) : ordered_json(nullptr);
    input.push_back(std::move(item));
  }
  write_bytes(dir / "cases.json", input.dump());
  if (!run_node_script("jinja_reference.mjs", {modules.string(), (dir / "cases.json").string(), (dir / "results.json").string()}))
    return {};
  const ordered_json results = ordered_json::parse(read_bytes(dir / "results.json"));
  std::vector<ReferenceRender> out;
  for (const auto& r : results) {
    ReferenceRender rr;
    rr.ok = r.at("ok").get<bool>();
    if (rr.ok) {
      rr.output = r.at("output").get<std::string>();
    } else {
      rr.phase = r.at("phase").get<std::string>();
      rr.error = r.at("error").get<std::string>();
    }
    out.push_back(std::move(rr));
  }
  EXPECT_EQ(out.size(), cases.size()) << "node returned a result per case";
  return out;
}

size_t expect_cases_match_reference(const std::vector<JinjaCase>& cases) {
  const std::vector<ReferenceRender> reference = reference_renders(cases);
  if (reference.size() != cases.size()) return 0;
  // SLUICE_JINJA_VERBOSE=1 prints every case's two results (to read the error messages).
  const bool verbose = std::getenv("SLUICE_JINJA_VERBOSE") != nullptr;
  for (size_t i = 0; i < cases.size(); ++i) {
    const JinjaCase& c = cases[i];
    const ReferenceRender& want = reference[i];
    std::string problem;
    const ReferenceRender got = sluice_render(c, &problem);
    if (verbose) {
      std::printf("case '%s'\n  reference: %s\n  sluice:    %s\n", c.name.c_str(),
                  (want.ok ? want.output : want.phase + " error: " + want.error).c_str(),
                  (got.ok ? got.output : got.phase + " error: " + got.error).c_str());
    }
    SCOPED_TRACE("case '" + c.name + "': " + c.source);
    if (want.ok) {
      EXPECT_TRUE(got.ok) << "the reference renders, sluice failed (" << got.phase << "): " << got.error;
      if (got.ok) {
        EXPECT_EQ(got.output, want.output);
      }
    } else {
      EXPECT_FALSE(got.ok) << "the reference fails (" << want.phase << ": " << want.error << "), sluice rendered: " << got.output;
      if (!got.ok) {
        EXPECT_EQ(got.phase, want.phase) << "sluice: " << got.error << "; reference: " << want.error;
        EXPECT_EQ(got.error.find('\n'), std::string::npos) << "an error message is one line: " << got.error;
        EXPECT_TRUE(got.error.starts_with("line ") || got.error.starts_with("template variable"))
            << "the error names the line: " << got.error;
        EXPECT_TRUE(problem.empty()) << problem;
      }
    }
  }
  return cases.size();
}

}  // namespace sluice::test
