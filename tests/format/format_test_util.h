// Helpers for the format tests: a scratch directory removed afterwards, byte-level file
// writing, and an assertion that a call throws sluice::Error with a given status and a
// message containing given fragments.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace sluice::test {

class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("sluice_format_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << p;
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Flips the bits `mask` of the byte at `offset` of an existing file (corrupting it in place).
inline void flip_byte(const std::filesystem::path& p, uint64_t offset, uint8_t mask = 1) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  ASSERT_TRUE(f.good()) << p;
}

inline std::span<const uint8_t> as_span(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Runs `fn`, which must throw sluice::Error with `status` and a message containing every
// fragment; returns the message (empty when the expectation failed).
inline std::string expect_error(const std::function<void()>& fn, Status status, const std::vector<std::string>& fragments) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << "message: " << e.what() << " (status " << status_name(e.status()) << ")";
    std::string message = e.what();
    for (const std::string& f : fragments) EXPECT_NE(message.find(f), std::string::npos) << "'" << f << "' not in: " << message;
    return message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-sluice exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw (expected " << status_name(status) << ")";
  return {};
}

}  // namespace sluice::test
