// What the subcommands write as they run: stdout with every write checked (a full disk,
// /dev/full or a closed pipe is an error and a non-zero exit, not silently lost text),
// prefill progress on stderr, and the exit of an interrupted run (status 130, as a shell
// reports SIGINT, after the summary and the files are written).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::cli {

// fwrite + fflush of stdout; Error(io) "writing to stdout: ..." when either fails.
void stdout_write(std::string_view text);
// fflush of stdout and its error flag (what printf may have failed to write earlier).
void stdout_flush();

// Prefill progress on stderr for prompts longer than kLongPrefillTokens: a line redrawn in
// place on a terminal, else a line at each quarter of the prompt.
class PrefillProgress {
 public:
  static constexpr int64_t kLongPrefillTokens = 512;
  PrefillProgress();
  void update(int64_t done, int64_t total);
  void finish();  // clears the redrawn line

 private:
  bool tty_;
  bool drawn_ = false;
  int last_quarter_ = 0;
  double t0_;
};

// Ends an interrupted run (SIGINT/SIGTERM caught by InterruptFlag) with exit status 130 and
// a note on stderr; call it after the summary, --stats and the trace are written.
[[noreturn]] void exit_interrupted(std::string_view what);

}  // namespace sluice::cli
