// PLE n-gram tables in a pack (ple.<dtype>.bin, models/pack_ngram_table.h):
//  - every row read through the pack (the IO engine, O_DIRECT where the filesystem takes it)
//    equals the checkpoint's row bit for bit, in any order, with repeats, with and without a
//    row cache, through one-page chunks (always verified) and through multi-page chunks
//    (verified only with verify_reads);
//  - the row cache stays within its byte bound, evicts the least recently used row, and
//    serves its rows without reads;
//  - a corrupted table byte is a corrupt error naming the file, the table and the rows (and
//    sluice verify reports it); a truncated table file is refused when the pack opens.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <thread>

#include "tests/models/fixture_util.h"
#include "format/checkpoint.h"
#include "format/json_file.h"
#include "format/pack.h"
#include "models/load.h"
#include "models/pack_ngram_table.h"
#include "tests/models/pack_util.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

const char* kFixture = "qwen4_exp_ple";

// The checkpoint's rows of a table as f32 [rows * cols].
std::vector<float> checkpoint_rows(const PackRowTable& t) {
  Checkpoint ck = Checkpoint::open(fixture_dir(kFixture));
  std::vector<Tensor> shards;
  for (const std::string& name : t.sources) shards.push_back(ck.get(name));
  ResidentNgramTable resident(shards);
  EXPECT_EQ(resident.n_rows(), t.rows);
  EXPECT_EQ(resident.dim(), t.cols);
  std::vector<int64_t> ids(static_cast<size_t>(t.rows));
  std::iota(ids.begin(), ids.end(), 0);
  auto be = make_cpu_backend();
  Tensor out = be->alloc(DType::f32, {t.rows, t.cols});
  resident.gather(*be, ids, out);
  return std::vector<float>(out.ptr<float>(), out.ptr<float>() + t.rows * t.cols);
}

// Rows `ids` through the table, f32 [ids.size() * cols].
std::vector<float> gather(PackNgramTable& table, const std::vector<int64_t>& ids) {
  auto be = make_cpu_backend();
  Tensor out = be->alloc(DType::f32, {static_cast<int64_t>(ids.size()), table.dim()});
  table.gather(*be, ids, out);
  return std::vector<float>(out.ptr<float>(), out.ptr<float>() + out.numel());
}

void expect_rows(const std::vector<float>& got, const std::vector<int64_t>& ids, const std::vector<float>& want,
                 int64_t cols) {
  ASSERT_EQ(got.size(), ids.size() * cols);
  for (size_t i = 0; i < ids.size(); ++i)
    ASSERT_EQ(std::memcmp(got.data() + i * cols, want.data() + ids[i] * cols, cols * sizeof(float)), 0)
        << "row " << ids[i] << " differs from the checkpoint's";
}

std::vector<int64_t> shuffled_with_repeats(int64_t n, uint32_t seed) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  for (int i = 0; i < 20; ++i) ids.push_back(ids[rng() % n]);  // repeats, also within one call
  return ids;
}

fs::path copy_pack(const std::string& name) {
  fs::path d = pack_test_dir(name);
  fs::copy(fixture_pack(kFixture), d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return d;
}

void poke(const fs::path& file, uint64_t offset, uint8_t xor_mask) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ xor_mask);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

}  // namespace

TEST(PleTable, RowsThroughThePackEqualTheCheckpoint) {
  std::shared_ptr<Pack> pack = Pack::open(fixture_pack(kFixture), false);
  ASSERT_TRUE(pack->manifest().ple.has_value());
  ASSERT_EQ(pack->manifest().ple->tables.size(), 2u);  // ple_layer_ids [1, 3]
  for (const PackRowTable& t : pack->manifest().ple->tables) {
    SCOPED_TRACE(t.prefix);
    EXPECT_EQ(t.sources.size(), 2u);  // the fixture stores each table in 2 shards
    const std::vector<float> want = checkpoint_rows(t);
    for (uint64_t cache : {uint64_t{0}, kDefaultNgramCacheBytes}) {
      NgramTableOptions opt;
      opt.cache_bytes = cache;
      PackNgramTable table(pack, t, opt);
      EXPECT_TRUE(table.verifies());  // one-page chunks: every read is checked
      const std::vector<int64_t> ids = shuffled_with_repeats(t.rows, 7);
      expect_rows(gather(table, ids), ids, want, t.cols);
      const auto first = table.counters();
      EXPECT_EQ(first.misses, ids.size());  // an empty cache; repeats share their page's read
      EXPECT_EQ(first.reads, static_cast<uint64_t>((t.row_offset(t.rows) - t.offset + 4095) / 4096));
      // And again, one row per call (decode-sized lookups): from the cache when there is one.
      for (int64_t id : {int64_t{0}, t.rows - 1, t.rows / 2})
        expect_rows(gather(table, {id}), {id}, want, t.cols);
      const auto c = table.counters();
      EXPECT_EQ(c.hits, cache ? 3u : 0u);
      EXPECT_EQ(c.reads, first.reads + (cache ? 0u : 3u));
      EXPECT_EQ(c.chunks_verified, c.reads);
    }
  }
  // The model runs from these rows: tested end to end by hybrid_pack_test.cpp.
}

// A pack's tables share one reader (one IO engine, as PackSource builds them): lookups of
// both tables from two threads at once, no row cache, each get their own rows.
TEST(PleTable, TablesSharingOneReaderOnTwoThreadsGetTheirOwnRows) {
  std::shared_ptr<Pack> pack = Pack::open(fixture_pack(kFixture), false);
  const auto& tables = pack->manifest().ple->tables;
  ASSERT_EQ(tables.size(), 2u);
  NgramTableOptions opt;
  opt.cache_bytes = 0;
  auto reader = std::make_shared<PleFileReader>(*pack, opt);
  std::vector<std::unique_ptr<PackNgramTable>> shared;
  std::vector<std::vector<float>> want;
  for (const PackRowTable& t : tables) {
    shared.push_back(std::make_unique<PackNgramTable>(pack, t, opt, reader));
    want.push_back(checkpoint_rows(t));
  }
  std::vector<std::vector<float>> got(2);
  std::vector<std::vector<int64_t>> asked(2);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      for (int round = 0; round < 20; ++round) {
        const std::vector<int64_t> ids = shuffled_with_repeats(tables[i].rows, 11 + round);
        const std::vector<float> rows = gather(*shared[i], ids);
        asked[i].insert(asked[i].end(), ids.begin(), ids.end());
        got[i].insert(got[i].end(), rows.begin(), rows.end());
      }
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE(tables[i].prefix);
    expect_rows(got[i], asked[i], want[i], tables[i].cols);
  }
}

TEST(PleTable, CacheEvictsTheLeastRecentlyUsedRowWithinItsBound) {
  std::shared_ptr<Pack> pack = Pack::open(fixture_pack(kFixture), false);
  const PackRowTable& t = pack->manifest().ple->tables[0];
  const std::vector<float> want = checkpoint_rows(t);
  const uint64_t row = static_cast<uint64_t>(t.cols) * sizeof(float);
  NgramTableOptions opt;
  opt.cache_bytes = 10 * row + row / 2;  // room for 10 rows
  PackNgramTable table(pack, t, opt);
  std::vector<int64_t> first(30);
  std::iota(first.begin(), first.end(), 0);
  expect_rows(gather(table, first), first, want, t.cols);
  EXPECT_EQ(table.cached_rows(), 10);
  EXPECT_LE(table.cached_bytes(), opt.cache_bytes);
  EXPECT_EQ(table.counters().evictions, 20u);
  // The last 10 rows are the cached ones: no read.
  const uint64_t reads = table.counters().reads;
  std::vector<int64_t> last(first.end() - 10, first.end());
  expect_rows(gather(table, last), last, want, t.cols);
  EXPECT_EQ(table.counters().reads, reads);
  EXPECT_EQ(table.counters().hits, 10u);
  // Touch row 20 (now most recent), then bring in 9 new rows: rows 21..29 go, 20 stays.
  expect_rows(gather(table, {20}), {20}, want, t.cols);
  std::vector<int64_t> fresh(9);
  std::iota(fresh.begin(), fresh.end(), 100);
  expect_rows(gather(table, fresh), fresh, want, t.cols);
  const uint64_t hits = table.counters().hits;
  expect_rows(gather(table, {20}), {20}, want, t.cols);
  EXPECT_EQ(table.counters().hits, hits + 1) << "the recently used row was evicted";
  const uint64_t misses = table.counters().misses;
  expect_rows(gather(table, {21}), {21}, want, t.cols);
  EXPECT_EQ(table.counters().misses, misses + 1) << "the least recently used row was kept";
  EXPECT_EQ(table.cached_rows(), 10);
}

TEST(PleTable, MultiPageChunksAreVerifiedOnlyWhenAsked) {
  // Rewrite the manifest with chunks of 4 pages (checksums recomputed from the file), as
  // the writer lays out tables above 65536 pages.
  fs::path dir = copy_pack("ple-multipage");
  nlohmann::json j = read_json_file(dir / "manifest.json");
  std::shared_ptr<Pack> orig = Pack::open(dir, false);
  const fs::path file = orig->ple_file();
  std::ifstream in(file, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (auto& tj : j["ple"]["tables"]) {
    const int64_t stride = tj["row_stride"], rows = tj["rows"];
    const uint64_t offset = tj["offset"];
    const int64_t chunk_rows = 4 * 4096 / stride;
    tj["chunk_rows"] = chunk_rows;
    tj["checksums"] = nlohmann::json::array();
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const uint64_t n = static_cast<uint64_t>(std::min(chunk_rows, rows - r0) * stride);
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx",
                    static_cast<unsigned long long>(XXH3_64bits(bytes.data() + offset + r0 * stride, n)));
      tj["checksums"].push_back(hex);
    }
  }
  std::ofstream(dir / "manifest.json") << j.dump(1);
  std::shared_ptr<Pack> pack = Pack::open(dir, false);
  ASSERT_TRUE(verify_pack(dir).ok);
  const PackRowTable& t = pack->manifest().ple->tables[0];
  const std::vector<float> want = checkpoint_rows(t);
  const std::vector<int64_t> ids = shuffled_with_repeats(t.rows, 3);
  for (bool verify : {false, true}) {
    SCOPED_TRACE(verify ? "verify_reads" : "default");
    NgramTableOptions opt;
    opt.verify_reads = verify;
    PackNgramTable table(pack, t, opt);
    EXPECT_EQ(table.verifies(), verify);
    expect_rows(gather(table, ids), ids, want, t.cols);
    EXPECT_EQ(table.counters().chunks_verified > 0, verify);
  }
}

TEST(PleTable, CorruptRowIsAClearError) {
  fs::path dir = copy_pack("ple-corrupt");
  std::shared_ptr<Pack> pack0 = Pack::open(dir, false);
  const PackRowTable& t0 = pack0->manifest().ple->tables[1];
  const int64_t bad_row = t0.rows - 3;
  poke(pack0->ple_file(), t0.row_offset(bad_row) + 1, 0x40);
  std::shared_ptr<Pack> pack = Pack::open(dir, false);
  const PackRowTable& t = pack->manifest().ple->tables[1];
  PackNgramTable table(pack, t, {});
  try {
    gather(table, {bad_row});
    ADD_FAILURE() << "a corrupted row was served";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::corrupt);
    const std::string msg = e.what();
    for (const std::string& part : {std::string("ple.bf16.bin"), t.prefix, std::string("checksum")})
      EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
  // Rows of the other table are unaffected; verify names the bad chunk.
  PackNgramTable other(pack, pack->manifest().ple->tables[0], {});
  EXPECT_NO_THROW(gather(other, {0, 1, 2}));
  PackVerifyResult r = verify_pack(dir);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.problems.front().find(t.prefix), std::string::npos) << r.problems.front();
  EXPECT_NE(r.problems.front().find("checksum mismatch"), std::string::npos) << r.problems.front();
}

TEST(PleTable, TruncatedTableFileIsRefused) {
  fs::path dir = copy_pack("ple-truncated");
  const fs::path file = Pack::open(dir, false)->ple_file();
  fs::resize_file(file, fs::file_size(file) - 4096);
  auto be = make_cpu_backend();
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      if (attempt == 0) Pack::open(dir, false);
      else load_model(dir, *be);
      ADD_FAILURE() << "a truncated table file was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::corrupt);
      const std::string msg = e.what();
      EXPECT_NE(msg.find("ple.bf16.bin"), std::string::npos) << msg;
      EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    }
  }
}

TEST(PleTable, MissingTableFileIsRefused) {
  fs::path dir = copy_pack("ple-missing");
  fs::remove(Pack::open(dir, false)->ple_file());
  try {
    Pack::open(dir, false);
    ADD_FAILURE() << "a pack without its table file opened";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::not_found);
    EXPECT_NE(std::string(e.what()).find("ple.bf16.bin"), std::string::npos) << e.what();
  }
}

// The manifest's table entries are untrusted like the rest of it (format/pack.cpp).
TEST(PleTable, ManifestErrorsNameTheField) {
  using json = nlohmann::json;
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"stride not a power of two", [](json& j) { j["ple"]["tables"][0]["row_stride"] = 24; }, {"ple.tables[0].row_stride", "power of two"}},
      {"stride below a row", [](json& j) { j["ple"]["tables"][0]["row_stride"] = 8; }, {"ple.tables[0].row_stride", "smaller than a row"}},
      {"rows past the end", [](json& j) { j["ple"]["tables"][1]["rows"] = 100000; }, {"ple.tables[1]", "past the end"}},
      {"tables overlap", [](json& j) { j["ple"]["tables"][1]["offset"] = j["ple"]["tables"][0]["offset"]; }, {"ple.tables"}},
      {"unaligned table", [](json& j) { j["ple"]["tables"][0]["offset"] = 4160; }, {"ple.tables[0].offset", "4096"}},
      {"chunk not page-sized", [](json& j) { j["ple"]["tables"][0]["chunk_rows"] = 100; }, {"ple.tables[0].chunk_rows", "multiple of 4096"}},
      {"checksum count", [](json& j) { j["ple"]["tables"][0]["checksums"].push_back("0000000000000000"); }, {"ple.tables[0].checksums", "entries"}},
      {"integer dtype", [](json& j) { j["ple"]["dtype"] = "i32"; }, {"ple.dtype", "does not fit"}},
      {"file outside the pack", [](json& j) { j["ple"]["file"] = "../ple.bin"; }, {"ple.file", "plain"}},
      {"file size unaligned", [](json& j) { j["ple"]["bytes"] = 5000; }, {"ple.bytes", "multiple of 4096"}},
      {"absurd rows", [](json& j) { j["ple"]["tables"][0]["rows"] = int64_t{1} << 50; }, {"ple.tables[0].rows", "exceeds the limit"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    fs::path dir = copy_pack("ple-manifest");
    json j = read_json_file(dir / "manifest.json");
    c.edit(j);
    std::ofstream(dir / "manifest.json") << j.dump(1);
    try {
      Pack::open(dir, false);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::corrupt);
      for (const std::string& f : c.fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  }
}
