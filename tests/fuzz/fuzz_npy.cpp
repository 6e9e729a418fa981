// libFuzzer target for the .npy parser: any input must either parse into an array whose size
// matches its shape or throw sluice::Error. Built with fuzz_safetensors (SLUICE_FUZZ=ON):
//   build-fuzz/bin/fuzz_npy -max_len=4096 -rss_limit_mb=2048 -malloc_limit_mb=512 tests/fuzz/corpus_npy
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "format/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    sluice::NpyArray a = sluice::parse_npy({data, size}, "fuzz.npy");
    uint64_t n = 1;
    for (int64_t d : a.shape) {
      if (d < 0) __builtin_trap();
      n *= static_cast<uint64_t>(d);
    }
    if (n != a.data.size()) __builtin_trap();
  } catch (const sluice::Error&) {
  }
  return 0;
}
