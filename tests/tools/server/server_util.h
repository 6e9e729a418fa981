// Shared by the server tests: the fixture model with a chat template added, node scripts run
// against a server, and the greedy text the Generator gives a prompt.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "models/load.h"

namespace sluice::test {

// A copy of the qwen3_moe fixture whose tokenizer_config.json has a ChatML-style chat
// template (the shape of Qwen's; the fixture ships none).
std::filesystem::path server_test_model();
// The same fixture with another chat template, in its own directory `name`.
std::filesystem::path server_test_model(const std::string& name, const std::string& chat_template);
// The template's text for those messages (system, user) with the generation prompt.
std::string chatml_prompt(const std::string& system, const std::string& user);

// The greedy continuation the Generator (`sluice run`) gives the ids, as text.
std::string greedy_text(const LoadedModel& m, const std::vector<int32_t>& ids, int64_t n, int64_t n_ctx);

// Runs a node script of tests/server with the npm modules of the build (copied next to them,
// since ES modules ignore NODE_PATH) and the environment given; its stdout, or "" with
// *error set when node failed or is missing.
std::string run_node_script(const std::string& script, const std::map<std::string, std::string>& env,
                            std::string* error);

}  // namespace sluice::test
