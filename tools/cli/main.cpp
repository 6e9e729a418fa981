// sluice command-line tool: a thin front end over the library.
#include <cstdio>

int main(int argc, char** argv) {
  std::fprintf(stderr, "sluice: not built yet\n");
  return 1;
}
