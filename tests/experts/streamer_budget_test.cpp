// What streaming costs and what it keeps:
//  - the KL divergence that --cut and --miss-kind cost, measured on the trained demo model
//    (models/demo: routing there is far from uniform, unlike the random fixtures) in the
//    worst case (every miss late at the deadline, every low-bit copy landed) against the
//    fully resident run of the same kind; printed as a table;
//  - memory: a child `sluice run` streaming a synthetic pack several times larger than its
//    budget stays within dense + expert cache + host cache + 10% (peak RSS from wait4).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "tests/models/fixture_util.h"
#include "tests/models/pack_util.h"
#include "convert/convert.h"
#include "testkit/synthetic_model.h"
#include "experts/streamer.h"
#include "models/load.h"

using namespace sluice;
using namespace sluice::test;
namespace fs = std::filesystem;

namespace {

const fs::path& demo_pack() {
  static fs::path p = [] {
    fs::path out = pack_test_dir("demo") / "pack";
    ConvertOptions opt;
    opt.kinds = {DType::q4, DType::q2};
    convert_checkpoint(source_dir() / "models" / "demo", out, opt);
    return out;
  }();
  return p;
}

// Token-by-token logits (decode steps), [n][V].
std::vector<std::vector<float>> decode_logits(Model& m, const std::vector<int32_t>& ids) {
  auto state = m.new_state(static_cast<int64_t>(ids.size()));
  std::vector<std::vector<float>> out;
  for (int32_t id : ids) {
    std::vector<float> l(static_cast<size_t>(m.info().n_vocab));
    m.forward(std::span<const int32_t>(&id, 1), *state, l, false);
    out.push_back(std::move(l));
  }
  return out;
}

// Mean over positions of KL(p || q), p and q the softmax of the two logit rows, in nats.
double mean_kl(const std::vector<std::vector<float>>& p_logits, const std::vector<std::vector<float>>& q_logits) {
  double total = 0;
  for (size_t t = 0; t < p_logits.size(); ++t) {
    auto log_softmax = [](const std::vector<float>& l) {
      double mx = l[0];
      for (float v : l) mx = std::max(mx, static_cast<double>(v));
      double s = 0;
      for (float v : l) s += std::exp(v - mx);
      std::vector<double> out(l.size());
      for (size_t i = 0; i < l.size(); ++i) out[i] = l[i] - mx - std::log(s);
      return out;
    };
    const std::vector<double> lp = log_softmax(p_logits[t]), lq = log_softmax(q_logits[t]);
    for (size_t i = 0; i < lp.size(); ++i) total += std::exp(lp[i]) * (lp[i] - lq[i]);
  }
  return total / static_cast<double>(p_logits.size());
}

}  // namespace

TEST(StreamerDeadline, KlOfCutAndMissKind) {
  auto be = make_cpu_backend();
  const fs::path& pack = demo_pack();
  LoadOptions lo;
  lo.expert_kind = DType::q4;
  LoadedModel resident = load_model(pack, *be, lo);
  ASSERT_TRUE(resident.tokenizer);
  std::ifstream f(source_dir() / "models" / "demo" / "heldout.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<int32_t> ids = resident.tokenizer->encode(ss.str().substr(0, 4000), false);
  ids.resize(std::min<size_t>(ids.size(), 128));
  const auto want = decode_logits(*resident.model, ids);

  // For scale: every expert at q2 instead of q4.
  lo.expert_kind = DType::q2;
  const double kl_all_q2 = mean_kl(want, decode_logits(*load_model(pack, *be, lo).model, ids));

  struct Config {
    const char* name;
    double cut;
    bool low_bit;
    bool worst_case;
  };
  const Config configs[] = {
      {"--cut 0.2", 0.2, false, true},
      {"--cut 0.35", 0.35, false, true},
      {"--cut 0.5", 0.5, false, true},
      {"--miss-kind q2", 0, true, true},
      {"--cut 0.5 --miss-kind q2", 0.5, true, true},
      {"--cut 0.5 (real timing)", 0.5, false, false},
      {"--cut 0.5 --miss-kind q2 (real timing)", 0.5, true, false},
  };
  std::printf("\nKL(resident q4 || streamed), demo model, %zu decode steps, 8 slots of 96 records:\n\n", ids.size());
  std::printf("| options | mean KL (nats/token) | cut / unique experts | of them low-bit |\n|---|---|---|---|\n");
  std::map<std::string, double> kl;
  for (const Config& c : configs) {
    lo.expert_kind = DType::q4;
    StreamerOptions so;
    so.slots = 8;
    so.cut = c.cut;
    if (c.low_bit) so.miss_kind = DType::q2;
    so.deadline_worst_case = c.worst_case;
    lo.streaming = so;
    LoadedModel m = load_model(pack, *be, lo);
    const double k = mean_kl(want, decode_logits(*m.model, ids));
    ASSERT_TRUE(m.streamer->drain(std::chrono::seconds(10)));
    const RunStats rs = m.streamer->stats();
    const LayerStats t = rs.totals();
    for (const std::string& e : rs.consistency_errors(rs.slot_bytes, Pack::open(pack, false)->kind(DType::q2).record_stride))
      ADD_FAILURE() << c.name << ": " << e;
    std::printf("| `%s` | %.5f | %llu / %llu | %llu |\n", c.name, k, static_cast<unsigned long long>(t.cut),
                static_cast<unsigned long long>(t.unique), static_cast<unsigned long long>(t.low_bit));
    kl[c.name] = k;
    EXPECT_TRUE(std::isfinite(k));
    if (c.worst_case) {
      EXPECT_GT(t.cut, 0u) << c.name;
      EXPECT_GT(k, 0) << c.name;
    }
    if (c.low_bit && c.worst_case) {
      EXPECT_EQ(t.low_bit, t.cut) << c.name << ": every late miss had its q2 copy";
    }
    if (!c.low_bit) {
      EXPECT_EQ(t.low_bit, 0u);
    }
  }
  std::printf("| every expert q2 (resident, for scale) | %.5f | | |\n\n", kl_all_q2);
  // A low-bit substitute costs less than dropping the expert; dropping only the weak ones
  // costs less than dropping more.
  EXPECT_LT(kl["--cut 0.5 --miss-kind q2"], kl["--cut 0.5"]);
  EXPECT_LT(kl["--cut 0.2"], kl["--cut 0.5"]);
  EXPECT_LT(kl["--miss-kind q2"], kl["--cut 0.5"]);
}

TEST(StreamerMemory, PeakRssWithinBudget) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory and quarantine are not the engine's";
#endif
  // A qwen3_moe of 10 layers x 32 experts of [512, 1024] bf16 (3 MiB a record, 960 MiB of
  // experts) with 114 MiB of dense weights, run with a 96 MiB cache and a 32 MiB host tier.
  SyntheticSpec spec;
  spec.n_layer = 10;
  spec.n_embd = 1024;
  spec.n_ff = 512;
  spec.n_expert = 32;
  spec.n_expert_used = 4;
  spec.n_vocab = 16384;
  const fs::path dir = pack_test_dir("memory") / "pack";
  write_synthetic_pack(dir, spec, {DType::bf16});
  const uint64_t dense = fs::file_size(dir / kPackDenseName);
  const uint64_t experts = fs::file_size(dir / "experts.bf16.bin");
  const uint64_t cache = uint64_t{96} << 20, host = uint64_t{32} << 20;
  const uint64_t budget = dense + cache + host;
  const uint64_t allowed = budget + budget / 10;  // + 10% for code, activations, KV cache
  ASSERT_GE(experts, 3 * budget) << "the pack must be several times the budget";

  const fs::path log = pack_test_dir("memory-log") / "stderr";
  const fs::path stats = pack_test_dir("memory-stats") / "stats.json";
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(null, 1);
    ::dup2(err, 2);
    const std::string model = dir.string(), stats_path = stats.string();
    const char* argv[] = {SLUICE_BINARY, "run", "--model", model.c_str(), "--tokens", "1,2,3,4", "-n", "8",
                          "--temperature", "0", "--backend", "cpu", "--threads", "2", "--expert-cache", "96M",
                          "--host-cache", "32M", "--lookahead", "on", "--stats", stats_path.c_str(), nullptr};
    ::execv(SLUICE_BINARY, const_cast<char* const*>(argv));
    std::_Exit(127);
  }
  int status = 0;
  struct rusage ru {};
  ASSERT_EQ(::wait4(pid, &status, 0, &ru), pid);
  std::ifstream ef(log);
  std::stringstream es;
  es << ef.rdbuf();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << es.str();
  const uint64_t peak = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  std::printf("memory: pack experts %.0f MiB, dense %.0f MiB, cache 96 MiB, host tier 32 MiB: budget %.0f MiB "
              "(+10%%: %.0f MiB), peak RSS %.0f MiB\n",
              experts / 1048576.0, dense / 1048576.0, budget / 1048576.0, allowed / 1048576.0, peak / 1048576.0);
  EXPECT_LE(peak, allowed);
  // The run really streamed: it read more than the cache holds.
  std::ifstream sf(stats);
  nlohmann::json j = nlohmann::json::parse(sf);
  EXPECT_GT(j["run"]["bytes_read"].get<uint64_t>(), cache);
  EXPECT_NE(es.str().find("sluice: streaming: decode"), std::string::npos) << es.str();
}
