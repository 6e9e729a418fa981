// libFuzzer target for the safetensors header parser: any input must either parse into
// entries that satisfy the documented invariants or throw sluice::Error; a crash, a
// sanitizer report or a violated invariant (__builtin_trap) is a bug.
//   build: CXX=clang++ cmake -S . -B build-fuzz -DSLUICE_FUZZ=ON -DSLUICE_TESTS=OFF
//   run:   build-fuzz/bin/fuzz_safetensors -dict=tests/fuzz/safetensors.dict -max_len=4096 \
//            -rss_limit_mb=2048 -malloc_limit_mb=512 tests/fuzz/corpus_safetensors
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "core/error.h"
#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    std::map<std::string, std::string> metadata;
    auto entries = sluice::parse_safetensors_header({data, size}, "fuzz.safetensors", &metadata);
    // Parsing succeeded, so the header length is valid and the invariants must hold.
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
    const uint64_t data_size = size - 8 - header_len;
    std::set<std::string> names;
    uint64_t reach = 0;  // furthest end of a non-empty tensor so far
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      if (e.begin > e.end || e.end > data_size || e.shape.size() > sluice::safetensors_ndim_max) __builtin_trap();
      if (i && entries[i - 1].begin > e.begin) __builtin_trap();
      if (!names.insert(e.name).second) __builtin_trap();
      uint64_t n = sluice::dtype_size(e.dtype);
      for (int64_t d : e.shape) {
        if (d < 0) __builtin_trap();
        n *= static_cast<uint64_t>(d);  // cannot overflow: the parser checked
      }
      if (n != e.end - e.begin) __builtin_trap();
      if (n && e.begin < reach) __builtin_trap();
      if (n && e.end > reach) reach = e.end;
      // Touch the first and last byte so ASan sees any out-of-range offset.
      if (n) {
        volatile uint8_t sink = data[8 + header_len + e.begin] ^ data[8 + header_len + e.end - 1];
        (void)sink;
      }
    }
  } catch (const sluice::Error&) {
    // Rejected input: the expected outcome for almost everything.
  }
  return 0;
}
