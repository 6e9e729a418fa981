// Path descriptions for messages, from stat(2)/lstat(2) so that a symlink loop or a refused
// permission is told apart from a missing file.
#include "core/paths.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

// stat(2) of the path through symlinks; 0 or the errno.
int stat_errno(const fs::path& path, struct stat& st) { return ::stat(path.c_str(), &st) == 0 ? 0 : errno; }

std::string reason(int err) {
  char buf[256];
  return ::strerror_r(err, buf, sizeof buf);  // GNU strerror_r returns the text
}

std::string mode_text(mode_t mode) {
  if (S_ISREG(mode)) return "is a regular file";
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISCHR(mode)) return "is a character device";
  if (S_ISBLK(mode)) return "is a block device";
  if (S_ISFIFO(mode)) return "is a FIFO";
  if (S_ISSOCK(mode)) return "is a socket";
  return "is not a file or directory";
}

[[noreturn]] void refuse(Status status, const fs::path& path, std::string_view what, std::string_view kind,
                         std::string_view expected) {
  fail(status, what, " ", path.string(), " ", kind, "; expected ", expected);
}

}  // namespace

std::string path_kind_text(const fs::path& path) {
  struct stat st {};
  const int err = stat_errno(path, st);
  if (err == 0) return mode_text(st.st_mode);
  struct stat lst {};
  if (err == ENOENT && ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) return "is a broken symlink";
  if (err == ENOENT) return "does not exist";
  if (err == ELOOP) return "is a symlink loop";
  if (err == ENOTDIR) return "does not exist (a parent is not a directory)";
  return "cannot be reached (" + reason(err) + ")";
}

void expect_directory(const fs::path& path, std::string_view what, std::string_view expected) {
  struct stat st {};
  const int err = stat_errno(path, st);
  if (err == 0 && S_ISDIR(st.st_mode)) return;
  refuse(err == ENOENT ? Status::not_found : Status::invalid_argument, path, what, path_kind_text(path), expected);
}

void expect_input_file(const fs::path& path, std::string_view what, std::string_view expected) {
  struct stat st {};
  const int err = stat_errno(path, st);
  if (err == 0 && !S_ISDIR(st.st_mode)) return;
  refuse(err == ENOENT ? Status::not_found : Status::invalid_argument, path, what, path_kind_text(path), expected);
}

void expect_output_file(const fs::path& path, std::string_view what, std::string_view expected) {
  struct stat st {};
  const int err = stat_errno(path, st);
  if (err == 0) {
    if (S_ISDIR(st.st_mode)) refuse(Status::invalid_argument, path, what, "is a directory", expected);
    if (::access(path.c_str(), W_OK) != 0) refuse(Status::invalid_argument, path, what, "is not writable", expected);
    return;
  }
  if (err != ENOENT) refuse(Status::invalid_argument, path, what, path_kind_text(path), expected);
  // A new file: its directory must exist and take it.
  const fs::path parent = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  const std::string parent_kind = path_kind_text(parent);
  if (parent_kind != "is a directory")
    refuse(Status::invalid_argument, path, what, "cannot be created: its directory " + parent_kind, expected);
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    refuse(Status::invalid_argument, path, what, "cannot be created: its directory is not writable", expected);
  // access() says yes to root everywhere, and to anyone on file systems that take no new
  // files (sysfs, procfs): create and remove a file beside it, as the writer will.
  const fs::path probe = parent / ("." + path.filename().string() + ".probe-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    refuse(Status::invalid_argument, path, what, std::string("cannot be created: ") + std::strerror(errno), expected);
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace sluice
