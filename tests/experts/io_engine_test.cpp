// IoEngine on real files: records of awkward sizes at the end of a file, a file that ends
// mid-record, many reads in flight, demand before prefetch, the forced buffered and pread
// paths, a file truncated under an open engine, shutdown with reads in flight, and the
// retry decisions (EINTR, EAGAIN, EIO once, EINVAL on a direct read) on their own.
//
// Files go under the build directory (the tests' working directory), where O_DIRECT works
// on ordinary disks; on a filesystem that refuses it (tmpfs) the same tests run the
// buffered fallback and still pass.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "experts/io_engine.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace std::chrono_literals;

namespace {

constexpr auto kWait = 10s;  // generous: a read of a few MiB on any disk takes far less

fs::path test_dir() {
  // Removed when the test process exits.
  static struct Dir {
    fs::path path = fs::current_path() / ("sluice-io-test-" + std::to_string(::getpid()));
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } dir;
  fs::create_directories(dir.path);
  return dir.path;
}

// A file of `size` bytes where byte i is a hash of i, so any slice can be checked.
uint8_t byte_at(uint64_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); }

fs::path make_file(const std::string& name, uint64_t size) {
  fs::path p = test_dir() / name;
  std::vector<uint8_t> data(size);
  for (uint64_t i = 0; i < size; ++i) data[i] = byte_at(i);
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(size));
  return p;
}

bool matches(const uint8_t* buf, uint64_t offset, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes; ++i)
    if (buf[i] != byte_at(offset + i)) return false;
  return true;
}

// Waits for `n` completions.
std::vector<ReadCompletion> collect(IoEngine& io, size_t n) {
  std::vector<ReadCompletion> out;
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) io.poll(out, 100ms);
  EXPECT_EQ(out.size(), n) << "reads did not complete in time";
  return out;
}

ReadCompletion read_one(IoEngine& io, int32_t file, uint64_t offset, uint64_t bytes, void* dest, int64_t record = 0) {
  ReadRequest r;
  r.file = file;
  r.offset = offset;
  r.bytes = bytes;
  r.dest = dest;
  r.record = record;
  r.tag = 77;
  io.submit(r);
  std::vector<ReadCompletion> c = collect(io, 1);
  return c.empty() ? ReadCompletion{} : c[0];
}

struct Mode {
  const char* name;
  IoMode mode;
  bool uring;
};
constexpr Mode kModes[] = {
    {"uring-direct", IoMode::direct, true},
    {"uring-buffered", IoMode::buffered, true},
    {"pread-direct", IoMode::direct, false},
    {"pread-buffered", IoMode::buffered, false},
};

IoEngineOptions opts(const Mode& m, int depth = 8) {
  IoEngineOptions o;
  o.mode = m.mode;
  o.use_io_uring = m.uring;
  o.queue_depth = depth;
  return o;
}

}  // namespace

// Records at a 12288-byte stride, 9000 bytes used; the file ends 5000 bytes into the last
// record (5000 is not a multiple of 4096).
TEST(IoEngine, AwkwardSizesAtTheEndOfAFile) {
  const uint64_t stride = 12288, used = 9000;
  const fs::path p = make_file("awkward.bin", 3 * stride + 5000);
  for (const Mode& m : kModes) {
    SCOPED_TRACE(m.name);
    IoEngine io(opts(m));
    const int32_t f = io.add_file(p);
    if (m.mode == IoMode::buffered) {
      EXPECT_FALSE(io.file_is_direct(f));
    }
    std::printf("  %s: io_uring %s, O_DIRECT %s\n", m.name, io.uses_io_uring() ? "yes" : "no",
                io.file_is_direct(f) ? "yes" : "no");
    AlignedBuffer buf(stride);
    for (int64_t rec = 0; rec < 3; ++rec) {
      ReadCompletion c = read_one(io, f, rec * stride, used, buf.data(), rec);
      ASSERT_EQ(c.status, Status::ok) << c.error;
      EXPECT_EQ(c.bytes, used);
      EXPECT_TRUE(matches(buf.data(), rec * stride, used));
    }
    // The last 5000 bytes exactly: a direct read asks for 8192 and gets 5000 back.
    ReadCompletion c = read_one(io, f, 3 * stride, 5000, buf.data(), 3);
    ASSERT_EQ(c.status, Status::ok) << c.error;
    EXPECT_TRUE(matches(buf.data(), 3 * stride, 5000));
    // 1 byte, and a size just past a block boundary.
    for (uint64_t bytes : {uint64_t{1}, uint64_t{4097}}) {
      c = read_one(io, f, stride, bytes, buf.data(), 1);
      ASSERT_EQ(c.status, Status::ok) << c.error;
      EXPECT_TRUE(matches(buf.data(), stride, bytes));
    }
  }
}

// A record that the file cuts short, and one wholly past its end: errors that name the
// record and the file, never a hang.
TEST(IoEngine, ShortReadsAreErrorsNamingTheRecord) {
  const uint64_t stride = 8192;
  const fs::path p = make_file("short.bin", 2 * stride + 3000);
  for (const Mode& m : kModes) {
    SCOPED_TRACE(m.name);
    IoEngine io(opts(m));
    const int32_t f = io.add_file(p);
    AlignedBuffer buf(stride);
    ReadCompletion c = read_one(io, f, 2 * stride, 6000, buf.data(), 42);
    EXPECT_EQ(c.status, Status::io);
    EXPECT_EQ(c.record, 42);
    EXPECT_EQ(c.tag, 77u);
    EXPECT_NE(c.error.find("record 42"), std::string::npos) << c.error;
    EXPECT_NE(c.error.find("short read: got 3000 of 6000 bytes"), std::string::npos) << c.error;
    EXPECT_NE(c.error.find("short.bin"), std::string::npos) << c.error;
    EXPECT_TRUE(matches(buf.data(), 2 * stride, 3000));  // what was there was delivered
    c = read_one(io, f, 5 * stride, 100, buf.data(), 43);
    EXPECT_EQ(c.status, Status::io);
    EXPECT_NE(c.error.find("record 43"), std::string::npos) << c.error;
    EXPECT_NE(c.error.find("got 0 of 100"), std::string::npos) << c.error;
    EXPECT_EQ(io.counters().errors, 2u);
  }
}

// 200 reads of random records through 8 in flight, each landing in its own buffer.
TEST(IoEngine, ManyReadsInFlight) {
  const uint64_t stride = 16384, used = 12345;
  const int n_records = 64;
  const fs::path p = make_file("many.bin", n_records * stride);
  for (const Mode& m : kModes) {
    SCOPED_TRACE(m.name);
    IoEngine io(opts(m, 8));
    const int32_t f = io.add_file(p);
    const int n_reads = 200;
    std::vector<AlignedBuffer> bufs;
    std::vector<int64_t> rec_of(n_reads);
    std::mt19937 rng(7);
    for (int i = 0; i < n_reads; ++i) {
      bufs.emplace_back(stride);
      rec_of[i] = static_cast<int64_t>(rng() % n_records);
      ReadRequest r;
      r.file = f;
      r.offset = static_cast<uint64_t>(rec_of[i]) * stride;
      r.bytes = used;
      r.dest = bufs.back().data();
      r.record = rec_of[i];
      r.tag = static_cast<uint64_t>(i);
      r.priority = i % 3 ? IoPriority::demand : IoPriority::prefetch;
      io.submit(r);
    }
    std::vector<ReadCompletion> done = collect(io, n_reads);
    std::vector<int> seen(n_reads, 0);
    for (const ReadCompletion& c : done) {
      ASSERT_EQ(c.status, Status::ok) << c.error;
      ASSERT_LT(c.tag, static_cast<uint64_t>(n_reads));
      ++seen[c.tag];
      EXPECT_EQ(c.record, rec_of[c.tag]);
      EXPECT_TRUE(matches(bufs[c.tag].data(), static_cast<uint64_t>(rec_of[c.tag]) * stride, used)) << c.tag;
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
    EXPECT_TRUE(io.drain(kWait));
    EXPECT_EQ(io.outstanding(), 0);
    IoCounters k = io.counters();
    EXPECT_EQ(k.reads, static_cast<uint64_t>(n_reads));
    EXPECT_EQ(k.bytes, static_cast<uint64_t>(n_reads) * used);
    EXPECT_EQ(k.errors, 0u);
    EXPECT_GT(k.busy_seconds, 0.0);
  }
}

// Queued demand reads go before queued prefetch reads: one read at a time, 30 prefetches of
// 4 MiB queued, then one demand read; it must not finish last. The demand is compared only
// when at least 10 prefetches were still waiting just before it was queued (a submitting
// thread preempted long enough for the worker to drain the queue has nothing to jump).
TEST(IoEngine, DemandJumpsTheQueue) {
  const uint64_t read = 4 << 20;
  const fs::path p = make_file("prio.bin", 31 * read);
  IoEngine io(opts(kModes[2], 1));  // pread, one thread: a strict queue
  const int32_t f = io.add_file(p);
  std::vector<AlignedBuffer> bufs;
  for (int i = 0; i <= 30; ++i) bufs.emplace_back(read);  // before submitting: the queue fills at once
  int64_t waiting = 0;
  for (int i = 0; i <= 30; ++i) {
    ReadRequest r;
    r.file = f;
    r.offset = static_cast<uint64_t>(i) * read;
    r.bytes = read;
    r.dest = bufs[i].data();
    r.tag = static_cast<uint64_t>(i);
    r.priority = i < 30 ? IoPriority::prefetch : IoPriority::demand;
    if (i == 30) waiting = io.outstanding() - 1;  // less the one in flight
    io.submit(r);
  }
  std::vector<ReadCompletion> done = collect(io, 31);
  size_t pos = 0;
  while (pos < done.size() && done[pos].tag != 30) ++pos;
  if (waiting < 10) {
    GTEST_LOG_(INFO) << "only " << waiting << " prefetches were waiting when the demand read came: not compared";
    return;
  }
  EXPECT_LT(pos, 30u) << "the demand read finished after every prefetch (" << waiting << " were waiting)";
}

// The pack shrinks under an open engine (a truncated copy): a clear error, not garbage.
TEST(IoEngine, FileTruncatedWhileOpen) {
  const uint64_t stride = 8192;
  const fs::path p = make_file("trunc.bin", 4 * stride);
  for (const Mode& m : kModes) {
    SCOPED_TRACE(m.name);
    fs::resize_file(p, 4 * stride);
    IoEngine io(opts(m));
    const int32_t f = io.add_file(p);
    fs::resize_file(p, stride + 100);
    AlignedBuffer buf(stride);
    ReadCompletion c = read_one(io, f, stride, stride, buf.data(), 9);
    EXPECT_EQ(c.status, Status::io);
    EXPECT_NE(c.error.find("record 9"), std::string::npos) << c.error;
    EXPECT_NE(c.error.find("got 100 of 8192"), std::string::npos) << c.error;
    EXPECT_NE(c.error.find("truncated"), std::string::npos) << c.error;
  }
}

TEST(IoEngine, BadRequestsThrowAtSubmit) {
  const fs::path p = make_file("bad.bin", 8192);
  IoEngine io(opts(kModes[0]));
  const int32_t f = io.add_file(p);
  AlignedBuffer buf(8192);
  ReadRequest r;
  r.file = f + 1;
  r.bytes = 10;
  r.dest = buf.data();
  EXPECT_THROW(io.submit(r), Error);
  r.file = f;
  r.bytes = 0;
  EXPECT_THROW(io.submit(r), Error);
  if (io.file_is_direct(f)) {
    r.bytes = 10;
    r.offset = 100;  // not block-aligned
    EXPECT_THROW(io.submit(r), Error);
    r.offset = 0;
    r.dest = buf.data() + 1;  // not block-aligned
    EXPECT_THROW(io.submit(r), Error);
  }
  EXPECT_EQ(io.outstanding(), 0);
  try {
    io.add_file(test_dir() / "missing.bin");
    ADD_FAILURE() << "opening a missing file did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::not_found);
    EXPECT_NE(std::string(e.what()).find("missing.bin"), std::string::npos);
  }
  IoEngineOptions zero_depth;
  zero_depth.queue_depth = 0;
  EXPECT_THROW(IoEngine{zero_depth}, Error);
}

// Nothing submitted: poll returns after its wait, drain at once.
TEST(IoEngine, WaitsTimeOut) {
  IoEngine io;
  std::vector<ReadCompletion> out;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(io.poll(out, 50ms), 0u);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 45ms);
  EXPECT_LT(waited, 5s);
  EXPECT_TRUE(io.drain(0ms));
}

// With a completion callback, completions go to it (on the IO thread), not to poll().
TEST(IoEngine, CompletionCallback) {
  const fs::path p = make_file("cb.bin", 64 * 4096);
  std::mutex mu;
  std::vector<uint64_t> tags;
  IoEngineOptions o;
  o.on_complete = [&](const ReadCompletion& c) {
    std::lock_guard<std::mutex> lock(mu);
    if (c.status == Status::ok) tags.push_back(c.tag);
  };
  IoEngine io(o);
  const int32_t f = io.add_file(p);
  std::vector<AlignedBuffer> bufs;
  for (int i = 0; i < 16; ++i) {
    bufs.emplace_back(4096);
    io.submit(ReadRequest{.file = f, .offset = uint64_t(i) * 4096, .bytes = 4096, .dest = bufs.back().data(), .tag = uint64_t(i)});
  }
  ASSERT_TRUE(io.drain(kWait));
  std::vector<ReadCompletion> out;
  EXPECT_EQ(io.poll(out, 0ms), 0u);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(tags.size(), 16u);
}

// Destroying an engine with reads queued and in flight neither hangs nor crashes.
TEST(IoEngine, ShutdownWithReadsInFlight) {
  const uint64_t mib = 1 << 20;
  const fs::path p = make_file("shutdown.bin", 16 * mib);
  std::vector<AlignedBuffer> bufs;
  for (int i = 0; i < 64; ++i) bufs.emplace_back(mib);
  for (const Mode& m : kModes) {
    SCOPED_TRACE(m.name);
    const auto t0 = std::chrono::steady_clock::now();
    {
      IoEngine io(opts(m, 4));
      const int32_t f = io.add_file(p);
      for (int i = 0; i < 64; ++i)
        io.submit(ReadRequest{.file = f, .offset = uint64_t(i % 16) * mib, .bytes = mib, .dest = bufs[i].data()});
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  }
}

// A read that never answers (a pipe nobody writes to) is cancelled after the request
// timeout and reported as Status::timeout naming the record; the engine keeps working.
TEST(IoEngine, ReadTimeoutIsReportedNotHung) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  IoEngineOptions o;
  o.request_timeout = 100ms;
  IoEngine io(o);
  if (!io.uses_io_uring()) GTEST_SKIP() << "io_uring unavailable (a pread on a pipe fails at once)";
  const int32_t pipe_file = io.add_fd(fds[0], "test-pipe");
  AlignedBuffer buf(4096);
  const auto t0 = std::chrono::steady_clock::now();
  ReadCompletion c = read_one(io, pipe_file, 0, 4096, buf.data(), 5);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(c.status, Status::timeout);
  EXPECT_NE(c.error.find("record 5"), std::string::npos) << c.error;
  EXPECT_NE(c.error.find("test-pipe"), std::string::npos) << c.error;
  EXPECT_GE(waited, 90ms);
  EXPECT_LT(waited, 5s);
  // The engine still serves ordinary reads.
  const fs::path p = make_file("after-timeout.bin", 8192);
  const int32_t f = io.add_file(p);
  c = read_one(io, f, 4096, 4096, buf.data(), 6);
  EXPECT_EQ(c.status, Status::ok) << c.error;
  EXPECT_TRUE(matches(buf.data(), 4096, 4096));
  ::close(fds[0]);
  ::close(fds[1]);
}

// The retry decisions, one OS answer at a time.
TEST(IoEngine, RetryDecisions) {
  using namespace io_detail;
  ReadProgress p;
  p.want = 10000;
  p.direct = true;
  // A short direct read that ends on a block boundary continues direct; one that does not
  // continues through the page cache.
  EXPECT_EQ(next_read_action(p, 4096, 0).action, ReadAction::resubmit);
  EXPECT_EQ(p.done, 4096u);
  EXPECT_EQ(next_read_action(p, 1000, 0).action, ReadAction::resubmit_buffered);
  EXPECT_EQ(next_read_action(p, 100000, 0).action, ReadAction::complete);  // a whole-block read past `want`
  EXPECT_EQ(p.done, 10000u);

  ReadProgress q;
  q.want = 100;
  EXPECT_EQ(next_read_action(q, -EINTR, 0).action, ReadAction::resubmit_buffered);
  EXPECT_EQ(next_read_action(q, -EAGAIN, 0).action, ReadAction::resubmit_buffered);
  for (int i = 2; i < kMaxTransientRetries; ++i) ASSERT_NE(next_read_action(q, -EINTR, 0).action, ReadAction::fail);
  ReadDecision d = next_read_action(q, -EINTR, 0);
  EXPECT_EQ(d.action, ReadAction::fail);
  EXPECT_EQ(d.status, Status::io);

  ReadProgress e;
  e.want = 100;
  e.direct = true;
  EXPECT_EQ(next_read_action(e, -EIO, 0).action, ReadAction::resubmit);  // once
  d = next_read_action(e, -EIO, 0);
  EXPECT_EQ(d.action, ReadAction::fail);
  EXPECT_NE(d.reason.find("EIO"), std::string::npos);

  ReadProgress v;
  v.want = 100;
  v.direct = true;
  EXPECT_EQ(next_read_action(v, -EINVAL, 0).action, ReadAction::resubmit_buffered);
  v.direct = false;
  EXPECT_EQ(next_read_action(v, -EINVAL, 0).action, ReadAction::fail);

  ReadProgress z;
  z.want = 100;
  z.done = 40;
  d = next_read_action(z, 0, 8192);
  EXPECT_EQ(d.action, ReadAction::fail);
  EXPECT_NE(d.reason.find("short read: got 40 of 100 bytes (the file ends at byte 8232"), std::string::npos) << d.reason;
  EXPECT_EQ(next_read_action(z, -EBADF, 0).status, Status::io);
  EXPECT_EQ(next_read_action(z, -ECANCELED, 0).status, Status::timeout);
}
