// OutputFile (format/output_file.h): a regular file replaced only at commit and keeping its
// permissions, a failed write leaving the old file, symlinks followed (dangling ones too),
// devices written in place (a null device stays one; a full one is an io error naming it),
// a directory refused. And TextPieceReader (format/text_pieces.h): pieces that concatenate to
// the file and encode to the ids of the whole text.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "tests/models/fixture_util.h"
#include "format/output_file.h"
#include "format/text_pieces.h"
#include "format/tokenizer.h"
#include "tests/format/format_test_util.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;

TEST(OutputFile, ReplacesARegularFileOnlyAtCommitAndKeepsItsMode) {
  ScratchDir dir;
  const fs::path p = dir / "out.bin";
  write_bytes(p, "old");
  ASSERT_EQ(::chmod(p.c_str(), 0600), 0);
  {
    OutputFile f(p);
    EXPECT_FALSE(f.in_place());
    f.write(std::string_view("new "));
    f.write(as_span(std::string(3 << 20, 'x')));  // larger than the buffer: written through
    EXPECT_EQ(read_bytes(p), "old");
    f.commit();
  }
  EXPECT_EQ(read_bytes(p).size(), 4u + (3 << 20));
  EXPECT_EQ(fs::status(p).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_FALSE(fs::exists(dir / "out.bin.tmp"));
  {
    OutputFile f(p);  // abandoned (an error mid-run): the old file stays, the temporary goes
    f.write(std::string_view("partial"));
  }
  EXPECT_EQ(read_bytes(p).size(), 4u + (3 << 20));
  EXPECT_FALSE(fs::exists(dir / "out.bin.tmp"));
}

TEST(OutputFile, FollowsSymlinksAndKeepsThem) {
  ScratchDir dir;
  fs::create_directories(dir / "sub");
  fs::create_symlink("sub/target.txt", dir / "dangling");  // relative, and to a file not there yet
  fs::create_symlink(dir / "dangling", dir / "chain");
  OutputFile f(dir / "chain");
  f.write(std::string_view("through two links"));
  f.commit();
  EXPECT_TRUE(fs::is_symlink(dir / "chain"));
  EXPECT_TRUE(fs::is_symlink(dir / "dangling"));
  EXPECT_EQ(read_bytes(dir / "sub/target.txt"), "through two links");
  fs::create_symlink("loop-b", dir / "loop-a");
  fs::create_symlink("loop-a", dir / "loop-b");
  expect_error([&] { OutputFile g(dir / "loop-a"); }, Status::invalid_argument, {"loop-a", "too many levels"});
}

// Device nodes made in the scratch directory, (1, 3) as /dev/null and (1, 7) as /dev/full:
// never the real ones, which a regression (a rename over the output) would destroy.
TEST(OutputFile, WritesDevicesInPlaceAndReportsTheirErrors) {
  ScratchDir dir;
  expect_error([&] { OutputFile f(dir.path()); }, Status::invalid_argument, {"is a directory"});
  const fs::path null_dev = dir / "null", full_dev = dir / "full";
  if (::mknod(null_dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0 ||
      ::mknod(full_dev.c_str(), S_IFCHR | 0666, makedev(1, 7)) != 0)
    GTEST_SKIP() << "mknod not permitted: device outputs not checked";
  {
    OutputFile f(null_dev);
    EXPECT_TRUE(f.in_place());
    f.write(std::string_view("gone"));
    f.commit();
  }
  EXPECT_TRUE(fs::is_character_file(null_dev));
  expect_error(
      [&] {
        OutputFile f(full_dev);
        f.write(std::string_view("no room"));
        f.commit();
      },
      Status::io, {full_dev.string() + ": write failed: No space left on device"});
  EXPECT_TRUE(fs::is_character_file(full_dev));
}

TEST(TextPieces, CutsAfterALineBreakBeforePrintableText) {
  EXPECT_EQ(text_piece_cut("one\ntwo\nthree"), 8u);
  EXPECT_EQ(text_piece_cut("one\ntwo\n three"), 4u);   // "\n " may join: cut before "two" instead
  EXPECT_EQ(text_piece_cut("no break at all"), 15u);   // ends on a character boundary
  EXPECT_EQ(text_piece_cut("caf\xC3\xA9\xC3"), 5u);    // before an incomplete character
  EXPECT_EQ(text_piece_cut(std::string(100, '\0')), 100u);
}

// The held-out text read in 4 KiB pieces encodes to the ids of encoding it whole.
TEST(TextPieces, PiecesEncodeLikeTheWholeText) {
  const fs::path text = source_dir() / "models/demo/heldout.txt";
  const Tokenizer tok = Tokenizer::load(source_dir() / "models/demo");
  TextPieceReader reader(text, 4096);
  std::string piece, joined;
  std::vector<int32_t> ids;
  int pieces = 0;
  while (reader.next(piece)) {
    EXPECT_EQ(reader.piece_offset(), joined.size());
    joined += piece;
    const std::vector<int32_t> more = tok.encode(piece);
    ids.insert(ids.end(), more.begin(), more.end());
    ++pieces;
  }
  const std::string whole = read_bytes(text);
  EXPECT_GT(pieces, 50);
  EXPECT_EQ(joined, whole);
  EXPECT_EQ(reader.bytes_read(), whole.size());
  EXPECT_EQ(ids, tok.encode(whole));
  expect_error([] { TextPieceReader r("/nonexistent/text"); }, Status::not_found, {"/nonexistent/text"});
  expect_error([] { TextPieceReader r("/tmp"); }, Status::invalid_argument, {"/tmp: is a directory"});
}
