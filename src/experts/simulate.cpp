// Trace reading and replay through Residency. Each independent sequence (a (problem, layer)
// pair for per-layer caches, a problem for a shared pool) gets a fresh Residency, so every
// request starts cold; Belady's oracle looks up the next use of a key in a per-sequence
// index of the steps that use it.
#include "experts/simulate.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/error.h"
#include "experts/plan.h"
#include "experts/residency.h"
#include "format/json_file.h"
#include "format/output_file.h"
#include "format/xz.h"

namespace sluice {
namespace {

// Experts per row and ids are small; these bounds only reject absurd input before it
// sizes a table.
constexpr int64_t kMaxExpertId = 1 << 16;
constexpr int64_t kMaxLayer = 1 << 12;
constexpr uint64_t kMaxTraceBytes = uint64_t{4} << 30;  // a decompressed .xz trace held in memory

int64_t int_field(const nlohmann::json& j, const char* name, const std::string& where, int64_t fallback, bool required) {
  auto it = j.find(name);
  if (it == j.end()) {
    SLUICE_CHECK(!required, Status::corrupt, where, ": missing field '", name, "'");
    return fallback;
  }
  SLUICE_CHECK(it->is_number_integer(), Status::corrupt, where, ": '", name, "' must be an integer");
  return it->get<int64_t>();
}

// One sequence to replay: a list of steps, each the keys of one (token, layer), and what the
// lookahead router predicted during that step (keys of the next layer; empty when none).
struct Sequence {
  std::vector<std::vector<int64_t>> steps;
  std::vector<std::vector<int64_t>> predicted;  // [steps] or empty
};

SimulateResult replay(const Sequence& seq, int64_t n_records, int64_t n_expert, int64_t top_k, int32_t n_slots,
                      const SimulateOptions& opt) {
  // Belady's oracle: per key, the steps that use it, ascending.
  std::map<int64_t, std::vector<uint64_t>> uses;
  if (opt.policy == PolicyKind::belady)
    for (size_t t = 0; t < seq.steps.size(); ++t)
      for (int64_t key : seq.steps[t]) uses[key].push_back(t);
  uint64_t step = 0;
  ResidencyOptions ro;
  ro.n_slots = n_slots;
  ro.n_records = n_records;
  ro.n_expert = n_expert;
  ro.policy = opt.policy;
  ro.policy_options.lrfu_half_life_slots = opt.lrfu_half_life_slots;
  ro.policy_options.markov_half_life_steps = opt.markov_half_life_steps;
  ro.policy_options.step_experts = top_k;
  if (opt.policy == PolicyKind::belady) {
    // Keys of the current step report the current step: the optimum may not evict an
    // expert the current token uses.
    ro.policy_options.next_use = [&uses, &step](int64_t key) -> uint64_t {
      auto it = uses.find(key / kExpertKindCount);
      if (it == uses.end()) return std::numeric_limits<uint64_t>::max();
      auto pos = std::lower_bound(it->second.begin(), it->second.end(), step);
      return pos == it->second.end() ? std::numeric_limits<uint64_t>::max() : *pos;
    };
  }
  const bool prefetch = opt.prefetch && opt.policy != PolicyKind::belady;
  if (prefetch) ro.speculative_slots = simulate_speculative_slots(opt, n_slots, static_cast<int32_t>(top_k));
  Residency res(ro);
  SimulateResult out;
  std::vector<AcquireResult> results;
  auto note_prediction = [&] {
    if (step < seq.predicted.size() && !seq.predicted[step].empty()) res.note_prediction(seq.predicted[step]);
  };
  for (step = 0; step < seq.steps.size(); ++step) {
    const std::vector<int64_t>& records = seq.steps[step];
    results.assign(records.size(), AcquireResult{});
    if (opt.predictions == PredictionTime::before_step) note_prediction();
    if (opt.pin == PinScope::step) {
      res.acquire_step(records, DType::bf16, results);
    } else {
      // Each access is its own request: acquired and released before the next one. The
      // engine still knows the step's union.
      res.note_step(records);
      for (size_t i = 0; i < records.size(); ++i) {
        results[i] = res.acquire(records[i], DType::bf16);
        if (results[i].status == AcquireStatus::miss) res.complete_load(results[i].slot);
        if (results[i].slot >= 0) res.release(results[i].slot);
      }
    }
    for (size_t i = 0; i < records.size(); ++i) {
      const AcquireResult& r = results[i];
      SLUICE_CHECK(r.status != AcquireStatus::no_slot, Status::internal, "simulate: no slot for record ", records[i]);
      if (r.status == AcquireStatus::miss) {
        ++out.misses;
        if (opt.pin == PinScope::step) res.complete_load(r.slot);
      } else {
        ++out.hits;
      }
      if (opt.pin == PinScope::step) res.release(r.slot);
    }
    if (opt.predictions == PredictionTime::after_step) note_prediction();
    // Lookahead (plan_prefetch): the prediction strongest first into the speculative share,
    // each read landing before the next layer's step.
    if (prefetch && step < seq.predicted.size())
      for (int64_t key : seq.predicted[step]) {
        const AcquireResult a = res.acquire(key, DType::bf16, AccessKind::prefetch);
        if (a.status == AcquireStatus::no_slot) break;
        if (a.status != AcquireStatus::miss) continue;
        ++out.prefetch_reads;
        res.complete_load(a.slot);
      }
  }
  out.prefetch_confirmed = res.counters().prefetch_confirmed;
  out.prefetch_wasted = res.counters().prefetch_wasted;
  return out;
}

}  // namespace

Trace read_trace(const std::filesystem::path& path) {
  SLUICE_CHECK(std::filesystem::exists(path), Status::not_found, "trace ", path.string(), " does not exist");
  std::ifstream file;
  std::istringstream unpacked;
  if (is_xz_path(path)) {
    unpacked.str(read_xz_file(path, kMaxTraceBytes));
  } else {
    file.open(path);
    SLUICE_CHECK(file.good(), Status::io, "cannot open trace ", path.string());
  }
  std::istream& f = is_xz_path(path) ? static_cast<std::istream&>(unpacked) : file;
  Trace tr;
  std::map<std::pair<int64_t, int64_t>, int64_t> position;  // (problem, layer) -> rows so far
  std::map<int64_t, bool> problems;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = str(path.string(), ":", line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(Status::corrupt, where, ": invalid JSON: ", describe_json_error(e, line));
    }
    SLUICE_CHECK(j.is_object(), Status::corrupt, where, ": expected a JSON object");
    TraceRow row;
    row.problem = int_field(j, "problem_id", where, 0, false);
    row.layer = int_field(j, "layer", where, 0, true);
    SLUICE_CHECK(row.layer >= 0 && row.layer < kMaxLayer, Status::corrupt, where, ": layer ", row.layer,
                 " is outside [0, ", kMaxLayer, ")");
    int64_t& pos = position[{row.problem, row.layer}];
    row.token = int_field(j, "token_idx", where, pos, false);
    ++pos;
    auto ex = j.find("experts");
    SLUICE_CHECK(ex != j.end() && ex->is_array() && !ex->empty(), Status::corrupt, where,
                 ": 'experts' must be a non-empty array of expert ids");
    for (const auto& e : *ex) {
      SLUICE_CHECK(e.is_number_integer(), Status::corrupt, where, ": 'experts' must hold integers");
      const int64_t id = e.get<int64_t>();
      SLUICE_CHECK(id >= 0 && id < kMaxExpertId, Status::corrupt, where, ": expert id ", id, " is outside [0, ",
                   kMaxExpertId, ")");
      SLUICE_CHECK(std::find(row.experts.begin(), row.experts.end(), id) == row.experts.end(), Status::corrupt, where,
                   ": expert ", id, " appears twice");
      row.experts.push_back(static_cast<int32_t>(id));
    }
    auto w = j.find("gating_probs");
    if (w == j.end()) w = j.find("weights");
    if (w != j.end()) {
      SLUICE_CHECK(w->is_array() && w->size() == row.experts.size(), Status::corrupt, where,
                   ": 'gating_probs' must be an array as long as 'experts'");
      for (const auto& x : *w) {
        SLUICE_CHECK(x.is_number(), Status::corrupt, where, ": 'gating_probs' must hold numbers");
        row.weights.push_back(x.get<float>());
      }
    }
    auto pn = j.find("predicted_next");
    if (pn != j.end()) {
      SLUICE_CHECK(pn->is_array(), Status::corrupt, where, ": 'predicted_next' must be an array of expert ids");
      for (const auto& e : *pn) {
        SLUICE_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < kMaxExpertId,
                     Status::corrupt, where, ": 'predicted_next' must hold expert ids in [0, ", kMaxExpertId, ")");
        row.predicted_next.push_back(e.get<int32_t>());
      }
      row.next_layer = int_field(j, "next_layer", where, row.layer + 1, false);
      SLUICE_CHECK(row.next_layer > row.layer && row.next_layer < kMaxLayer, Status::corrupt, where,
                   ": next_layer ", row.next_layer, " must be after layer ", row.layer, " and below ", kMaxLayer);
      tr.has_predictions = tr.has_predictions || !row.predicted_next.empty();
      for (int32_t e : row.predicted_next) tr.n_expert = std::max(tr.n_expert, e + 1);
      tr.n_layer = std::max(tr.n_layer, row.next_layer + 1);
    }
    tr.n_layer = std::max(tr.n_layer, row.layer + 1);
    for (int32_t e : row.experts) tr.n_expert = std::max(tr.n_expert, e + 1);
    tr.top_k = std::max(tr.top_k, static_cast<int32_t>(row.experts.size()));
    problems[row.problem] = true;
    tr.rows.push_back(std::move(row));
  }
  SLUICE_CHECK(!f.bad(), Status::io, "error reading trace ", path.string());
  SLUICE_CHECK(!tr.rows.empty(), Status::corrupt, "trace ", path.string(), " has no rows");
  tr.n_problems = static_cast<int64_t>(problems.size());
  return tr;
}

void write_trace(const Trace& trace, const std::filesystem::path& path) {
  OutputFile out(path);
  for (const TraceRow& r : trace.rows) {
    nlohmann::json j = {{"problem_id", r.problem}, {"layer", r.layer}, {"token_idx", r.token}, {"experts", r.experts}};
    if (!r.weights.empty()) j["gating_probs"] = r.weights;
    if (!r.predicted_next.empty()) {
      j["next_layer"] = r.next_layer;
      j["predicted_next"] = r.predicted_next;
    }
    out.write(j.dump() + "\n");
  }
  out.commit();
}

int64_t simulate_slot_cap(const Trace& trace, bool per_layer) {
  std::set<std::pair<int64_t, int32_t>> keys;  // (layer, expert)
  for (const TraceRow& r : trace.rows)
    for (int32_t e : r.experts) keys.emplace(r.layer, e);
  if (!per_layer) return static_cast<int64_t>(keys.size());
  std::map<int64_t, int64_t> per;  // layer -> distinct experts
  int64_t most = 0;
  for (const auto& [layer, e] : keys) most = std::max(most, ++per[layer]);
  return most;
}

int32_t simulate_speculative_slots(const SimulateOptions& opt, int32_t n_slots, int32_t top_k) {
  if (!opt.prefetch) return 0;
  if (opt.speculative_slots < 0) return speculative_share(n_slots, top_k);
  return std::min(opt.speculative_slots, std::max(n_slots - top_k, 0));
}

SimulateResult simulate_trace(const Trace& trace, const SimulateOptions& opt) {
  const bool per_layer = opt.slots_per_layer > 0;
  SLUICE_CHECK(per_layer != (opt.slots > 0), Status::invalid_argument,
               "simulate: give exactly one of --expert-slots-per-layer N and --expert-slots N");
  SLUICE_CHECK(!opt.prefetch || !per_layer, Status::invalid_argument,
               "simulate: --lookahead needs one shared pool (--expert-slots N): a prediction is for the next layer's cache");
  SLUICE_CHECK(!opt.prefetch || trace.has_predictions, Status::invalid_argument,
               "simulate: --lookahead needs a trace with lookahead predictions (predicted_next: sluice run "
               "--trace-routing with --lookahead on)");
  const int32_t asked = per_layer ? opt.slots_per_layer : opt.slots;
  SLUICE_CHECK(asked >= trace.top_k, Status::invalid_argument, "simulate: ", asked, " slots",
               per_layer ? " per layer" : "", " are fewer than the ", trace.top_k,
               " experts a token uses; the minimum is ", trace.top_k);
  const auto n_slots = static_cast<int32_t>(std::min<int64_t>(asked, simulate_slot_cap(trace, per_layer)));

  // Sequences in order of first appearance of their problem (and layer).
  std::vector<int64_t> order(trace.rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::map<int64_t, int64_t> problem_rank;
  for (const TraceRow& r : trace.rows) problem_rank.emplace(r.problem, static_cast<int64_t>(problem_rank.size()));
  const int64_t n_expert = trace.n_expert;
  SimulateResult total;
  auto add = [&](const Sequence& seq, int64_t n_records) {
    SimulateResult r = replay(seq, n_records, n_expert, trace.top_k, n_slots, opt);
    total.hits += r.hits;
    total.misses += r.misses;
    total.prefetch_reads += r.prefetch_reads;
    total.prefetch_confirmed += r.prefetch_confirmed;
    total.prefetch_wasted += r.prefetch_wasted;
  };
  if (per_layer) {
    // One cache per (problem, layer), rows in file order (token order within a layer).
    std::map<std::pair<int64_t, int64_t>, Sequence> seqs;
    for (const TraceRow& r : trace.rows) {
      std::vector<int64_t> keys(r.experts.begin(), r.experts.end());
      seqs[{problem_rank[r.problem], r.layer}].steps.push_back(std::move(keys));
    }
    for (const auto& [id, seq] : seqs) add(seq, n_expert);
  } else {
    // One pool per problem, its rows in token order, layers ascending within a token.
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const TraceRow &x = trace.rows[a], &y = trace.rows[b];
      const int64_t px = problem_rank[x.problem], py = problem_rank[y.problem];
      if (px != py) return px < py;
      if (x.token != y.token) return x.token < y.token;
      return x.layer < y.layer;
    });
    Sequence seq;
    int64_t current = -1;
    for (int64_t i : order) {
      const TraceRow& r = trace.rows[i];
      if (problem_rank[r.problem] != current && !seq.steps.empty()) {
        add(seq, trace.n_layer * n_expert);
        seq.steps.clear();
        seq.predicted.clear();
      }
      current = problem_rank[r.problem];
      std::vector<int64_t> keys, predicted;
      for (int32_t e : r.experts) keys.push_back(r.layer * n_expert + e);
      for (int32_t e : r.predicted_next) predicted.push_back(r.next_layer * n_expert + e);
      seq.steps.push_back(std::move(keys));
      seq.predicted.push_back(std::move(predicted));
    }
    if (!seq.steps.empty()) add(seq, trace.n_layer * n_expert);
  }
  return total;
}

}  // namespace sluice
