// POSIX reads and writes with EINTR and short-transfer handling; see file_io.h.
#include "format/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "core/error.h"

namespace sluice {
namespace {

// Closes a file descriptor on scope exit.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] void fail_open(const std::filesystem::path& path, int err) {
  if (err == ENOENT || err == ENOTDIR) fail(Status::not_found, path.string(), ": no such file");
  fail(Status::io, path.string(), ": cannot open: ", errno_text(err));
}

}  // namespace

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string read_file_bytes(const std::filesystem::path& path, uint64_t size_max, std::string_view what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_open(path, errno);
  FdGuard guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(Status::io, path.string(), ": cannot stat: ", errno_text(errno));
  SLUICE_CHECK(S_ISREG(st.st_mode), Status::invalid_argument, path.string(), ": not a regular file");
  uint64_t size = static_cast<uint64_t>(st.st_size);
  SLUICE_CHECK(size <= size_max, Status::corrupt, path.string(), ": ", size, " bytes is too large for ", what,
               " (at most ", size_max, ")");
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, bytes.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(Status::io, path.string(), ": read failed: ", errno_text(errno));
    if (n == 0) break;  // the file shrank since fstat: return what is there
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

void write_file_atomic(const std::filesystem::path& path, std::span<const std::span<const uint8_t>> parts) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(Status::io, tmp.string(), ": cannot create: ", errno_text(errno));
  {
    FdGuard guard{fd};
    for (std::span<const uint8_t> part : parts) {
      size_t done = 0;
      while (done < part.size()) {
        ssize_t n = ::write(fd, part.data() + done, part.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          int err = errno;
          ::unlink(tmp.c_str());
          fail(Status::io, tmp.string(), ": write failed: ", errno_text(err));
        }
        done += static_cast<size_t>(n);
      }
    }
    guard.fd = -1;
    if (::close(fd) != 0) {
      int err = errno;
      ::unlink(tmp.c_str());
      fail(Status::io, tmp.string(), ": close failed: ", errno_text(err));
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail(Status::io, path.string(), ": cannot rename from ", tmp.filename().string(), ": ", errno_text(err));
  }
}

}  // namespace sluice
