// GPU test binary only: a fatal signal (a crash, or an abort from an exception that escaped
// with --gtest_catch_exceptions=0) prints the stack before the process dies, since the GPU
// machine has no debugger. The binary links with -rdynamic so the frames have names.
#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <initializer_list>

namespace {

void print_stack_and_die(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char* head = "\n*** fatal signal; stack:\n";
  (void)!write(STDERR_FILENO, head, std::strlen(head));
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

const bool installed = [] {
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE}) std::signal(sig, print_stack_and_die);
  return true;
}();

}  // namespace
