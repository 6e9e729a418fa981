// What a path given on the command line is, in words for error messages, and the checks
// that use them: "--file /tmp is a directory; expected a UTF-8 text file" rather than the
// message of whatever call fails first ("directory does not exist", "cannot rename").
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace sluice {

// "does not exist", "is a directory", "is a regular file", "is a character device", "is a
// symlink loop", "is a broken symlink", "cannot be reached (Permission denied)", ...
std::string path_kind_text(const std::filesystem::path& path);

// Each throws Error(invalid_argument, or not_found when nothing is there)
// "WHAT PATH <path_kind_text>; expected EXPECTED" unless the path is what it should be.
// `what` names the path ("--file", "model"), `expected` says what was wanted.

// A directory (through symlinks).
void expect_directory(const std::filesystem::path& path, std::string_view what, std::string_view expected);
// Something to read that is not a directory: a regular file, or a device or FIFO to stream.
void expect_input_file(const std::filesystem::path& path, std::string_view what, std::string_view expected);
// Something a file can be written at: not a directory, in an existing directory, writable
// (an existing file) or creatable (a new one). Special files (/dev/null) pass.
void expect_output_file(const std::filesystem::path& path, std::string_view what, std::string_view expected);

}  // namespace sluice
