// sluice verify: checks a pack's manifest against its files and every checksum; exit status
// 0 only for a good pack. The first bad record is named as (layer, expert, kind). Then the
// family's loader checks the manifest's config against the tensors and records it describes.
#include <chrono>
#include <cstdio>
#include <string>

#include "cli_common.h"
#include "format/pack.h"
#include "models/load.h"

namespace sluice::cli {

void register_verify(CLI::App& app) {
  struct Options {
    std::string dir;
    bool quiet = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("verify", "check a pack's files and checksums");
  cmd->add_option("PACK_DIR", opt->dir, "pack directory")->required();
  cmd->add_flag("-q,--quiet", opt->quiet, "no progress output");
  cmd->callback([opt] {
    Progress progress("verify");
    auto t0 = std::chrono::steady_clock::now();
    PackVerifyResult r;
    try {
      r = verify_pack(opt->dir, [&](const PackVerifyProgress& p) {
        if (opt->quiet) return;
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        progress.update("", p.bytes_done, p.bytes_total, s);
      });
    } catch (...) {
      progress.finish();
      throw;
    }
    progress.finish();
    if (!r.ok) {
      std::string more = r.problems.size() > 1 ? str(" (and ", r.problems.size() - 1, " more problems)") : "";
      fail(Status::corrupt, r.problems.front(), more);
    }
    check_pack_model(opt->dir);  // the manifest's config against the tensors and records
    const std::string tables = r.table_chunks_checked ? str(", ", r.table_chunks_checked, " n-gram table chunks") : "";
    std::fprintf(stderr, "sluice: %s: ok (%llu records%s, %.3f GB checked)\n", opt->dir.c_str(),
                 static_cast<unsigned long long>(r.records_checked), tables.c_str(), r.bytes_checked / 1e9);
    if (!r.not_covered.empty()) {
      std::string what;
      for (const std::string& w : r.not_covered) what += (what.empty() ? "" : ", ") + w;
      std::fprintf(stderr,
                   "sluice: %s: note: a pack written before settings and tokenizer checksums: %s not checked "
                   "(convert again to cover them)\n",
                   opt->dir.c_str(), what.c_str());
    }
  });
}

}  // namespace sluice::cli
