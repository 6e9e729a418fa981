// Shared CLI helpers.
#include "cli_common.h"

#include <charconv>

#include "core/thread_pool.h"

namespace sluice::cli {

void add_model_options(CLI::App& cmd, ModelOptions& opt) {
  cmd.add_option("--model", opt.model, "model directory (HF checkpoint)")->required();
  cmd.add_option("--threads", opt.threads, "CPU threads (default: all cores)")->check(CLI::NonNegativeNumber);
  cmd.add_option("--backend", opt.backend, "cpu, cuda, cuda:N or auto (default: CUDA when available)");
}

std::vector<int32_t> parse_token_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int32_t v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    SLUICE_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size() && v >= 0,
                 Status::invalid_argument, "--tokens: '", item, "' is not a token id (expected e.g. 3,17,42)");
    ids.push_back(v);
    pos = comma + 1;
  }
  return ids;
}

std::vector<int32_t> prompt_tokens(const LoadedModel& m, const std::string& prompt, const std::string& tokens) {
  if (!tokens.empty()) return parse_token_list(tokens);
  SLUICE_CHECK(m.tokenizer.has_value(), Status::invalid_argument, "--prompt needs a tokenizer.json in ",
               m.dir.string(), "; pass --tokens instead");
  std::vector<int32_t> ids = m.tokenizer->encode(prompt, m.tokenizer->add_bos());
  SLUICE_CHECK(!ids.empty(), Status::invalid_argument, "the prompt encodes to no tokens");
  return ids;
}

Session open_session(const ModelOptions& opt) {
  if (opt.threads > 0) ThreadPool::set_global_threads(opt.threads);
  Session s;
  s.backend = make_backend(opt.backend);
  s.model = load_model(opt.model, *s.backend);
  return s;
}

}  // namespace sluice::cli
