// The mapping of a trace onto a pack and the replay's rows (routing_replay.h).
#include "experts/routing_replay.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "experts/routing_fit.h"

namespace sluice {

namespace {

// A fixed permutation of n experts for pack layer `layer` (a seeded shuffle).
std::vector<int32_t> layer_permutation(int64_t n, int64_t layer, uint64_t seed) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(layer + 1) * 0xD1B54A32D192ED03ull;
  for (int64_t i = n - 1; i > 0; --i) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    const auto j = static_cast<int64_t>((x * 0x2545F4914F6CDD1Dull) % static_cast<uint64_t>(i + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

}  // namespace

std::optional<ReplayMapping> replay_mapping_from_name(std::string_view name) {
  if (name == "auto") return ReplayMapping::automatic;
  if (name == "ids") return ReplayMapping::ids;
  if (name == "fit") return ReplayMapping::fit;
  return std::nullopt;
}

ReplayTable map_routing_trace(const Trace& trace, const std::string& source, const ReplayShape& shape,
                              ReplayMapping mapping, uint64_t seed) {
  const int64_t Lp = shape.n_layers, Ep = shape.n_expert, k = shape.top_k;
  SLUICE_CHECK(Lp >= 1 && Ep >= 1 && k >= 1 && k <= Ep, Status::invalid_argument, "replayed routing: a pack of ", Lp,
               " MoE layers routing ", k, " of ", Ep, " experts a token cannot take a replayed routing");
  const int64_t Et = trace.n_expert, kt = trace.top_k;
  if (mapping == ReplayMapping::automatic) mapping = Ep == Et && k <= kt ? ReplayMapping::ids : ReplayMapping::fit;
  ReplayTable out;
  out.source = source;
  out.mapping = mapping == ReplayMapping::ids ? "ids" : "fit";
  Trace generated;
  const Trace* from = &trace;
  if (mapping == ReplayMapping::ids) {
    SLUICE_CHECK(Ep >= Et, Status::invalid_argument, "--replay-map ids: the trace ", source, " routes among ", Et,
                 " experts a layer and the pack has ", Ep, "; use --replay-map fit (a generator fitted on the trace)");
    SLUICE_CHECK(k <= kt, Status::invalid_argument, "--replay-map ids: the pack routes ", k, " experts a token and the trace ",
                 source, " records ", kt, "; use --replay-map fit (a generator fitted on the trace)");
    for (const TraceRow& r : trace.rows)
      SLUICE_CHECK(static_cast<int64_t>(r.experts.size()) >= k, Status::invalid_argument, "--replay-map ids: a row of ",
                   source, " (problem ", r.problem, ", layer ", r.layer, ", token ", r.token, ") has ", r.experts.size(),
                   " experts, fewer than the pack's top-", k);
  } else {
    const RoutingFit fit = fit_routing(trace);
    generated = generate_routing(fit, Ep, k, std::max<int64_t>(fit.n_tokens, 2048), seed);
    from = &generated;
    out.fit = fit.describe();
  }
  const TraceStream s = trace_stream(*from);
  const int64_t Lt = s.n_layers, T = s.n_tokens;
  const int64_t cycles = (Lp + Lt - 1) / Lt, shift = T / cycles;
  const bool permute = mapping == ReplayMapping::ids && Ep > Et;
  std::vector<std::vector<int32_t>> maps(static_cast<size_t>(Lp));  // [pack layer] trace id -> pack id
  for (int64_t L = 0; L < Lp; ++L) {
    if (permute) maps[static_cast<size_t>(L)] = layer_permutation(Ep, L, seed);
    else {
      maps[static_cast<size_t>(L)].resize(static_cast<size_t>(Ep));
      std::iota(maps[static_cast<size_t>(L)].begin(), maps[static_cast<size_t>(L)].end(), 0);
    }
  }
  auto map_id = [&](int64_t L, int32_t e) -> int32_t {
    const std::vector<int32_t>& m = maps[static_cast<size_t>(L)];
    return e >= 0 && e < static_cast<int32_t>(m.size()) ? m[static_cast<size_t>(e)] : -1;
  };
  out.n_layers = Lp;
  out.n_tokens = T;
  out.k = k;
  out.n_expert = Ep;
  const auto n = static_cast<size_t>(Lp * T * k);
  out.ids.resize(n);
  out.weights.resize(n);
  std::vector<int32_t> predicted(n, -1);
  out.predicts.assign(static_cast<size_t>(Lp), 0);
  for (int64_t L = 0; L < Lp; ++L) {
    const int64_t tl = L % Lt, c = L / Lt;
    // The next pack layer reads the next trace layer of the same cycle: its prediction holds.
    const bool next_in_cycle = L + 1 < Lp && tl + 1 < Lt;
    for (int64_t t = 0; t < T; ++t) {
      const TraceRow& r = s.at(tl, (t + c * shift) % T);
      const size_t at = static_cast<size_t>((L * T + t) * k);
      for (int64_t j = 0; j < k; ++j) {
        out.ids[at + static_cast<size_t>(j)] = map_id(L, r.experts[static_cast<size_t>(j)]);
        out.weights[at + static_cast<size_t>(j)] =
            r.weights.empty() ? 1.0f / static_cast<float>(r.experts.size()) : r.weights[static_cast<size_t>(j)];
      }
      if (next_in_cycle && !r.predicted_next.empty() && r.next_layer == s.layer_ids[static_cast<size_t>(tl + 1)]) {
        for (int64_t j = 0; j < k && j < static_cast<int64_t>(r.predicted_next.size()); ++j)
          predicted[at + static_cast<size_t>(j)] = map_id(L + 1, r.predicted_next[static_cast<size_t>(j)]);
        out.predicts[static_cast<size_t>(L)] = 1;
      }
    }
  }
  const int64_t n_predicting = std::count(out.predicts.begin(), out.predicts.end(), 1);
  if (n_predicting > 0) out.predicted = std::move(predicted);
  const std::string experts =
      mapping == ReplayMapping::fit
          ? str("a generator fitted on the trace (", Et, " experts, top-", kt, ") drawing ", Ep, " experts, top-", k,
                ", seed ", seed)
          : permute ? str("the trace's ", Et, " ids through a fixed permutation of the pack's ", Ep, " (seed ", seed, ")")
                    : str("the trace's ids (", Ep, " experts)");
  out.rule = str("tokens: ", s.problem_starts.size(), " problem", s.problem_starts.size() == 1 ? "" : "s", " in a stream of ",
                 T, " tokens, wrapping; layers: MoE layer L reads trace layer L mod ", Lt,
                 cycles > 1 ? str(", cycle L div ", Lt, " starting ", shift, " tokens later a cycle") : std::string(),
                 "; experts: ", experts, "; top-", k, " of ", mapping == ReplayMapping::fit ? k : kt,
                 ", weights renormalized as the family renormalizes; lookahead: the trace's predictions on ",
                 n_predicting, " of ", Lp, " layers");
  return out;
}

Trace replay_as_trace(const ReplayTable& table, int64_t n_tokens) {
  Trace tr;
  const int64_t k = table.k;
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t L = 0; L < table.n_layers; ++L) {
      const size_t at = static_cast<size_t>((L * table.n_tokens + t % table.n_tokens) * k);
      TraceRow r;
      r.layer = L;
      r.token = t;
      r.experts.assign(table.ids.begin() + static_cast<ptrdiff_t>(at), table.ids.begin() + static_cast<ptrdiff_t>(at + k));
      r.weights.assign(table.weights.begin() + static_cast<ptrdiff_t>(at),
                       table.weights.begin() + static_cast<ptrdiff_t>(at + k));
      if (!table.predicted.empty() && table.predicts[static_cast<size_t>(L)])
        for (int64_t j = 0; j < k; ++j)
          if (const int32_t e = table.predicted[at + static_cast<size_t>(j)]; e >= 0) r.predicted_next.push_back(e);
      if (!r.predicted_next.empty()) {
        r.next_layer = L + 1;
        tr.has_predictions = true;
      }
      tr.rows.push_back(std::move(r));
    }
  tr.n_layer = table.n_layers;
  tr.n_expert = static_cast<int32_t>(table.n_expert);
  tr.top_k = static_cast<int32_t>(k);
  tr.n_problems = 1;
  return tr;
}

RoutingReplay::RoutingReplay(ReplayTable table) : table_(std::move(table)) {
  SLUICE_CHECK(table_.n_layers > 0 && table_.n_tokens > 0 && table_.k > 0, Status::internal,
               "routing replay: an empty table");
  next_.assign(static_cast<size_t>(table_.n_layers), 0);
}

int64_t RoutingReplay::take(int64_t layer, int64_t n) {
  SLUICE_CHECK(layer >= 0 && layer < table_.n_layers && n >= 0, Status::internal, "routing replay: ", n,
               " rows of MoE layer ", layer, " of ", table_.n_layers);
  int64_t& next = next_[static_cast<size_t>(layer)];
  const int64_t first = next;
  next = (next + n) % table_.n_tokens;
  return first;
}

void RoutingReplay::set_position(std::vector<int64_t> position) {
  SLUICE_CHECK(position.size() == next_.size(), Status::internal, "routing replay: a position of ", position.size(),
               " layers for ", next_.size());
  next_ = std::move(position);
}

size_t RoutingReplay::row_at(int64_t layer, int64_t token) const {
  return static_cast<size_t>((layer * table_.n_tokens + token % table_.n_tokens) * table_.k);
}

Routing RoutingReplay::rows(int64_t layer, int64_t first, int64_t n, bool normalize) const {
  const int64_t k = table_.k;
  Routing r{n, k, std::vector<int32_t>(static_cast<size_t>(n * k)), std::vector<float>(static_cast<size_t>(n * k))};
  for (int64_t row = 0; row < n; ++row) {
    const size_t at = row_at(layer, first + row);
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += table_.weights[at + static_cast<size_t>(j)];
    for (int64_t j = 0; j < k; ++j) {
      const auto p = static_cast<size_t>(row * k + j);
      const float w = table_.weights[at + static_cast<size_t>(j)];
      r.ids[p] = table_.ids[at + static_cast<size_t>(j)];
      // The order of the device kernel's operations (router_replay.cu): a sum, one division.
      r.weights[p] = normalize && sum > 0 ? w / sum : w;
    }
  }
  return r;
}

std::optional<Routing> RoutingReplay::predicted(int64_t layer, int64_t first, int64_t n) const {
  if (!predicts(layer)) return std::nullopt;
  const int64_t k = table_.k;
  Routing r{n, k, std::vector<int32_t>(static_cast<size_t>(n * k)), std::vector<float>(static_cast<size_t>(n * k))};
  for (int64_t p = 0; p < n * k; ++p) {
    r.ids[static_cast<size_t>(p)] = table_.predicted[row_at(layer, first + p / k) + static_cast<size_t>(p % k)];
    r.weights[static_cast<size_t>(p)] = static_cast<float>(k - p % k);
  }
  return r;
}

bool RoutingReplay::predicts(int64_t layer) const {
  return layer >= 0 && layer < table_.n_layers && !table_.predicted.empty() && table_.predicts[static_cast<size_t>(layer)];
}

const RoutingReplayTable* RoutingReplay::device(Backend& be) {
  if (device_backend_ != &be) {
    device_ = be.make_routing_replay(table_.n_layers, table_.n_tokens, table_.k, table_.ids, table_.weights,
                                     table_.predicted);
    device_backend_ = &be;
  }
  return device_.get();
}

std::string RoutingReplay::label() const {
  return str("replayed routing from ", table_.source, " (", table_.mapping, ": ", table_.rule, ")");
}

RoutingSource RoutingReplay::source() const {
  return {true, table_.source, table_.mapping, table_.rule, table_.fit};
}

}  // namespace sluice
