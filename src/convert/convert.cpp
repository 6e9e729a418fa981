// convert_checkpoint: the steps of convert_steps.h in order. Finds the routed experts of a
// checkpoint by name and validates the checkpoint against its family before anything is
// written, then writes dense.bin, the n-gram tables and one experts.<kind>.bin per kind in a
// hidden staging directory, journaling each finished piece (convert_journal.h), fsyncs,
// checks that the result loads, and renames it into place. An interrupted convert keeps its
// staging directory and journal, and the next convert of the same checkpoint with the same
// options resumes it. The writing pieces it shares with sluice synth are in pack_writer.h.
#include "convert/convert.h"

#include <algorithm>
#include <cmath>

#include <xxhash.h>

#include "convert/convert_journal.h"
#include "convert/convert_steps.h"
#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "format/checkpoint.h"
#include "format/file_io.h"
#include "format/json_file.h"
#include "models/load.h"
#include "models/ple.h"
#include "models/registry.h"

namespace sluice {

namespace fs = std::filesystem;

// ---- ConvertReporter ----

void ConvertReporter::advance(std::string_view stage, uint64_t bytes, int64_t records_done) {
  progress_.stage = stage;
  progress_.bytes_done = std::min(progress_.bytes_total, progress_.bytes_done + bytes);
  if (records_done >= 0) progress_.records_done = records_done;
  progress_.seconds = seconds();
  if (opt_.progress) opt_.progress(progress_);
}

void ConvertReporter::check_cancel() const {
  if (cancelled()) fail(Status::io, "convert interrupted");
}

double ConvertReporter::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

namespace {

// The routed expert layers must be loaded by the family with exactly the pack's expert
// tensors; a dry run of the family loader over the checkpoint (which maps but does not read
// the weights, FP8 ones included) checks config, shapes and that every tensor is used, before
// anything is written. Records the tensors the family reads only as matrices
// (WeightLoader::take_matrix): the ones `--dense int8|q4` may quantize; and those it needs at
// their stored precision (WeightSource::note_exact), which dense.bin holds in f32.
void validate_against_family(const Checkpoint& ck, ConvertPlan& plan) {
  auto backend = make_cpu_backend();
  CheckpointSource source(ck, /*dry_run=*/true);
  plan.family->load(plan.config, source, *backend);
  plan.matrices = source.matrices();
  plan.exact = source.exact();
}

// 1. What stays out of dense.bin: the towers of a multimodal checkpoint and the
// multi-token-prediction layers (left out of the pack: decoding never reads them), the PLE
// n-gram tables (their own row-addressable file), the routed experts (found by name; FP8 ones
// by the dtype they dequantize to).
void inspect_checkpoint(const Checkpoint& ck, ConvertPlan& plan) {
  const Family& family = *plan.family;
  const std::vector<std::string> mtp = family.mtp_prefixes(plan.config);
  auto in_mtp = [&](const std::string& name) {
    return std::any_of(mtp.begin(), mtp.end(), [&](const std::string& p) { return name.rfind(p, 0) == 0; });
  };
  int64_t mtp_left_out = 0;
  std::vector<TensorDecl> decls;
  for (const std::string& name : ck.names()) {
    if (family.in_tower(name)) {
      plan.left_out.insert(name);
      continue;
    }
    if (in_mtp(name)) {
      plan.left_out.insert(name);
      ++mtp_left_out;
      continue;
    }
    if (auto t = ngram_table_tensor(name)) {
      plan.tables[t->table].push_back({t->shard, name});
      continue;
    }
    decls.push_back({name, ck.dtype(name), ck.entry(name).shape});
  }
  if (static_cast<int64_t>(plan.left_out.size()) > mtp_left_out)
    LOG_INFO("convert: ", family.model_type, ": leaving out what the text model never reads (",
             static_cast<int64_t>(plan.left_out.size()) - mtp_left_out, " tensors under ", family.towers_text(),
             "); the pack holds the text model");
  if (mtp_left_out > 0)
    LOG_INFO("convert: ", family.model_type, ": leaving out the multi-token-prediction layer (", mtp_left_out,
             " tensors); decoding does not use it");
  plan.layers = find_expert_layers(decls, ck.dir().string(), plan.expert_names, family.fused_experts, true);
  if (plan.layers.empty()) LOG_INFO("convert: ", family.model_type, ": no routed experts; the pack holds dense weights only");
  size_t n_fp8 = 0;
  for (const std::string& name : ck.names()) n_fp8 += ck.fp8(name) != nullptr;
  if (n_fp8)
    LOG_INFO("convert: ", n_fp8, " FP8 weights with block scales, dequantized (", dtype_name(ck.fp8_dtype()),
             " is what a run of the checkpoint holds)");
}

// 3. The manifest skeleton and the dense tensors in checkpoint file order. The dense dtype
// by default: bf16 when every float tensor is bf16 or FP8 (a bf16 model quantized), f32
// otherwise (so it never loses precision).
void plan_manifest(const Checkpoint& ck, const ConvertOptions& opt, ConvertPlan& plan) {
  plan.kinds = plan.layers.empty() ? std::vector<DType>{} : opt.kinds;
  std::sort(plan.kinds.begin(), plan.kinds.end());
  PackManifest& m = plan.skeleton;
  m.family = std::string(plan.family->model_type);
  m.config = plan.config;
  pack_manifest_set_experts(m, plan.layers, plan.kinds);
  bool all_bf16 = true;
  for (const std::string& name : ck.names()) {
    const SafetensorsEntry& e = ck.entry(name);
    plan.bytes_total += e.end - e.begin;
    if (plan.expert_names.count(name) || plan.left_out.count(name) || ngram_table_tensor(name)) continue;
    plan.dense_names.push_back(name);
    if (dtype_is_float(e.dtype) && e.dtype != DType::bf16 && !plan.exact.count(name)) all_bf16 = false;
  }
  plan.dense_quant = opt.dense_dtype && dtype_is_quantized(*opt.dense_dtype) ? opt.dense_dtype : std::nullopt;
  const DType by_default = all_bf16 ? DType::bf16 : DType::f32;
  m.dense_dtype = plan.dense_quant ? by_default : opt.dense_dtype.value_or(by_default);
  SLUICE_CHECK(m.dense_dtype == DType::f32 || m.dense_dtype == DType::bf16, Status::invalid_argument,
               "convert: dense dtype must be f32, bf16, int8 or q4");
  SLUICE_CHECK(!plan.dense_quant || is_dense_quant_dtype(*plan.dense_quant), Status::invalid_argument,
               "convert: dense dtype must be f32, bf16, int8 or q4");
  std::sort(plan.dense_names.begin(), plan.dense_names.end(), [&](const std::string& a, const std::string& b) {
    const fs::path &fa = ck.file_of(a).path(), &fb = ck.file_of(b).path();
    return fa != fb ? fa < fb : ck.entry(a).begin < ck.entry(b).begin;
  });
}

// 7. The tokenizer files (tokenizer.json or Kimi's tiktoken.model, tokenizer_config.json, a
// chat_template.jinja) and the manifest (last: a directory without it is not a pack).
void write_pack_metadata(const fs::path& hf_dir, PackManifest& m, const fs::path& dir) {
  std::error_code ec;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "tiktoken.model", "chat_template.jinja"}) {
    if (!fs::is_regular_file(hf_dir / name, ec)) continue;
    std::string bytes = read_file_bytes(hf_dir / name, json_file_max, "a tokenizer file");
    fs::remove(dir / name, ec);  // a resumed convert may have written it before
    write_small_file(dir / name, bytes.data(), bytes.size());
    m.tokenizer_files.push_back(name);
    m.tokenizer_checksums[name] = XXH3_64bits(bytes.data(), bytes.size());
  }
  const std::string manifest = pack_manifest_to_json(m);
  write_small_file(dir / kPackManifestName, manifest.data(), manifest.size());
  fsync_dir(dir);
}

// Stored checkpoint bytes that the resumed pieces stand for (the progress starts there).
uint64_t resumed_bytes(const Checkpoint& ck, const ConvertPlan& plan, const ResumePoint& at, int64_t n_records) {
  uint64_t dense = 0, tables = 0;
  for (const std::string& n : plan.dense_names) dense += ck.entry(n).end - ck.entry(n).begin;
  for (const auto& [table, parts] : plan.tables)
    for (const auto& part : parts) tables += ck.entry(part.second).end - ck.entry(part.second).begin;
  const uint64_t experts = plan.bytes_total - dense - tables;
  return (at.dense ? dense : 0) + (at.ple ? tables : 0) +
         (n_records ? static_cast<uint64_t>(static_cast<double>(experts) * at.first_record / n_records) : 0);
}

// Whether a partial pack left at `partial` is this convert's to resume; says why not.
bool resumable(const fs::path& partial, const nlohmann::json& fp, const ConvertOptions& opt) {
  if (!opt.resume) {
    LOG_INFO("convert: not resuming ", partial.string(), " (--no-resume): starting over");
    return false;
  }
  if (ConvertJournal::matches(partial, fp)) return true;
  std::error_code ec;
  if (fs::exists(partial / ConvertJournal::kFileName, ec))
    LOG_INFO("convert: ", partial.string(), " was begun from another checkpoint, other files or other options: ",
             "starting over");
  return false;
}

}  // namespace

ConvertPlan plan_convert(const fs::path& hf_dir, const Checkpoint& ck, const ConvertOptions& opt) {
  ConvertPlan plan;
  plan.config = read_json_file(hf_dir / "config.json");
  plan.family = &find_family(plan.config);
  validate_against_family(ck, plan);
  inspect_checkpoint(ck, plan);
  plan_manifest(ck, opt, plan);
  return plan;
}

ConvertSummary convert_checkpoint(const fs::path& hf_dir, const fs::path& out_arg, const ConvertOptions& opt) {
  ConvertReporter report(opt);
  SLUICE_CHECK(!opt.kinds.empty(), Status::invalid_argument, "convert: no expert kinds to write");

  // 1 + 3. The checkpoint, its family and the manifest skeleton: fail before anything is written.
  std::error_code ec;
  SLUICE_CHECK(fs::is_directory(hf_dir, ec), Status::not_found, hf_dir.string(), ": no such checkpoint directory (it ",
               path_kind_text(hf_dir), ")");
  SLUICE_CHECK(!Pack::is_pack(hf_dir), Status::invalid_argument, hf_dir.string(),
               " is already a sluice pack (convert reads an HF checkpoint directory)");
  const Checkpoint ck = Checkpoint::open(hf_dir);
  const ConvertPlan plan = plan_convert(hf_dir, ck, opt);
  const nlohmann::json fp = ConvertJournal::fingerprint(ck, plan.skeleton, opt);

  // 2. The output location: a fresh staging directory, or the partial pack of an
  // interrupted convert of the same checkpoint and options.
  PackStaging staging(out_arg, opt.force, "convert", [&](const fs::path& p) { return resumable(p, fp, opt); });
  const fs::path& dir = staging.dir();
  PackManifest m = plan.skeleton;
  report.set_totals(m.n_records(), plan.bytes_total);
  std::unique_ptr<ConvertJournal> journal;
  ResumePoint at;
  if (staging.resumed()) {
    at = resume_partial_pack(dir, plan, m, report, journal, fp);
    report.advance("verifying", resumed_bytes(ck, plan, at, m.n_records()), at.first_record);
  } else {
    journal = std::make_unique<ConvertJournal>(dir, fp);
  }

  // 4 - 6. The data files, each piece journaled once written.
  CheckpointReader reader(ck);
  try {
    if (!at.dense) {
      write_dense_file(plan, reader, m, dir, report);
      journal->stage_done("dense", m);
    }
    if (!at.ple && !plan.tables.empty()) {
      write_ple_tables(plan, reader, m, dir, report);
      journal->stage_done("ple", m);
    }
    write_expert_records(plan, reader, m, dir, report, at.first_record, journal.get());
  } catch (const Error& e) {
    // An interrupt or an IO error (a full disk, a failing read) keeps what is written, to be
    // resumed; a bad checkpoint would fail the same way again, so its partial pack goes.
    const bool progress = m.dense_file_bytes > 0;
    if (!(report.cancelled() || e.status() == Status::io) || !progress) {
      if (report.cancelled()) fail(Status::io, "convert interrupted; nothing was written to the output");
      throw;
    }
    staging.keep();
    const std::string kept = str("; ", journal->records(), " of ", m.n_records(), " records are written in ", dir.string(),
                                 ", and the same command resumes from there (--no-resume starts over)");
    if (report.cancelled()) fail(Status::io, "convert interrupted", kept);
    throw Error(e.status(), e.what() + kept);
  }
  journal.reset();
  fs::remove(dir / ConvertJournal::kFileName, ec);

  // 7. Tokenizer files and the manifest; 8. the result must load as its family at every
  // kind; 9. into place.
  write_pack_metadata(hf_dir, m, dir);
  check_pack_loads(dir, plan.kinds, "convert");
  staging.commit();

  ConvertSummary s;
  s.out_dir = staging.out_dir();
  s.family = m.family;
  s.n_records = m.n_records();
  s.bytes_in = plan.bytes_total;
  s.bytes_out = m.dense_file_bytes + (m.ple ? m.ple->file_bytes : 0);
  for (const auto& [k, info] : m.kinds) s.bytes_out += kPackHeaderBytes + static_cast<uint64_t>(m.n_records()) * info.record_stride;
  s.seconds = report.seconds();
  s.dense_dtype = m.dense_dtype;
  s.dense_quant = plan.dense_quant;
  s.n_dense = static_cast<int64_t>(m.dense.size());
  s.n_dense_quantized = std::count_if(m.dense.begin(), m.dense.end(), [](const PackDenseTensor& t) { return dtype_is_quantized(t.dtype); });
  s.kinds = plan.kinds;
  s.resumed_records = at.first_record;
  return s;
}

}  // namespace sluice
