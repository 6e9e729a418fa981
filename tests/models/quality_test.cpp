// Quality of the expert kinds, measured: for every fixture and kind, the teacher-forced
// next-token distributions over prompt + continuation from the pack against transformers'
// fp32 reference logits (logits_full.npy): mean KL(reference || pack) over positions and
// top-1 agreement. Asserts int8 KL <= 1e-4 and q4 KL <= 1e-2 (the bounds); bf16 and
// q2 are reported. Prints a markdown table (docs/quantization.md holds a copy).
//
// The pack's dense tensors keep the checkpoint's precision (the default dense dtype), so
// the numbers measure the experts' precision alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "fixture_util.h"
#include "format/npy.h"
#include "models/load.h"
#include "pack_util.h"

using namespace sluice;
using namespace sluice::test;

namespace {

struct Quality {
  double mean_kl = 0, max_kl = 0, top1 = 0;
};

// log-softmax in double.
std::vector<double> log_softmax(const float* l, int64_t V) {
  double mx = l[0];
  for (int64_t i = 1; i < V; ++i) mx = std::max(mx, static_cast<double>(l[i]));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(l[i] - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(V);
  for (int64_t i = 0; i < V; ++i) out[i] = l[i] - lse;
  return out;
}

Quality compare(const std::vector<float>& ref, const std::vector<float>& got, int64_t n, int64_t V) {
  Quality q;
  int agree = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float *a = ref.data() + t * V, *b = got.data() + t * V;
    std::vector<double> la = log_softmax(a, V), lb = log_softmax(b, V);
    double kl = 0;
    for (int64_t i = 0; i < V; ++i) kl += std::exp(la[i]) * (la[i] - lb[i]);
    q.mean_kl += kl / n;
    q.max_kl = std::max(q.max_kl, kl);
    agree += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
  }
  q.top1 = static_cast<double>(agree) / n;
  return q;
}

TEST(Quality, ExpertKindsAgainstTheFp32Reference) {
  std::printf("| fixture | kind | mean KL | max KL | top-1 agreement |\n|---|---|---|---|---|\n");
  for (const std::string& fixture : decoder_fixtures()) {
    FixtureReference ref = read_reference(fixture);
    std::vector<int32_t> ids = ref.prompt_ids;
    ids.insert(ids.end(), ref.continuation_ids.begin(), ref.continuation_ids.end());
    NpyArray want = read_npy(fixture_dir(fixture) / "logits_full.npy");
    std::map<ExpertKind, Quality> q;
    for (ExpertKind kind : {ExpertKind::bf16, ExpertKind::int8, ExpertKind::q4, ExpertKind::q2}) {
      auto backend = make_cpu_backend();
      LoadedModel m = load_model(fixture_pack(fixture), *backend, {kind});
      const int64_t V = m.model->info().n_vocab, n = static_cast<int64_t>(ids.size());
      auto state = m.model->new_state(n);
      std::vector<float> got(n * V);
      m.model->forward(ids, *state, got, true);
      q[kind] = compare(want.data, got, n, V);
      std::printf("| %s | %s | %.3g | %.3g | %.1f%% |\n", fixture.c_str(), std::string(expert_kind_name(kind)).c_str(),
                  q[kind].mean_kl, q[kind].max_kl, 100 * q[kind].top1);
    }
    SCOPED_TRACE(fixture);
    EXPECT_LE(q[ExpertKind::int8].mean_kl, 1e-4);
    EXPECT_LE(q[ExpertKind::q4].mean_kl, 1e-2);
    // The measurement sees precision: fewer bits, larger divergence.
    EXPECT_LT(q[ExpertKind::int8].mean_kl, q[ExpertKind::q4].mean_kl);
    EXPECT_LT(q[ExpertKind::q4].mean_kl, q[ExpertKind::q2].mean_kl);
  }
}

}  // namespace
