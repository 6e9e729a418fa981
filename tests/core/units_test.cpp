// Byte sizes on the command line: suffixes, fractions, errors; and their printed form.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/units.h"

using namespace sluice;

TEST(Units, ParseByteSize) {
  EXPECT_EQ(parse_byte_size("4096", "--x"), 4096u);
  EXPECT_EQ(parse_byte_size("512M", "--x"), uint64_t{512} << 20);
  EXPECT_EQ(parse_byte_size("8G", "--x"), uint64_t{8} << 30);
  EXPECT_EQ(parse_byte_size("8g", "--x"), uint64_t{8} << 30);
  EXPECT_EQ(parse_byte_size("2K", "--x"), 2048u);
  EXPECT_EQ(parse_byte_size("1T", "--x"), uint64_t{1} << 40);
  EXPECT_EQ(parse_byte_size("1.5GiB", "--x"), uint64_t{3} << 29);
  EXPECT_EQ(parse_byte_size("64MB", "--x"), uint64_t{64} << 20);
  EXPECT_EQ(parse_byte_size("100B", "--x"), 100u);
  EXPECT_EQ(parse_byte_size(" 1 M ", "--x"), uint64_t{1} << 20);
  for (const char* bad : {"", "M", "12Q", "1.2.3G", "-5M", "5MM", "5 Mb x", "1e3", "99999999999T"}) {
    try {
      parse_byte_size(bad, "--expert-cache");
      ADD_FAILURE() << "'" << bad << "' parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("--expert-cache"), std::string::npos) << e.what();
    }
  }
}

TEST(Units, ByteSizeText) {
  EXPECT_EQ(byte_size_text(512), "512 B");
  EXPECT_EQ(byte_size_text(8192), "8.0 KiB");
  EXPECT_EQ(byte_size_text(uint64_t{24} << 20), "24.0 MiB");
  EXPECT_EQ(byte_size_text(uint64_t{3} << 29), "1.50 GiB");
}
