// POSIX reads and writes with EINTR and short-transfer handling; see file_io.h.
#include "format/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "core/error.h"
#include "format/output_file.h"

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

void pread_all(int fd, uint8_t* buf, size_t size, uint64_t offset, const std::string& what) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, buf + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(Status::io, what, ": read at offset ", offset + done, " failed: ", errno_text(errno));
    if (n == 0) fail(Status::corrupt, what, ": ends at ", offset + done, " bytes (truncated while reading?)");
    done += static_cast<size_t>(n);
  }
}

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
  OutputFile out(path);
  for (std::span<const uint8_t> part : parts) out.write(part);
  out.commit();
}

}  // namespace sluice
