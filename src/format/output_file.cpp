// OutputFile (see output_file.h): symlinks followed by hand (a dangling link names the file
// to create), special files opened in place, regular files through a temporary and rename(2).
#include "format/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "format/file_io.h"

namespace sluice {
namespace {

// Links followed before giving up, as the kernel's ELOOP limit (MAXSYMLINKS) is 40.
constexpr int kMaxLinkHops = 40;

// What `path` names once every symlink on it is followed; a dangling link resolves to the
// path it points at (to be created there), not to the link itself.
std::filesystem::path resolve_links(const std::filesystem::path& path) {
  std::filesystem::path p = path;
  for (int hop = 0; hop < kMaxLinkHops; ++hop) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::error_code ec;
    const std::filesystem::path target = std::filesystem::read_symlink(p, ec);
    if (ec) fail(Status::io, path.string(), ": cannot read the symbolic link ", p.string(), ": ", ec.message());
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  fail(Status::invalid_argument, path.string(), ": too many levels of symbolic links");
}

}  // namespace

OutputFile::OutputFile(const std::filesystem::path& path) : path_(path.string()) {
  SLUICE_CHECK(!path_.empty(), Status::invalid_argument, "an output file path is empty");
  target_ = resolve_links(path);
  struct stat st {};
  const bool exists = ::stat(target_.c_str(), &st) == 0;
  SLUICE_CHECK(!exists || !S_ISDIR(st.st_mode), Status::invalid_argument, path_,
               ": is a directory (expected a file to write)");
  if (exists && !S_ISREG(st.st_mode)) {
    fd_ = ::open(target_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) fail(Status::io, path_, ": cannot open for writing: ", errno_text(errno));
    return;
  }
  tmp_ = target_;
  tmp_ += ".tmp";
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ < 0) fail(Status::io, path_, ": cannot create ", tmp_.string(), ": ", errno_text(errno));
  if (exists) (void)::fchmod(fd_, st.st_mode & 07777);  // the new file keeps the old one's permissions
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutputFile::write_now(const uint8_t* data, size_t n) {
  SLUICE_CHECK(fd_ >= 0, Status::internal, path_, ": written after commit");
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd_, data + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail(Status::io, path_, ": write failed: ", errno_text(errno));
    done += static_cast<size_t>(w);
  }
}

void OutputFile::flush_buffer() {
  const std::string pending = std::move(buffer_);
  buffer_.clear();
  write_now(reinterpret_cast<const uint8_t*>(pending.data()), pending.size());
}

void OutputFile::write(std::span<const uint8_t> bytes) {
  if (buffer_.size() + bytes.size() <= kBufferBytes) {
    buffer_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return;
  }
  flush_buffer();
  if (bytes.size() >= kBufferBytes) write_now(bytes.data(), bytes.size());  // large parts are not copied
  else buffer_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void OutputFile::write(std::string_view text) {
  write(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

void OutputFile::commit() {
  flush_buffer();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(Status::io, path_, ": close failed: ", errno_text(errno));
  if (!tmp_.empty() && ::rename(tmp_.c_str(), target_.c_str()) != 0)
    fail(Status::io, path_, ": cannot rename ", tmp_.string(), " into place: ", errno_text(errno));
  committed_ = true;
}

}  // namespace sluice
