// `sluice verify` covers a pack's model settings and tokenizer files: manifest.json carries a
// checksum of the family and config (settings_checksum) and of each tokenizer file
// (tokenizer_checksums). An edited num_experts_per_tok, norm_topk_prob, rope_theta,
// rms_norm_eps or max_position_embeddings, or a flipped byte in tokenizer.json, passed verify
// and then ran with other text; now verify fails naming what changed. A pack written before
// the checksums verifies as before, with a note that they are not covered.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/models/pack_util.h"
#include "tests/tools/cli/cli_child.h"
#include "format/pack.h"

namespace fs = std::filesystem;
using namespace sluice;
using namespace sluice::test;
using nlohmann::json;

namespace {

fs::path pack_copy(const std::string& name) {
  const fs::path d = child_scratch(name);
  fs::copy(fixture_pack("qwen3_moe"), d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return d;
}

}  // namespace

TEST(VerifySettings, EditedSettingsFailVerify) {
  {
    const ChildResult r = run_sluice_child({"verify", "-q", fixture_pack("qwen3_moe").string()});
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err.find("note:"), std::string::npos) << r.err;
  }
  const std::vector<std::pair<std::string, json>> edits = {{"num_experts_per_tok", 3},
                                                           {"norm_topk_prob", false},
                                                           {"rope_theta", 12345.0},
                                                           {"rms_norm_eps", 1e-5},
                                                           {"max_position_embeddings", 999999}};
  for (const auto& [key, value] : edits) {
    const fs::path d = pack_copy("settings-" + key);
    edit_json_file(d / kPackManifestName, [&](json& j) { j["config"][key] = value; });
    const ChildResult r = run_sluice_child({"verify", "-q", d.string()});
    EXPECT_EQ(r.status, 1) << key << ": " << r.err;
    EXPECT_NE(r.err.find("the model settings (family and config) do not match settings_checksum"), std::string::npos)
        << key << ": " << r.err;
  }
}

TEST(VerifySettings, AFlippedTokenizerByteFailsVerify) {
  const fs::path d = pack_copy("tokenizer-flip");
  {
    std::fstream f(d / "tokenizer.json", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char c = 0;
    f.read(&c, 1);
    f.seekp(100);
    c ^= 0x01;
    f.write(&c, 1);
  }
  const ChildResult r = run_sluice_child({"verify", "-q", d.string()});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find((d / "tokenizer.json").string() + ": checksum mismatch"), std::string::npos) << r.err;
}

TEST(VerifySettings, APackWithoutTheChecksumsIsReportedNotRejected) {
  const fs::path d = pack_copy("older-pack");
  edit_json_file(d / kPackManifestName, [](json& j) {
    j.erase("settings_checksum");
    j.erase("tokenizer_checksums");
  });
  const ChildResult r = run_sluice_child({"verify", "-q", d.string()});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("note: a pack written before settings and tokenizer checksums: the model settings, tokenizer.json"),
            std::string::npos)
      << r.err;
  // A checksum list that leaves a listed file out is a corrupt manifest, not an older pack.
  edit_json_file(d / kPackManifestName, [](json& j) { j["tokenizer_checksums"] = json::object(); });
  const ChildResult bad = run_sluice_child({"verify", "-q", d.string()});
  EXPECT_EQ(bad.status, 1) << bad.err;
  EXPECT_NE(bad.err.find("tokenizer_checksums"), std::string::npos) << bad.err;
}
