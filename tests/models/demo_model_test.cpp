// The bundled demo model (models/demo): sluice's held-out perplexity equals the training
// framework's (transformers, f32, same windows; recorded in reference.json) within 1%.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/perplexity.h"
#include "format/json_file.h"
#include "models/load.h"

using namespace sluice;

TEST(DemoModel, HeldOutPerplexityMatchesTransformers) {
  const std::filesystem::path dir = std::filesystem::path(SLUICE_SOURCE_DIR) / "models" / "demo";
  nlohmann::json ref = read_json_file(dir / "reference.json");
  auto backend = make_cpu_backend();
  LoadedModel m = load_model(dir, *backend);
  ASSERT_TRUE(m.tokenizer.has_value());
  std::ifstream f(dir / "heldout.txt", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<int32_t> ids = m.tokenizer->encode(ss.str());
  PerplexityResult r = perplexity(*m.model, ids, ref.at("ctx").get<int64_t>());
  const double want = ref.at("heldout_perplexity").get<double>();
  std::printf("held-out perplexity: sluice %.4f, transformers %.4f (%lld tokens scored)\n", r.perplexity, want,
              static_cast<long long>(r.n_scored));
  EXPECT_EQ(r.n_scored, ref.at("heldout_tokens_scored").get<int64_t>());  // same tokenization and windows
  EXPECT_LE(std::fabs(r.perplexity / want - 1.0), 0.01);
}
