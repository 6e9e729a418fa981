// A decoder state's rotary tables are filled as the sequence reaches them, kRopeFill (1024)
// positions at a time (models/decoder.cpp, state_rope): a sequence that crosses the fills in
// prompt pieces and single decode tokens gets the logits of one forward over all its tokens,
// bit for bit (the bf16 KV cache makes the CPU's chunked decode exact, parity_test.cpp), so
// every row of every fill holds its own position's values. The fixtures' reference logits
// reach 256 positions; past them this is the check on the rows.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/models/fixture_util.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;

namespace {

class RopeRows : public ::testing::TestWithParam<std::string> {};

TEST_P(RopeRows, PiecesAcrossTheFillsGiveTheLogitsOfOneForward) {
  auto backend = make_cpu_backend();
  backend->set_kv_dtype(DType::bf16);
  LoadedModel m = load_model(fixture_dir(GetParam()), *backend);
  const int64_t V = m.model->info().n_vocab;
  // Pieces: one token (the first fill: rows [0, 1024)), a prompt piece up to 1000, single
  // tokens across 1024 (the second fill starts inside a decode step), a piece across 2048
  // (the third starts inside a prompt piece), single tokens, then the rest.
  std::vector<size_t> pieces = {1, 999};
  pieces.insert(pieces.end(), 40, 1);
  pieces.push_back(1000);
  pieces.insert(pieces.end(), 20, 1);
  pieces.push_back(240);
  size_t n = 0;
  for (size_t p : pieces) n += p;
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(V));

  std::vector<float> forced(n * V), got(n * V);
  m.model->forward(ids, *m.model->new_state(static_cast<int64_t>(n)), forced, true);
  auto state = m.model->new_state(static_cast<int64_t>(n));
  size_t pos = 0;
  for (size_t p : pieces) {
    std::vector<float> part(p * V);
    m.model->forward(std::span(ids).subspan(pos, p), *state, part, true);
    std::copy(part.begin(), part.end(), got.begin() + static_cast<std::ptrdiff_t>(pos * V));
    pos += p;
  }
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(0, std::memcmp(&got[i * V], &forced[i * V], V * sizeof(float)))
        << GetParam() << ": position " << i << " differs from one forward over " << n << " tokens";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RopeRows, ::testing::ValuesIn(decoder_fixtures()),
                         [](const auto& info) { return info.param; });

}  // namespace
