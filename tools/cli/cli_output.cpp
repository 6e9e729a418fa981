// Checked stdout, prefill progress, the interrupted exit (cli_output.h).
#include "cli_output.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>

#include "core/error.h"
#include "format/file_io.h"

namespace sluice::cli {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void fail_stdout(int err) {
  fail(Status::io, "writing to stdout: ", errno_text(err ? err : EIO));
}

}  // namespace

void stdout_write(std::string_view text) {
  errno = 0;
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size()) fail_stdout(errno);
  stdout_flush();
}

void stdout_flush() {
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) fail_stdout(errno);
}

PrefillProgress::PrefillProgress() : tty_(::isatty(2) == 1), t0_(now_seconds()) {}

void PrefillProgress::update(int64_t done, int64_t total) {
  if (total <= kLongPrefillTokens) return;
  const double seconds = now_seconds() - t0_;
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;  // tokens/s
  const int quarter = static_cast<int>(4 * done / total);
  if (!tty_ && quarter == last_quarter_) return;
  last_quarter_ = quarter;
  std::fprintf(stderr, "%ssluice: prefill %lld/%lld tokens (%.0f%%), %.0f tok/s%s", tty_ ? "\r" : "",
               static_cast<long long>(done), static_cast<long long>(total), 100.0 * done / total, rate,
               tty_ ? "\x1b[K" : "\n");
  std::fflush(stderr);
  drawn_ = tty_;
}

void PrefillProgress::finish() {
  if (drawn_) std::fputs("\r\x1b[K", stderr);
  drawn_ = false;
}

void exit_interrupted(std::string_view what) {
  std::fprintf(stderr, "sluice: interrupted: %.*s\n", static_cast<int>(what.size()), what.data());
  throw CLI::RuntimeError(130);
}

}  // namespace sluice::cli
