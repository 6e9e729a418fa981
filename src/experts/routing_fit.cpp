// The trace stream, the generator's statistics, its fit and its draws (routing_fit.h).
#include "experts/routing_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>

#include "core/error.h"

namespace sluice {

namespace {

// A small deterministic generator (splitmix64): the same draws on every platform, which the
// standard distributions do not promise.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

bool contains(const std::vector<int32_t>& v, int32_t e) { return std::find(v.begin(), v.end(), e) != v.end(); }

size_t overlap(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  for (int32_t e : a) n += contains(b, e) ? 1 : 0;
  return n;
}

// The favourite follower of each expert (ties: the lower id; -1 for one never followed) from
// the counts of the (a, b) pairs `pairs` visits, b != a when `others`; then the mean share of
// the rows `rows` visits that are the favourite of one of their leaders.
using PairVisit = std::function<void(const std::function<void(const std::vector<int32_t>& leaders,
                                                               const std::vector<int32_t>& row)>&)>;
double favourite_share(const PairVisit& visit, int64_t n_expert, int64_t top_k, bool others) {
  std::vector<uint32_t> c(static_cast<size_t>(n_expert * n_expert), 0);
  visit([&](const std::vector<int32_t>& leaders, const std::vector<int32_t>& row) {
    for (int32_t a : leaders)
      for (int32_t b : row)
        if (!others || a != b) ++c[static_cast<size_t>(a * n_expert + b)];
  });
  std::vector<int32_t> fav(static_cast<size_t>(n_expert), -1);
  for (int64_t a = 0; a < n_expert; ++a) {
    uint32_t best = 0;
    for (int64_t b = 0; b < n_expert; ++b)
      if (c[static_cast<size_t>(a * n_expert + b)] > best) {
        best = c[static_cast<size_t>(a * n_expert + b)];
        fav[static_cast<size_t>(a)] = static_cast<int32_t>(b);
      }
  }
  double hit = 0, rows = 0;
  std::vector<int32_t> favs;
  visit([&](const std::vector<int32_t>& leaders, const std::vector<int32_t>& row) {
    favs.clear();
    for (int32_t a : leaders) favs.push_back(fav[static_cast<size_t>(a)]);
    hit += static_cast<double>(overlap(row, favs)) / static_cast<double>(top_k);
    rows += 1;
  });
  return rows > 0 ? hit / rows : 0;
}

// What the fit measures of a stream, per layer: reuse, transition and sequel (with the
// stream's own favourites), recall.
struct StreamStats {
  std::vector<std::vector<double>> counts;  // [layer][expert]
  std::vector<double> reuse, transition, sequel, recall;
};

StreamStats measure(const TraceStream& s, int64_t n_expert, int64_t top_k) {
  const int64_t L = s.n_layers, T = s.n_tokens;
  StreamStats st;
  st.counts.assign(static_cast<size_t>(L), std::vector<double>(static_cast<size_t>(n_expert), 0.0));
  st.reuse.assign(static_cast<size_t>(L), 0.0);
  st.transition.assign(static_cast<size_t>(L), 0.0);
  st.sequel.assign(static_cast<size_t>(L), 0.0);
  st.recall.assign(static_cast<size_t>(L), -1.0);
  std::vector<uint8_t> start(static_cast<size_t>(T), 0);
  for (int64_t p : s.problem_starts) start[static_cast<size_t>(p)] = 1;
  const double k = static_cast<double>(top_k);
  for (int64_t l = 0; l < L; ++l) {
    double reused = 0, pairs = 0;
    for (int64_t t = 0; t < T; ++t) {
      const TraceRow& r = s.at(l, t);
      for (int32_t e : r.experts) st.counts[static_cast<size_t>(l)][static_cast<size_t>(e)] += 1;
      if (!start[static_cast<size_t>(t)]) {
        reused += static_cast<double>(overlap(r.experts, s.at(l, t - 1).experts)) / k;
        pairs += 1;
      }
    }
    st.reuse[static_cast<size_t>(l)] = pairs > 0 ? reused / pairs : 0;
    // The sequel: the favourite other expert of the layer's next token after each expert.
    st.sequel[static_cast<size_t>(l)] = favourite_share(
        [&](const auto& fn) {
          for (int64_t t = 1; t < T; ++t)
            if (!start[static_cast<size_t>(t)]) fn(s.at(l, t - 1).experts, s.at(l, t).experts);
        },
        n_expert, top_k, /*others=*/true);
    // The transition: the favourite expert of layer l at the token of each of layer l - 1's.
    if (l > 0)
      st.transition[static_cast<size_t>(l)] = favourite_share(
          [&](const auto& fn) {
            for (int64_t t = 0; t < T; ++t) fn(s.at(l - 1, t).experts, s.at(l, t).experts);
          },
          n_expert, top_k, /*others=*/false);
    if (l + 1 < L) {
      double held = 0, rows = 0;
      for (int64_t t = 0; t < T; ++t) {
        const TraceRow& r = s.at(l, t);
        if (r.predicted_next.empty() || r.next_layer != s.layer_ids[static_cast<size_t>(l + 1)]) continue;
        held += static_cast<double>(overlap(s.at(l + 1, t).experts, r.predicted_next)) / k;
        rows += 1;
      }
      if (rows > 0) st.recall[static_cast<size_t>(l)] = held / rows;
    }
  }
  return st;
}

// The trace of a stream as one problem (what the fit compares: both as one long request).
Trace stream_as_trace(const TraceStream& s, int64_t n_expert, int64_t top_k) {
  Trace tr;
  for (int64_t t = 0; t < s.n_tokens; ++t)
    for (int64_t l = 0; l < s.n_layers; ++l) {
      TraceRow r = s.at(l, t);
      r.problem = 0;
      r.layer = l;
      r.token = t;
      r.predicted_next.clear();
      r.next_layer = -1;
      tr.rows.push_back(std::move(r));
    }
  tr.n_layer = s.n_layers;
  tr.n_expert = static_cast<int32_t>(n_expert);
  tr.top_k = static_cast<int32_t>(top_k);
  tr.n_problems = 1;
  return tr;
}

// The trace's popularity by rank at e experts: rank r of e takes the share the trace's ranks
// [r, r + 1) x n / e had (linearly within a rank), summing to 1.
std::vector<double> resampled_shares(const std::vector<double>& pop, int64_t e) {
  const int64_t n = static_cast<int64_t>(pop.size());
  std::vector<double> at(static_cast<size_t>(n + 1), 0.0);
  for (int64_t i = 0; i < n; ++i) at[static_cast<size_t>(i + 1)] = at[static_cast<size_t>(i)] + pop[static_cast<size_t>(i)];
  auto cum = [&](double f) {
    const auto i = static_cast<int64_t>(f);
    if (i >= n) return at[static_cast<size_t>(n)];
    return at[static_cast<size_t>(i)] + (f - static_cast<double>(i)) * pop[static_cast<size_t>(i)];
  };
  std::vector<double> out(static_cast<size_t>(e));
  double prev = 0;
  for (int64_t r = 0; r < e; ++r) {
    const double c = cum(static_cast<double>(r + 1) * static_cast<double>(n) / static_cast<double>(e));
    out[static_cast<size_t>(r)] = c - prev;
    prev = c;
  }
  const double total = prev > 0 ? prev : 1.0;
  for (double& x : out) x /= total;
  return out;
}

// The generator's draws for one shape.
class Generator {
 public:
  Generator(const RoutingFit& fit, int64_t n_expert, int64_t top_k, uint64_t seed)
      : fit_(fit), E_(n_expert), k_(top_k), rng_(seed) {
    const int64_t L = fit.n_layers;
    // The structure (each rank's expert, the favourite successors) is the same for every seed,
    // so the draws calibrated on one seed's tokens hold for another's; the seed draws the tokens.
    Rng setup(0x5EEDull);
    perm_.resize(static_cast<size_t>(L));
    for (int64_t l = 0; l < L; ++l) {
      // Expert of each popularity rank: a fixed shuffle per layer.
      std::vector<int32_t>& p = perm_[static_cast<size_t>(l)];
      p.resize(static_cast<size_t>(E_));
      std::iota(p.begin(), p.end(), 0);
      for (int64_t i = E_ - 1; i > 0; --i) std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(setup.below(i + 1))]);
    }
    // Favourite successor in layer l of each expert of layer l - 1: the expert of the same
    // popularity rank; favourite other expert of the layer's next token after each one: its
    // neighbour in rank (ranks 2i and 2i + 1). Both keep each rank's share: drawn at random,
    // they made a few experts far more popular than the popularity draw could correct.
    set_weights(target_shares());
    succ_.assign(static_cast<size_t>(L), std::vector<int32_t>(static_cast<size_t>(E_), 0));
    sequel_.assign(static_cast<size_t>(L), std::vector<int32_t>(static_cast<size_t>(E_), 0));
    for (int64_t l = 0; l < L; ++l)
      for (int64_t r = 0; r < E_; ++r) {
        if (l > 0) succ_[static_cast<size_t>(l)][static_cast<size_t>(perm_[static_cast<size_t>(l - 1)][static_cast<size_t>(r)])] =
            perm_[static_cast<size_t>(l)][static_cast<size_t>(r)];
        const int64_t partner = (r ^ 1) < E_ ? (r ^ 1) : (r + E_ - 1) % E_;
        sequel_[static_cast<size_t>(l)][static_cast<size_t>(perm_[static_cast<size_t>(l)][static_cast<size_t>(r)])] =
            perm_[static_cast<size_t>(l)][static_cast<size_t>(partner)];
      }
  }

  // The trace's popularity at this shape, [layer][rank].
  std::vector<std::vector<double>> target_shares() const {
    std::vector<std::vector<double>> t;
    for (const std::vector<double>& pop : fit_.popularity) t.push_back(resampled_shares(pop, E_));
    return t;
  }
  int32_t expert_of_rank(int64_t l, int64_t r) const { return perm_[static_cast<size_t>(l)][static_cast<size_t>(r)]; }

  Trace run(int64_t n_tokens, const RoutingDraws& d) {
    const int64_t L = fit_.n_layers;
    set_weights(d.weight);
    const double decay = std::exp2(-1.0 / d.history_half_life);
    std::vector<std::vector<double>> hist(static_cast<size_t>(L), std::vector<double>(static_cast<size_t>(E_), 0.0));
    std::vector<std::vector<int32_t>> prev(static_cast<size_t>(L)), cur(static_cast<size_t>(L));
    Trace tr;
    tr.rows.reserve(static_cast<size_t>(n_tokens * L));
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t l = 0; l < L; ++l) {
        std::vector<int32_t>& chosen = cur[static_cast<size_t>(l)];
        chosen.clear();
        const double pr = d.p_reuse[static_cast<size_t>(l)], pt = l > 0 ? d.p_transition[static_cast<size_t>(l)] : 0;
        const double ps = d.p_sequel[static_cast<size_t>(l)];
        for (int64_t j = 0; j < k_; ++j) {
          const double u = rng_.uniform();
          int32_t e = -1;
          if (u < pr) e = pick_from(prev[static_cast<size_t>(l)], chosen);
          else if (u < pr + pt) e = follower(succ_[static_cast<size_t>(l)], cur[static_cast<size_t>(l - 1)], chosen);
          else if (u < pr + pt + ps) e = follower(sequel_[static_cast<size_t>(l)], prev[static_cast<size_t>(l)], chosen);
          else if (u < pr + pt + ps + d.p_history) e = from_history(hist[static_cast<size_t>(l)], chosen);
          if (e < 0) e = popular_except(l, chosen);
          chosen.push_back(e);
        }
        std::vector<double>& h = hist[static_cast<size_t>(l)];
        for (double& x : h) x *= decay;
        for (int32_t e : chosen) h[static_cast<size_t>(e)] += 1;
        TraceRow r;
        r.layer = l;
        r.token = t;
        r.experts = chosen;
        r.weights = row_weights(l);
        tr.rows.push_back(std::move(r));
      }
      for (int64_t l = 0; l < L; ++l) prev[static_cast<size_t>(l)] = cur[static_cast<size_t>(l)];
    }
    predictions(tr, n_tokens);
    tr.n_layer = L;
    tr.n_expert = static_cast<int32_t>(E_);
    tr.top_k = static_cast<int32_t>(k_);
    tr.n_problems = 1;
    return tr;
  }

 private:
  // The popularity draw's cumulative weights by rank.
  void set_weights(const std::vector<std::vector<double>>& w) {
    cum_.assign(w.size(), {});
    for (size_t l = 0; l < w.size(); ++l) {
      std::vector<double>& c = cum_[l];
      c.resize(w[l].size());
      std::partial_sum(w[l].begin(), w[l].end(), c.begin());
      const double total = c.empty() || c.back() <= 0 ? 1.0 : c.back();
      for (double& x : c) x /= total;
    }
  }
  int32_t popular(int64_t l, Rng& rng) const {
    const std::vector<double>& c = cum_[static_cast<size_t>(l)];
    const auto r = std::upper_bound(c.begin(), c.end(), rng.uniform()) - c.begin();
    return perm_[static_cast<size_t>(l)][static_cast<size_t>(std::min<int64_t>(r, E_ - 1))];
  }
  int32_t popular_except(int64_t l, const std::vector<int32_t>& chosen) {
    for (int tries = 0; tries < 64; ++tries) {
      const int32_t e = popular(l, rng_);
      if (!contains(chosen, e)) return e;
    }
    for (int32_t e : perm_[static_cast<size_t>(l)])  // a layer dominated by a few experts: the most popular left
      if (!contains(chosen, e)) return e;
    fail(Status::internal, "routing generator: no expert left for a row of ", k_, " of ", E_);
  }
  int32_t pick_from(const std::vector<int32_t>& from, const std::vector<int32_t>& chosen) {
    int64_t left = 0;
    for (int32_t e : from) left += contains(chosen, e) ? 0 : 1;
    if (left == 0) return -1;
    int64_t i = rng_.below(left);
    for (int32_t e : from)
      if (!contains(chosen, e) && i-- == 0) return e;
    return -1;
  }
  // One of the favourites (`of`: expert -> its favourite) of `leaders` not chosen yet.
  int32_t follower(const std::vector<int32_t>& of, const std::vector<int32_t>& leaders, const std::vector<int32_t>& chosen) {
    std::vector<int32_t> f;
    for (int32_t a : leaders) f.push_back(of[static_cast<size_t>(a)]);
    return pick_from(f, chosen);
  }
  int32_t from_history(const std::vector<double>& h, const std::vector<int32_t>& chosen) {
    double total = 0;
    for (int64_t e = 0; e < E_; ++e)
      if (!contains(chosen, static_cast<int32_t>(e))) total += h[static_cast<size_t>(e)];
    if (total <= 0) return -1;
    double x = rng_.uniform() * total;
    int32_t last = -1;
    for (int64_t e = 0; e < E_; ++e) {
      if (contains(chosen, static_cast<int32_t>(e)) || h[static_cast<size_t>(e)] <= 0) continue;
      last = static_cast<int32_t>(e);
      x -= h[static_cast<size_t>(e)];
      if (x < 0) return last;
    }
    return last;
  }
  // A row's weights: those of a random row of the trace's layer (its row_weights), the first
  // k_ when the trace routes at least k_ (as the ids mapping cuts a row), else its k ranks
  // stretched over k_ (rank j at the trace's (j + 1/2) k / k_ - 1/2, linearly between ranks)
  // and scaled to the row's sum. Rows of one shape each (a mean profile) never showed the fast
  // profile's cut a weak expert to cut.
  std::vector<float> row_weights(int64_t layer) {
    const std::vector<float>& all = fit_.row_weights[static_cast<size_t>(layer)];
    const auto kt = static_cast<size_t>(fit_.top_k);
    std::vector<float> out(static_cast<size_t>(k_), 1.0f / static_cast<float>(k_));
    if (all.size() < kt || kt == 0) return out;
    const float* w = all.data() + static_cast<size_t>(rng_.below(static_cast<int64_t>(all.size() / kt))) * kt;
    if (static_cast<size_t>(k_) <= kt) return std::vector<float>(w, w + k_);
    float sum = 0, stretched = 0;
    for (size_t i = 0; i < kt; ++i) sum += w[i];
    for (int64_t j = 0; j < k_; ++j) {
      const double pos = std::clamp((static_cast<double>(j) + 0.5) * static_cast<double>(kt) / static_cast<double>(k_) - 0.5,
                                    0.0, static_cast<double>(kt - 1));
      const auto i = static_cast<size_t>(pos);
      const double f = pos - static_cast<double>(i);
      out[static_cast<size_t>(j)] = static_cast<float>(i + 1 < kt ? w[i] * (1 - f) + w[i + 1] * f : w[i]);
      stretched += out[static_cast<size_t>(j)];
    }
    for (float& x : out) x = stretched > 0 ? x * sum / stretched : x;
    return out;
  }
  // predicted_next of each row whose layer the trace predicted from: each of the next layer's
  // experts kept with the trace's recall, the others replaced by popular experts it does not use.
  void predictions(Trace& tr, int64_t n_tokens) {
    const int64_t L = fit_.n_layers;
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int64_t l = 0; l + 1 < L; ++l) {
        const double recall = fit_.recall[static_cast<size_t>(l)];
        if (recall < 0) continue;
        TraceRow& r = tr.rows[static_cast<size_t>(t * L + l)];
        const std::vector<int32_t>& next = tr.rows[static_cast<size_t>(t * L + l + 1)].experts;
        std::vector<int32_t> avoid = next;
        r.predicted_next.assign(next.size(), -1);
        for (size_t j = 0; j < next.size(); ++j)
          if (rng_.uniform() < recall) r.predicted_next[j] = next[j];
        for (int32_t& e : r.predicted_next)
          if (e < 0) {
            e = popular_except(l + 1, avoid);
            avoid.push_back(e);
          }
        r.next_layer = l + 1;
        tr.has_predictions = true;
      }
  }

  const RoutingFit& fit_;
  int64_t E_, k_;
  Rng rng_;
  std::vector<std::vector<int32_t>> perm_;   // [layer][rank] expert id
  std::vector<std::vector<double>> cum_;     // [layer][rank] the popularity draw's cumulative weights
  std::vector<std::vector<int32_t>> succ_;   // [layer][expert of layer - 1] favourite successor
  std::vector<std::vector<int32_t>> sequel_; // [layer][expert] favourite other expert of the next token
};

// Rounds of: generate n_tokens at (n_expert, top_k) from d, measure, move each layer's reuse and
// transition draw by their error against the trace's and the popularity draw's weight of each
// rank by the ratio of the trace's share to the measured one (at most 2x a round). The draws
// of the other components take popular experts more often than the popularity draw does, so
// the weights end flatter than the trace's shares.
RoutingDraws calibrate(const RoutingFit& fit, int64_t n_expert, int64_t top_k, RoutingDraws d, int64_t n_tokens,
                       int rounds) {
  // The statistics pull on each other (more reuse raises the transition and the top ranks'
  // share), so the probabilities move a part of the way each round: full steps oscillated.
  constexpr double kStep = 0.6;
  Generator g(fit, n_expert, top_k, 1);
  const std::vector<std::vector<double>> target = g.target_shares();
  for (int round = 0; round < rounds; ++round) {
    const Trace tr = Generator(fit, n_expert, top_k, 1).run(n_tokens, d);
    const StreamStats m = measure(trace_stream(tr), n_expert, top_k);
    // A probability's move in layer l: the error of the statistic's mean over the layers (from
    // layer `from`), shared out in proportion to the trace's layer's value. Per-layer errors,
    // noisy and coupled through the layers' draws, did not settle.
    auto step = [&](const std::vector<double>& want, const std::vector<double>& got, size_t l, size_t from) {
      double w = 0, g = 0;
      for (size_t i = from; i < want.size(); ++i) {
        w += want[i];
        g += got[i];
      }
      return w > 0 && l >= from ? kStep * (w - g) / w * want[l] : 0.0;
    };
    for (size_t l = 0; l < d.p_reuse.size(); ++l) {
      d.p_reuse[l] = std::clamp(d.p_reuse[l] + step(fit.reuse, m.reuse, l, 0), 0.0, 0.95);
      d.p_transition[l] = std::clamp(d.p_transition[l] + step(fit.transition, m.transition, l, 1), 0.0,
                                     std::max(0.0, 0.98 - d.p_reuse[l] - d.p_history));
      d.p_sequel[l] = std::clamp(d.p_sequel[l] + step(fit.sequel, m.sequel, l, 0), 0.0,
                                 std::max(0.0, 0.98 - d.p_reuse[l] - d.p_transition[l] - d.p_history));
      const double total = std::accumulate(m.counts[l].begin(), m.counts[l].end(), 0.0);
      for (int64_t r = 0; r < n_expert; ++r) {
        const double got = m.counts[l][static_cast<size_t>(g.expert_of_rank(static_cast<int64_t>(l), r))] / total;
        const double want = target[l][static_cast<size_t>(r)];
        d.weight[l][static_cast<size_t>(r)] *= std::clamp(got > 0 ? want / got : 2.0, 0.5, 2.0);
      }
    }
  }
  return d;
}

// The share of a layer's routing its top `fraction` of ranks take.
double top_share(const std::vector<double>& popularity, double fraction) {
  const auto n = static_cast<size_t>(std::llround(fraction * static_cast<double>(popularity.size())));
  return std::accumulate(popularity.begin(), popularity.begin() + static_cast<ptrdiff_t>(n), 0.0);
}

double squared_error(const std::vector<double>& a, const std::vector<double>& b);

// Mean squared differences over the layers of the reuse, the transition, the sequel and the top eighth's
// and quarter's shares between two fits' statistics.
double statistics_error(const RoutingFit& a, const RoutingFit& b) {
  double e = squared_error(a.reuse, b.reuse) + squared_error(a.transition, b.transition) +
             squared_error(a.sequel, b.sequel);
  for (size_t l = 0; l < a.popularity.size() && l < b.popularity.size(); ++l)
    for (double f : {0.125, 0.25}) {
      const double d = top_share(a.popularity[l], f) - top_share(b.popularity[l], f);
      e += d * d;
    }
  return e / static_cast<double>(std::max<size_t>(1, a.popularity.size()));
}

double squared_error(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return s;
}

std::string fixed3(const std::vector<double>& v) {
  std::string s;
  char b[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(b, sizeof b, "%s%.3f", i ? "/" : "", v[i]);
    s += b;
  }
  return s;
}

double mean(const std::vector<double>& v, bool skip_first = false) {
  double s = 0, n = 0;
  for (size_t i = skip_first ? 1 : 0; i < v.size(); ++i)
    if (v[i] >= 0) {
      s += v[i];
      n += 1;
    }
  return n > 0 ? s / n : 0;
}

}  // namespace

TraceStream trace_stream(const Trace& trace) {
  std::map<int64_t, int64_t> problem_rank, layer_index;
  for (const TraceRow& r : trace.rows) {
    problem_rank.emplace(r.problem, static_cast<int64_t>(problem_rank.size()));
    layer_index.emplace(r.layer, 0);
  }
  TraceStream s;
  for (auto& [layer, index] : layer_index) {
    index = s.n_layers++;
    s.layer_ids.push_back(layer);
  }
  // [problem][layer] rows in file order, then in token order.
  const auto P = static_cast<size_t>(problem_rank.size()), L = static_cast<size_t>(s.n_layers);
  std::vector<std::vector<std::vector<const TraceRow*>>> by(P, std::vector<std::vector<const TraceRow*>>(L));
  for (const TraceRow& r : trace.rows)
    by[static_cast<size_t>(problem_rank[r.problem])][static_cast<size_t>(layer_index[r.layer])].push_back(&r);
  std::vector<int64_t> lengths(P, 0);
  for (size_t p = 0; p < P; ++p) {
    size_t n = SIZE_MAX;
    for (auto& rows : by[p]) {
      std::stable_sort(rows.begin(), rows.end(), [](const TraceRow* a, const TraceRow* b) { return a->token < b->token; });
      n = std::min(n, rows.size());
    }
    lengths[p] = static_cast<int64_t>(n);
    s.n_tokens += lengths[p];
  }
  SLUICE_CHECK(s.n_tokens > 0, Status::corrupt, "routing trace: no token has a row in every one of its ", s.n_layers,
               " layers");
  s.rows.resize(L * static_cast<size_t>(s.n_tokens));
  int64_t t0 = 0;
  for (size_t p = 0; p < P; ++p) {
    if (lengths[p] == 0) continue;
    s.problem_starts.push_back(t0);
    for (size_t l = 0; l < L; ++l)
      for (int64_t j = 0; j < lengths[p]; ++j)
        s.rows[l * static_cast<size_t>(s.n_tokens) + static_cast<size_t>(t0 + j)] = by[p][l][static_cast<size_t>(j)];
    t0 += lengths[p];
  }
  return s;
}

std::vector<double> cache_hit_rates(const Trace& trace, int64_t n_expert, int64_t top_k) {
  std::vector<double> out;
  SimulateOptions o;
  o.pin = PinScope::step;
  o.predictions = PredictionTime::never;
  o.policy = PolicyKind::lru;
  for (double f : kFitLruFractions) {
    o.slots_per_layer = static_cast<int32_t>(std::max<int64_t>(top_k, std::llround(f * static_cast<double>(n_expert))));
    out.push_back(simulate_trace(trace, o).hit_rate());
  }
  o.slots_per_layer = 0;
  o.policy = PolicyKind::markov;
  for (double f : kFitPoolFractions) {
    o.slots = static_cast<int32_t>(std::max<int64_t>(top_k, std::llround(f * static_cast<double>(n_expert * trace.n_layer))));
    out.push_back(simulate_trace(trace, o).hit_rate());
  }
  return out;
}

RoutingFit routing_statistics(const Trace& trace) {
  const TraceStream s = trace_stream(trace);
  RoutingFit fit;
  fit.n_layers = s.n_layers;
  fit.n_expert = trace.n_expert;
  fit.top_k = trace.top_k;
  fit.n_tokens = s.n_tokens;
  const StreamStats st = measure(s, fit.n_expert, fit.top_k);
  for (const std::vector<double>& c : st.counts) {
    std::vector<double> p = c;
    std::sort(p.begin(), p.end(), std::greater<>());
    const double total = std::accumulate(p.begin(), p.end(), 0.0);
    for (double& x : p) x = total > 0 ? x / total : 0;
    fit.popularity.push_back(std::move(p));
  }
  fit.reuse = st.reuse;
  fit.transition = st.transition;
  fit.sequel = st.sequel;
  fit.recall = st.recall;
  // Each layer's rows' weights (rows with fewer than top_k, or none, left out).
  fit.row_weights.assign(static_cast<size_t>(fit.n_layers), {});
  for (int64_t l = 0; l < fit.n_layers; ++l)
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      const TraceRow& r = s.at(l, t);
      if (static_cast<int64_t>(r.weights.size()) >= fit.top_k)
        fit.row_weights[static_cast<size_t>(l)].insert(fit.row_weights[static_cast<size_t>(l)].end(), r.weights.begin(),
                                                       r.weights.begin() + fit.top_k);
    }
  fit.hit_rate = cache_hit_rates(stream_as_trace(s, fit.n_expert, fit.top_k), fit.n_expert, fit.top_k);
  return fit;
}

RoutingFit fit_routing(const Trace& trace) {
  RoutingFit fit = routing_statistics(trace);

  // The grid of history components; for each, the draws calibrated at the trace's own shape.
  constexpr double kHistory[] = {0.0, 0.15, 0.3};
  constexpr double kHalfLife[] = {4, 16, 64};
  const int64_t n_fit = std::min<int64_t>(fit.n_tokens, 2048);  // tokens generated per round
  double best = INFINITY;
  for (double ph : kHistory)
    for (double hl : kHalfLife) {
      if (ph == 0 && hl != kHalfLife[0]) continue;  // no history: the half-life does not matter
      RoutingDraws d;  // a start below the trace's: the other draws add reuse and transition of their own
      for (double x : fit.reuse) d.p_reuse.push_back(0.6 * x);
      for (double x : fit.transition) d.p_transition.push_back(0.6 * x);
      for (double x : fit.sequel) d.p_sequel.push_back(0.3 * x);
      d.p_history = ph;
      d.history_half_life = hl;
      d.weight = Generator(fit, fit.n_expert, fit.top_k, 1).target_shares();
      d = calibrate(fit, fit.n_expert, fit.top_k, d, n_fit, 4);
      const Trace g = Generator(fit, fit.n_expert, fit.top_k, 1).run(n_fit, d);
      const std::vector<double> hits = cache_hit_rates(g, fit.n_expert, fit.top_k);
      // The hit rates the grid is for, and what the calibration may not have reached: the
      // reuse, the transition and the top eighth's and quarter's share of each layer.
      const RoutingFit got = routing_statistics(g);
      const double err = squared_error(hits, fit.hit_rate) + statistics_error(got, fit);
      if (err < best) {
        best = err;
        fit.draws = d;
        fit.fitted_hit_rate = hits;
      }
    }
  fit.draws = calibrate(fit, fit.n_expert, fit.top_k, fit.draws, n_fit, 2);  // the chosen one, two rounds more
  return fit;
}

Trace generate_routing(const RoutingFit& fit, int64_t n_expert, int64_t top_k, int64_t n_tokens, uint64_t seed) {
  SLUICE_CHECK(n_expert >= 1 && top_k >= 1 && top_k <= n_expert && n_tokens >= 1, Status::invalid_argument,
               "routing generator: top-", top_k, " of ", n_expert, " experts over ", n_tokens, " tokens");
  RoutingDraws d = fit.draws;
  if (n_expert != fit.n_expert || top_k != fit.top_k) {  // the trace's reuse, transition and popularity at this shape
    d.weight = Generator(fit, n_expert, top_k, 1).target_shares();
    d = calibrate(fit, n_expert, top_k, d, std::min<int64_t>(fit.n_tokens, 2048), 6);
  }
  return Generator(fit, n_expert, top_k, seed).run(n_tokens, d);
}

std::string RoutingFit::describe() const {
  char b[512];
  std::snprintf(b, sizeof b,
                "reuse %.3f (drawn %.3f), transition %.3f (drawn %.3f), sequel %.3f (drawn %.3f), history %.2f "
                "halving every %g tokens, "
                "lookahead recall %s; hit rates (LRU a layer at 1/8, 1/4, 1/2 of the experts; markov in a pool at 1/4, "
                "1/2): trace %s, fit %s",
                mean(reuse), mean(draws.p_reuse), mean(transition, true), mean(draws.p_transition, true), mean(sequel),
                mean(draws.p_sequel), draws.p_history,
                draws.history_half_life, mean(recall) > 0 ? fixed3({mean(recall)}).c_str() : "none",
                fixed3(hit_rate).c_str(), fixed3(fitted_hit_rate).c_str());
  return b;
}

}  // namespace sluice
