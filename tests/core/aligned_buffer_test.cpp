// AlignedBuffer takes memory as its pages are written: a host tier of 648 MB of which a run
// read 0.05 GB held 818 MB resident (the whole tier zero-filled at start). And --host-cache
// beyond the memory available is a one-line error before anything is allocated.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "tests/models/pack_util.h"
#include "tests/tools/cli/cli_child.h"
#include "tests/tools/cli/cli_util.h"
#include "core/aligned_buffer.h"

using namespace sluice;
using namespace sluice::test;

TEST(AlignedBuffer, MemoryIsTakenAsPagesAreWritten) {
  const uint64_t before = self_status_kb("VmRSS:") * 1024;
  AlignedBuffer b(uint64_t{1} << 30);  // 1 GiB
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kIoAlign, 0u);
  EXPECT_LT(self_status_kb("VmRSS:") * 1024, before + (uint64_t{16} << 20)) << "the buffer was filled at allocation";
  EXPECT_EQ(b.data()[12345], 0);
  EXPECT_EQ(b.data()[b.size() - 1], 0);
  std::memset(b.data(), 1, 32 << 20);  // 32 MiB written
  const uint64_t after = self_status_kb("VmRSS:") * 1024;
  EXPECT_GT(after, before + (uint64_t{30} << 20));
  EXPECT_LT(after, before + (uint64_t{64} << 20));
}

TEST(AlignedBuffer, AHostCacheBeyondTheMemoryAvailableIsRefused) {
  const ChildResult r = run_sluice_child({"run", "--model", fixture_pack("qwen3_moe").string(), "--expert-slots", "8",
                                          "--host-cache", "64T", "--tokens", "1,2", "-n", "1"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("--host-cache 64T is more than the"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}
