// IoEngine: the io_uring path (one IO thread owning the ring, woken through an eventfd read
// that sits in the ring) and the pread-thread path, sharing the request queue, the retry
// decision (io_detail::next_read_action) and the completion delivery.
#include "experts/io_engine.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "core/log.h"
#include "format/file_io.h"

namespace sluice {

using Clock = std::chrono::steady_clock;

namespace io_detail {

ReadDecision next_read_action(ReadProgress& p, int64_t res, uint64_t offset) {
  ReadDecision d;
  if (res > 0) {
    p.done = std::min(p.want, p.done + static_cast<uint64_t>(res));
    p.transient_retries = 0;
    if (p.done >= p.want) {
      d.action = ReadAction::complete;
    } else {
      // A direct read may only continue at a block boundary; an unaligned remainder (the
      // end of a file that is not a whole number of blocks) goes through the page cache.
      d.action = p.direct && p.done % kIoAlign == 0 ? ReadAction::resubmit : ReadAction::resubmit_buffered;
    }
    return d;
  }
  if (res == 0) {
    d.status = Status::io;
    d.reason = str("short read: got ", p.done, " of ", p.want, " bytes (the file ends at byte ", offset + p.done,
                   "; truncated pack?)");
    return d;
  }
  const int err = static_cast<int>(-res);
  if (err == EINTR || err == EAGAIN) {
    if (++p.transient_retries <= kMaxTransientRetries) {
      d.action = p.direct ? ReadAction::resubmit : ReadAction::resubmit_buffered;
      return d;
    }
    d.status = Status::io;
    d.reason = str(errno_text(err), " ", p.transient_retries - 1, " times in a row");
    return d;
  }
  if (err == EIO) {
    if (p.eio_retries++ == 0) {
      d.action = p.direct ? ReadAction::resubmit : ReadAction::resubmit_buffered;
      return d;
    }
    d.status = Status::io;
    d.reason = "input/output error (EIO), again after one retry: the disk failed to read it";
    return d;
  }
  if (err == EINVAL && p.direct) {
    d.action = ReadAction::resubmit_buffered;  // the filesystem refused this direct read
    return d;
  }
  d.status = err == ECANCELED ? Status::timeout : Status::io;
  d.reason = errno_text(err);
  return d;
}

}  // namespace io_detail

namespace {

using io_detail::ReadAction;

// What a read fetches, for messages: an expert record, or (record -1) rows of an n-gram table.
std::string read_what(const ReadRequest& r) {
  return r.record >= 0 ? str("expert record ", r.record) : std::string("n-gram table rows");
}

constexpr uint64_t kEventTag = ~uint64_t{0};      // user_data of the eventfd read
constexpr uint64_t kCancelTag = ~uint64_t{0} - 1;  // user_data of cancel requests
constexpr uint64_t kMaxReadChunk = uint64_t{1} << 30;  // Linux moves at most ~2 GiB per read
constexpr auto kIdleWait = std::chrono::milliseconds(50);  // IO thread wake-up for timeouts
constexpr auto kShutdownWait = std::chrono::seconds(5);    // destructor's bound on draining

std::atomic<bool> g_logged_no_uring{false}, g_logged_no_direct{false}, g_logged_direct_einval{false};

void log_once(std::atomic<bool>& flag, const std::string& message) {
  if (!flag.exchange(true)) LOG_WARN(message);
}

struct File {
  std::string path;
  int fd_direct = -1;    // O_DIRECT, or -1
  int fd_buffered = -1;  // always open
  uint64_t size = 0;
  bool direct_refused = false;  // a direct read failed with EINVAL: read buffered from now on
};

struct Op {
  ReadRequest req;
  io_detail::ReadProgress prog;
  int fd_direct = -1, fd_buffered = -1;
  std::string path;
  Clock::time_point queued, started;
  bool cancel_sent = false, abandoned = false;
};

}  // namespace

struct IoEngine::Impl {
  IoEngineOptions opt;
  mutable std::mutex mu;
  std::condition_variable cv_done, cv_work, cv_exit;
  std::deque<std::unique_ptr<Op>> pending[2];  // by IoPriority
  std::deque<ReadCompletion> completions;
  std::atomic<size_t> n_completions{0};  // completions.size(), readable without the mutex
  std::vector<File> files;
  int64_t outstanding = 0;  // submitted, not yet completed
  int64_t in_flight = 0;    // handed to the OS
  Clock::time_point busy_since;
  IoCounters counters;
  bool stop = false;
  int threads_alive = 0;
  std::string broken;  // set when an IO thread died: later submits fail with it

  bool uring = false;
  io_uring ring{};
  int efd = -1;
  uint64_t efd_buf = 0;

  ~Impl() {
    if (uring) io_uring_queue_exit(&ring);
    if (efd >= 0) ::close(efd);
    for (File& f : files) {
      if (f.fd_direct >= 0) ::close(f.fd_direct);
      if (f.fd_buffered >= 0) ::close(f.fd_buffered);
    }
  }

  bool has_pending() const { return !pending[0].empty() || !pending[1].empty(); }
  std::unique_ptr<Op> pop_pending() {
    for (auto& q : pending)
      if (!q.empty()) {
        std::unique_ptr<Op> op = std::move(q.front());
        q.pop_front();
        return op;
      }
    return nullptr;
  }

  // Under mu: an op goes to the OS / comes back.
  void start_locked(Op& op) {
    if (in_flight++ == 0) busy_since = Clock::now();
    op.started = Clock::now();
  }

  // Delivers the completion of an op that has left the OS (or never reached it).
  void finish(std::unique_ptr<Op> op, Status status, const std::string& reason, bool was_in_flight = true) {
    ReadCompletion c;
    c.tag = op->req.tag;
    c.record = op->req.record;
    c.status = status;
    c.bytes = op->prog.done;
    c.seconds = std::chrono::duration<double>(Clock::now() - op->queued).count();
    if (status != Status::ok)
      c.error = str("reading ", read_what(op->req), " (", op->req.bytes, " bytes at offset ", op->req.offset,
                    " of ", op->path, "): ", reason);
    std::function<void(const ReadCompletion&)> callback;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (was_in_flight && --in_flight == 0)
        counters.busy_seconds += std::chrono::duration<double>(Clock::now() - busy_since).count();
      if (status == Status::ok) {
        ++counters.reads;
        counters.bytes += c.bytes;
      } else {
        ++counters.errors;
      }
      callback = opt.on_complete;
    }
    bool delivered = false;
    if (callback) {
      try {
        callback(c);
        delivered = true;
      } catch (const std::exception& e) {
        c.status = Status::internal;
        c.error = str("read completion callback for record ", c.record, " failed: ", e.what());
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!delivered) {
        completions.push_back(std::move(c));
        n_completions.store(completions.size(), std::memory_order_release);
      }
      --outstanding;
    }
    cv_done.notify_all();
  }

  // Applies the decision after the OS answered `res`. Returns the op when it must be read
  // again (its descriptor choice updated), or null when it completed.
  std::unique_ptr<Op> after_read(std::unique_ptr<Op> op, int64_t res) {
    if (op->cancel_sent && res < 0) {
      finish(std::move(op), Status::timeout,
             str("no answer from the disk within ", opt.request_timeout.count(), " ms; the read was cancelled"));
      return nullptr;
    }
    io_detail::ReadDecision d = io_detail::next_read_action(op->prog, res, op->req.offset);
    switch (d.action) {
      case ReadAction::complete: finish(std::move(op), Status::ok, ""); return nullptr;
      case ReadAction::fail: finish(std::move(op), d.status, d.reason); return nullptr;
      case ReadAction::resubmit_buffered:
        if (op->prog.direct && res == -EINVAL) {
          log_once(g_logged_direct_einval,
                   str("a direct read of ", op->path, " was refused (EINVAL); its reads go through the page cache"));
          std::lock_guard<std::mutex> lock(mu);
          files[op->req.file].direct_refused = true;
        }
        op->prog.direct = false;
        [[fallthrough]];
      case ReadAction::resubmit: {
        std::lock_guard<std::mutex> lock(mu);
        if (res > 0)
          ++counters.continuations;
        else
          ++counters.retries;
        return op;
      }
    }
    return nullptr;
  }

  // The next read of an op: descriptor, destination, length, offset.
  struct ReadParams {
    int fd;
    uint8_t* buf;
    uint64_t len;
    uint64_t offset;
  };
  static ReadParams read_params(const Op& op) {
    const uint64_t rest = op.prog.want - op.prog.done;
    ReadParams a;
    a.fd = op.prog.direct ? op.fd_direct : op.fd_buffered;
    a.buf = static_cast<uint8_t*>(op.req.dest) + op.prog.done;
    a.len = std::min(op.prog.direct ? io_align_up(rest) : rest, kMaxReadChunk);
    a.offset = op.req.offset + op.prog.done;
    return a;
  }

  // ---- io_uring path ----

  void arm_eventfd() {
    io_uring_sqe* sqe = get_sqe();
    io_uring_prep_read(sqe, efd, &efd_buf, sizeof efd_buf, 0);
    io_uring_sqe_set_data64(sqe, kEventTag);
  }

  io_uring_sqe* get_sqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (!sqe) {
      io_uring_submit(&ring);
      sqe = io_uring_get_sqe(&ring);
    }
    SLUICE_ASSERT(sqe != nullptr);
    return sqe;
  }

  void prep_read(Op* op) {
    ReadParams a = read_params(*op);
    io_uring_sqe* sqe = get_sqe();
    io_uring_prep_read(sqe, a.fd, a.buf, static_cast<unsigned>(a.len), a.offset);
    io_uring_sqe_set_data(sqe, op);
  }

  void uring_loop() {
    std::unordered_set<Op*> ring_ops;  // owned while in the ring
    arm_eventfd();
    bool stopping = false;
    Clock::time_point stop_at;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (stop && !stopping) {
          stopping = true;
          stop_at = Clock::now();
        }
        while (!stopping && static_cast<int>(ring_ops.size()) < opt.queue_depth && has_pending()) {
          std::unique_ptr<Op> op = pop_pending();
          start_locked(*op);
          Op* raw = op.release();
          ring_ops.insert(raw);
          prep_read(raw);
        }
      }
      if (stopping) {
        // Drop the queue, cancel what the ring holds, and leave once it answered (bounded).
        std::deque<std::unique_ptr<Op>> dropped;
        {
          std::lock_guard<std::mutex> lock(mu);
          while (has_pending()) dropped.push_back(pop_pending());
        }
        for (auto& op : dropped) finish(std::move(op), Status::io, "the IO engine shut down", false);
        for (Op* op : ring_ops)
          if (!op->cancel_sent) {
            io_uring_sqe* sqe = get_sqe();
            io_uring_prep_cancel(sqe, op, 0);
            io_uring_sqe_set_data64(sqe, kCancelTag);
            op->cancel_sent = true;
          }
        if (ring_ops.empty() || Clock::now() - stop_at > kShutdownWait) break;
      }
      io_uring_submit(&ring);
      __kernel_timespec ts{0, std::chrono::duration_cast<std::chrono::nanoseconds>(kIdleWait).count()};
      io_uring_cqe* cqe = nullptr;
      int ret = io_uring_wait_cqe_timeout(&ring, &cqe, &ts);
      if (ret == 0) {
        unsigned head;
        unsigned seen = 0;
        std::vector<std::pair<uint64_t, int64_t>> done;
        io_uring_for_each_cqe(&ring, head, cqe) {
          done.emplace_back(cqe->user_data, cqe->res);
          ++seen;
        }
        io_uring_cq_advance(&ring, seen);
        for (auto [data, res] : done) {
          if (data == kEventTag) {
            if (!stopping) arm_eventfd();
            continue;
          }
          if (data == kCancelTag) continue;
          Op* raw = reinterpret_cast<Op*>(static_cast<uintptr_t>(data));
          ring_ops.erase(raw);
          std::unique_ptr<Op> op(raw);
          if (op->abandoned) {
            std::lock_guard<std::mutex> lock(mu);
            if (--in_flight == 0)
              counters.busy_seconds += std::chrono::duration<double>(Clock::now() - busy_since).count();
            continue;  // its timeout was reported already
          }
          if (opt.fault_injection) res = opt.fault_injection(op->req, res);
          op = after_read(std::move(op), res);
          if (op) {
            if (stopping) {
              finish(std::move(op), Status::io, "the IO engine shut down");
            } else {
              ring_ops.insert(op.get());
              prep_read(op.release());
            }
          }
        }
      } else if (ret != -ETIME && ret != -EINTR) {
        LOG_ERROR("io_uring wait failed: ", errno_text(-ret));
      }
      check_timeouts(ring_ops);
    }
    // Whatever the ring still holds after the shutdown wait is abandoned to the kernel (which
    // only ever sees an op's address as a tag, so the op itself can go).
    for (Op* op : ring_ops) {
      std::unique_ptr<Op> own(op);
      if (!own->abandoned) finish(std::move(own), Status::io, "the IO engine shut down while the read was in flight");
    }
  }

  // Cancels reads in flight longer than the timeout; a read the kernel cannot cancel is
  // reported after twice the timeout and abandoned (its late completion is ignored).
  void check_timeouts(std::unordered_set<Op*>& ring_ops) {
    const auto now = Clock::now();
    std::vector<Op*> give_up;
    for (Op* op : ring_ops) {
      if (op->abandoned) continue;
      const auto age = now - op->started;
      if (!op->cancel_sent && age > opt.request_timeout) {
        io_uring_sqe* sqe = get_sqe();
        io_uring_prep_cancel(sqe, op, 0);
        io_uring_sqe_set_data64(sqe, kCancelTag);
        op->cancel_sent = true;
      } else if (op->cancel_sent && age > 2 * opt.request_timeout) {
        give_up.push_back(op);
      }
    }
    for (Op* op : give_up) {
      op->abandoned = true;  // stays in ring_ops until its completion arrives
      ReadCompletion c;
      c.tag = op->req.tag;
      c.record = op->req.record;
      c.status = Status::timeout;
      c.error = str("reading ", read_what(op->req), " (", op->req.bytes, " bytes at offset ", op->req.offset,
                    " of ", op->path, "): no answer from the disk within ", 2 * opt.request_timeout.count(), " ms");
      {
        std::lock_guard<std::mutex> lock(mu);
        ++counters.errors;
        completions.push_back(std::move(c));
        n_completions.store(completions.size(), std::memory_order_release);
        --outstanding;
      }
      cv_done.notify_all();
    }
  }

  // ---- pread path ----

  void pread_worker() {
    for (;;) {
      std::unique_ptr<Op> op;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv_work.wait(lock, [&] { return stop || has_pending(); });
        if (stop) {
          std::deque<std::unique_ptr<Op>> dropped;
          while (has_pending()) dropped.push_back(pop_pending());
          lock.unlock();
          for (auto& d : dropped) finish(std::move(d), Status::io, "the IO engine shut down", false);
          return;
        }
        op = pop_pending();
        start_locked(*op);
      }
      while (op) {
        ReadParams a = read_params(*op);
        ssize_t n = ::pread(a.fd, a.buf, a.len, static_cast<off_t>(a.offset));
        int64_t res = n < 0 ? -static_cast<int64_t>(errno) : static_cast<int64_t>(n);
        if (opt.fault_injection) res = opt.fault_injection(op->req, res);
        op = after_read(std::move(op), res);
      }
    }
  }
};

IoEngine::IoEngine(IoEngineOptions opt) : impl_(std::make_shared<Impl>()) {
  SLUICE_CHECK(opt.queue_depth >= 1 && opt.queue_depth <= 256, Status::invalid_argument, "--io-depth ",
               opt.queue_depth, " is outside [1, 256]");
  SLUICE_CHECK(opt.request_timeout.count() > 0, Status::invalid_argument, "IO request timeout must be positive");
  Impl& m = *impl_;
  m.opt = std::move(opt);
  if (m.opt.use_io_uring) {
    // The ring holds the reads in flight, the eventfd read, and room for cancellations.
    const unsigned entries = static_cast<unsigned>(2 * m.opt.queue_depth + 4);
    int ret = io_uring_queue_init(entries, &m.ring, 0);
    if (ret == 0) {
      m.efd = ::eventfd(0, EFD_CLOEXEC);
      if (m.efd < 0) {
        io_uring_queue_exit(&m.ring);
        ret = -errno;
      } else {
        m.uring = true;
      }
    }
    if (!m.uring)
      log_once(g_logged_no_uring, str("io_uring is unavailable (", errno_text(-ret),
                                      "); expert reads use pread threads instead"));
  }
  std::shared_ptr<Impl> keep = impl_;
  const int n_threads = m.uring ? 1 : std::min(m.opt.queue_depth, 16);
  m.threads_alive = n_threads;
  for (int i = 0; i < n_threads; ++i) {
    std::thread([keep] {
      // Nothing may throw across the thread: a failure is logged and later submits refused.
      try {
        if (keep->uring)
          keep->uring_loop();
        else
          keep->pread_worker();
      } catch (const std::exception& e) {
        LOG_ERROR("the IO engine's thread failed: ", e.what());
        std::lock_guard<std::mutex> lock(keep->mu);
        keep->broken = e.what();
      }
      std::lock_guard<std::mutex> lock(keep->mu);
      --keep->threads_alive;
      keep->cv_exit.notify_all();
    }).detach();
  }
}

IoEngine::~IoEngine() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stop = true;
  }
  m.cv_work.notify_all();
  if (m.efd >= 0) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(m.efd, &one, sizeof one);
  }
  // The threads hold their own reference to Impl; a thread stuck in the kernel past the
  // bound is left behind rather than hanging the caller.
  std::unique_lock<std::mutex> lock(m.mu);
  if (!m.cv_exit.wait_for(lock, kShutdownWait + std::chrono::seconds(1), [&] { return m.threads_alive == 0; }))
    LOG_ERROR("the IO engine's threads did not stop within ", (kShutdownWait + std::chrono::seconds(1)).count(),
              " s (a read stuck in the kernel); leaving them behind");
}

int32_t IoEngine::add_file(const std::filesystem::path& path) {
  Impl& m = *impl_;
  File f;
  f.path = path.string();
  f.fd_buffered = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_buffered < 0) {
    const int err = errno;
    fail(err == ENOENT ? Status::not_found : Status::io, "cannot open ", f.path, ": ", errno_text(err));
  }
  struct stat st {};
  if (::fstat(f.fd_buffered, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(f.fd_buffered);
    fail(Status::io, f.path, " is not a regular file");
  }
  f.size = static_cast<uint64_t>(st.st_size);
  if (m.opt.mode == IoMode::direct) {
    f.fd_direct = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (f.fd_direct < 0)
      log_once(g_logged_no_direct, str("O_DIRECT is refused for ", f.path, " (", errno_text(errno),
                                       "); expert reads go through the page cache"));
  }
  std::lock_guard<std::mutex> lock(m.mu);
  m.files.push_back(std::move(f));
  return static_cast<int32_t>(m.files.size() - 1);
}

int32_t IoEngine::add_fd(int fd, const std::string& name) {
  File f;
  f.path = name;
  f.fd_buffered = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (f.fd_buffered < 0) fail(Status::io, "cannot use the descriptor of ", name, ": ", errno_text(errno));
  struct stat st {};
  if (::fstat(f.fd_buffered, &st) == 0 && S_ISREG(st.st_mode)) f.size = static_cast<uint64_t>(st.st_size);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->files.push_back(std::move(f));
  return static_cast<int32_t>(impl_->files.size() - 1);
}

bool IoEngine::file_is_direct(int32_t file) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  SLUICE_CHECK(file >= 0 && file < static_cast<int32_t>(impl_->files.size()), Status::internal, "bad file index ", file);
  return impl_->files[file].fd_direct >= 0 && !impl_->files[file].direct_refused;
}

uint64_t IoEngine::file_size(int32_t file) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  SLUICE_CHECK(file >= 0 && file < static_cast<int32_t>(impl_->files.size()), Status::internal, "bad file index ", file);
  return impl_->files[file].size;
}

void IoEngine::submit(const ReadRequest& req) {
  Impl& m = *impl_;
  auto op = std::make_unique<Op>();
  op->req = req;
  op->queued = Clock::now();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    SLUICE_CHECK(!m.stop, Status::internal, "read submitted to an IO engine that is shutting down");
    SLUICE_CHECK(m.broken.empty(), Status::io, "the IO engine failed earlier: ", m.broken);
    SLUICE_CHECK(req.file >= 0 && req.file < static_cast<int32_t>(m.files.size()), Status::internal,
                 "read of record ", req.record, ": bad file index ", req.file);
    const File& f = m.files[req.file];
    SLUICE_CHECK(req.bytes > 0 && req.dest != nullptr, Status::internal, "read of record ", req.record,
                 " has no bytes or no destination");
    op->fd_direct = f.fd_direct;
    op->fd_buffered = f.fd_buffered;
    op->path = f.path;
    op->prog.want = req.bytes;
    op->prog.direct = f.fd_direct >= 0 && !f.direct_refused;
    if (op->prog.direct) {
      SLUICE_CHECK(req.offset % kIoAlign == 0 && reinterpret_cast<uintptr_t>(req.dest) % kIoAlign == 0,
                   Status::internal, "direct read of record ", req.record, " from ", f.path, ": offset ", req.offset,
                   " and destination must be ", kIoAlign, "-byte aligned");
    }
    ++m.outstanding;
    m.pending[req.priority == IoPriority::demand ? 0 : 1].push_back(std::move(op));
  }
  if (m.uring) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(m.efd, &one, sizeof one);
  } else {
    m.cv_work.notify_one();
  }
}

size_t IoEngine::poll(std::vector<ReadCompletion>& out, std::chrono::milliseconds wait) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  m.cv_done.wait_for(lock, wait, [&] { return !m.completions.empty(); });
  const size_t n = m.completions.size();
  for (auto& c : m.completions) out.push_back(std::move(c));
  m.completions.clear();
  m.n_completions.store(0, std::memory_order_release);
  return n;
}

bool IoEngine::drain(std::chrono::milliseconds wait) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  return m.cv_done.wait_for(lock, wait, [&] { return m.outstanding == 0; });
}

bool IoEngine::has_completions() const {
  return impl_->n_completions.load(std::memory_order_acquire) > 0;
}

int64_t IoEngine::outstanding() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->outstanding;
}

bool IoEngine::uses_io_uring() const { return impl_->uring; }
IoMode IoEngine::mode() const { return impl_->opt.mode; }
int IoEngine::queue_depth() const { return impl_->opt.queue_depth; }

IoCounters IoEngine::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  IoCounters c = impl_->counters;
  if (impl_->in_flight > 0) c.busy_seconds += std::chrono::duration<double>(Clock::now() - impl_->busy_since).count();
  return c;
}

}  // namespace sluice
