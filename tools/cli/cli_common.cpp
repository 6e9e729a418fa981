// Shared CLI helpers.
#include "cli_common.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>

#include "core/thread_pool.h"

namespace sluice::cli {

void add_model_options(CLI::App& cmd, ModelOptions& opt) {
  cmd.add_option("--model", opt.model, "model directory: an HF checkpoint or a pack (sluice convert)")->required();
  cmd.add_option("--expert-kind", opt.expert_kind,
                 "expert precision of a pack: bf16, int8, q4 or q2 (default: the first of q4, int8, bf16, q2 it holds)");
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
  LoadOptions lo;
  if (!opt.expert_kind.empty()) {
    lo.expert_kind = expert_kind_from_name(opt.expert_kind);
    SLUICE_CHECK(lo.expert_kind, Status::invalid_argument, "--expert-kind: unknown kind '", opt.expert_kind,
                 "' (kinds: bf16, int8, q4, q2)");
  }
  s.model = load_model(opt.model, *s.backend, lo);
  return s;
}

Progress::Progress(std::string label) : label_(std::move(label)), tty_(::isatty(2) == 1) {}

void Progress::update(const std::string& counts, uint64_t bytes_done, uint64_t bytes_total, double seconds) {
  const double frac = bytes_total ? static_cast<double>(bytes_done) / static_cast<double>(bytes_total) : 1.0;
  const double rate = seconds > 0 ? static_cast<double>(bytes_done) / seconds : 0;  // bytes/s
  const double eta = rate > 0 ? static_cast<double>(bytes_total - std::min(bytes_done, bytes_total)) / rate : 0;
  char eta_text[32];
  std::snprintf(eta_text, sizeof eta_text, "%d:%02d", static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
  // GB for large jobs, MB below 1 GB.
  const double unit = bytes_total >= 1000000000 ? 1e9 : 1e6;
  const char* u = unit == 1e9 ? "GB" : "MB";
  const std::string c = counts.empty() ? "" : " " + counts + ",";
  char line[320];
  if (tty_) {
    if (last_ >= 0 && seconds - last_ < 0.1 && bytes_done < bytes_total) return;
    constexpr int width = 28;
    const int filled = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, ' ');
    std::snprintf(line, sizeof line, "\r%s [%s] %3.0f%%%s %.2f/%.2f %s, %.2f GB/s, ETA %s\x1b[K", label_.c_str(),
                  bar.c_str(), frac * 100, c.c_str(), bytes_done / unit, bytes_total / unit, u, rate / 1e9, eta_text);
    std::fputs(line, stderr);
    drawn_ = true;
  } else {
    const int decile = static_cast<int>(frac * 10);
    if (last_ >= 0 && seconds - last_ < 10 && decile == last_decile_ && bytes_done < bytes_total) return;
    last_decile_ = decile;
    std::snprintf(line, sizeof line, "%s: %3.0f%%%s %.2f/%.2f %s, %.2f GB/s, ETA %s\n", label_.c_str(), frac * 100,
                  c.c_str(), bytes_done / unit, bytes_total / unit, u, rate / 1e9, eta_text);
    std::fputs(line, stderr);
  }
  last_ = seconds;
  std::fflush(stderr);
}

void Progress::finish() {
  if (tty_ && drawn_) std::fputs("\n", stderr);
  drawn_ = false;
}

}  // namespace sluice::cli
