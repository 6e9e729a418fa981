// PromptCache (prompt_cache.h): finding a prompt's longest held prefix, copies into sequences
// and entries, snapshots, the budget and its evictions.
#include "engine/prompt_cache.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "core/log.h"

namespace sluice {

namespace {

// Tokens a and b share from the start.
int64_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<int64_t>(ia - a.begin());
}

// Entries allocate their rows in steps of this many tokens, so that the device allocator's
// blocks (whole MiB above 1 MiB, cuda_memory.h) come back in few sizes as entries come and go.
constexpr int64_t kEntryRowStep = 256;

// A copy of backend tensor t in host memory (flat); empty for an empty t.
Tensor host_copy(Backend& be, const Tensor& t) {
  if (t.empty()) return {};
  std::shared_ptr<void> mem(std::malloc(std::max<size_t>(t.nbytes(), 1)), std::free);
  SLUICE_CHECK(mem != nullptr, Status::out_of_memory, "prompt cache: no host memory for ", t.nbytes(), " bytes");
  Tensor h(t.dtype, {t.numel()}, mem.get(), mem);
  be.to_host(t, h.data);
  return h;
}

// A backend tensor with host tensor h's values (flat); empty for an empty h.
Tensor device_copy(Backend& be, const Tensor& h) {
  if (h.empty()) return {};
  Tensor t = be.alloc(h.dtype, {h.numel()});
  be.from_host(t, h.data);
  return t;
}

}  // namespace

PromptCache::PromptCache(Model& model, int n_sequences, int64_t n_ctx, const PromptCacheOptions& options)
    : model_(model), opt_(options) {
  SLUICE_CHECK(opt_.grid >= 1 && opt_.snapshots_per_sequence >= 1, Status::invalid_argument,
               "prompt cache: grid ", opt_.grid, " and snapshots per sequence ", opt_.snapshots_per_sequence,
               " must be positive");
  enabled_ = opt_.budget_bytes > 0 && model_.prefix_copyable();
  if (opt_.budget_bytes > 0 && !enabled_)
    LOG_WARN("prompt cache: ", model_.info().family, " states cannot be copied; every prompt is prefilled whole");
  snapshot_bytes_ = enabled_ ? model_.snapshot_bytes() : 0;
  if (enabled_ && opt_.host_budget_bytes > 0) {
    be_ = model_.state_backend();
    if (!be_) LOG_WARN("prompt cache: ", model_.info().family, " states cannot be copied to host memory; no host tier");
  }
  counters_.host_budget_bytes = be_ ? opt_.host_budget_bytes : 0;
  seq_.resize(static_cast<size_t>(n_sequences));
  for (Sequence& s : seq_) s.held.state = model_.new_state(n_ctx);
  counters_.budget_bytes = enabled_ ? opt_.budget_bytes : 0;
}

PromptCache::~PromptCache() = default;

int PromptCache::free_count() const {
  return static_cast<int>(std::count_if(seq_.begin(), seq_.end(), [](const Sequence& s) { return !s.in_use; }));
}

int64_t PromptCache::entry_rows(int64_t n) { return (n + kEntryRowStep - 1) / kEntryRowStep * kEntryRowStep; }

PromptCache::Resume PromptCache::resume_in(const Held& h, std::span<const int32_t> prompt, int64_t limit) const {
  const int64_t m = std::min(common_prefix(h.tokens, prompt), limit);
  if (m <= 0) return {};
  if (!recurrent()) return Resume{&h, m, nullptr};
  // The latest snapshot at or before m.
  for (auto it = h.snapshots.rbegin(); it != h.snapshots.rend(); ++it)
    if ((*it)->n_past <= m) return Resume{&h, (*it)->n_past, *it};
  return {};
}

PromptCache::Resume PromptCache::find(std::span<const int32_t> prompt, int64_t limit) const {
  Resume best;
  bool best_free = false;
  auto consider = [&](const Held& h, bool free) {
    Resume r = resume_in(h, prompt, limit);
    if (r.n > best.n || (r.n == best.n && r.n > 0 && free && !best_free)) {
      best = std::move(r);
      best_free = free;
    }
  };
  for (const Sequence& s : seq_) consider(s.held, !s.in_use);
  for (const auto& e : entries_) consider(*e, false);
  for (const auto& e : host_entries_) consider(*e, false);
  return best;
}

int PromptCache::acquire(std::span<const int32_t> prompt) {
  SLUICE_CHECK(!prompt.empty(), Status::internal, "prompt cache: an empty prompt");
  std::vector<size_t> free;
  for (size_t i = 0; i < seq_.size(); ++i)
    if (!seq_[i].in_use) free.push_back(i);
  SLUICE_CHECK(!free.empty(), Status::internal, "prompt cache: no free sequence");
  if (!enabled_) {
    Sequence& s = seq_[free.back()];
    s.in_use = true;
    s.held.state->reset();
    return static_cast<int>(free.back());
  }
  const int64_t limit = static_cast<int64_t>(prompt.size()) - 1;
  std::unique_ptr<Held> transient;  // a prefix from the host tier too large to stay on the device
  const Resume best = from_device(find(prompt, limit), transient);
  ++counters_.requests;
  // A free sequence that holds the prefix is cut back to it where it loses little beyond it
  // (a chat's next turn): no copy. Otherwise the prefix goes into the free sequence that is
  // empty or least recently used, after what that one holds went into an entry.
  size_t pick = free.front();
  const auto held_by = [&](size_t i) { return best.from == &seq_[i].held; };
  const auto it = std::find_if(free.begin(), free.end(), held_by);
  const bool in_place = it != free.end() &&
                        static_cast<int64_t>(seq_[*it].held.tokens.size()) - best.n <= std::max(best.n, opt_.grid);
  if (in_place) {
    pick = *it;
  } else {
    for (size_t i : free) {
      const Held& a = seq_[i].held;
      const Held& b = seq_[pick].held;
      // Empty first, then least recently used; the source last.
      const auto rank = [&](size_t k, const Held& h) { return std::tuple(held_by(k), !h.tokens.empty(), h.last_use); };
      if (rank(i, a) < rank(pick, b)) pick = i;
    }
  }
  Sequence& s = seq_[pick];
  s.in_use = true;
  s.held.last_use = ++clock_;
  try {
    if (!in_place && !s.held.tokens.empty()) keep(s.held, best.from);
    resume(best, s.held);
  } catch (...) {
    forget(s.held);
    s.in_use = false;
    throw;
  }
  if (best.n > 0) {
    ++counters_.hits;
    counters_.cached_tokens += static_cast<uint64_t>(best.n);
  }
  return static_cast<int>(pick);
}

void PromptCache::release(int i, bool valid) {
  Sequence& s = seq_[static_cast<size_t>(i)];
  s.in_use = false;
  s.held.last_use = ++clock_;
  if (!valid || !enabled_) forget(s.held);
}

void PromptCache::forget(Held& h) {
  h.state->reset();
  h.tokens.clear();
  h.snapshots.clear();
  h.exact = 0;
}

void PromptCache::resume(const Resume& r, Held& dst) {
  if (!r.from || r.n == 0) {
    forget(dst);
    return;
  }
  const Held& src = *r.from;
  const int64_t n = r.n;
  if (&src == &dst) {  // cut back: the rows stay, the recurrent part comes from the snapshot
    model_.copy_prefix(*dst.state, *dst.state, n, n, r.at.get());
    dst.tokens.resize(static_cast<size_t>(n));
    dst.exact = std::min(dst.exact, n);
    std::erase_if(dst.snapshots, [&](const auto& s) { return s->n_past > n; });
    return;
  }
  // dst's own rows where they hold the same tokens exactly; the rest from src.
  const int64_t from =
      std::min({common_prefix(dst.tokens, std::span(src.tokens).first(static_cast<size_t>(n))), dst.exact, n});
  std::erase_if(dst.snapshots, [&](const auto& s) { return s->n_past > from; });
  model_.copy_prefix(*src.state, *dst.state, from, n, r.at.get());
  dst.tokens.assign(src.tokens.begin(), src.tokens.begin() + n);
  dst.exact = n;
  for (const auto& snap : src.snapshots)
    if (snap->n_past > from && snap->n_past <= n) dst.snapshots.push_back(snap);
  thin(dst);
  src.last_use = ++clock_;  // an entry used moves to the back of the LRU
}

int64_t PromptCache::useful(const Held& h) const {
  if (!recurrent()) return static_cast<int64_t>(h.tokens.size());
  return h.snapshots.empty() ? 0 : h.snapshots.back()->n_past;
}

void PromptCache::keep(const Held& h, const Held* protect) {
  const int64_t n = useful(h);
  if (n == 0) return;
  const std::span<const int32_t> tokens = std::span(h.tokens).first(static_cast<size_t>(n));
  for (const auto& e : entries_) {
    if (resume_in(*e, tokens, n).n == n) {  // an entry holds it already
      e->last_use = ++clock_;
      return;
    }
  }
  const uint64_t bytes = model_.prefix_bytes(entry_rows(n));
  if (bytes > opt_.budget_bytes) return;
  auto entry = std::make_unique<Held>();
  entry->tokens.assign(tokens.begin(), tokens.end());
  entry->exact = n;
  for (const auto& snap : h.snapshots)
    if (snap->n_past <= n) entry->snapshots.push_back(snap);
  // Entries this one extends go; their snapshots stay with it.
  for (size_t i = entries_.size(); i-- > 0;) {
    Held& e = *entries_[i];
    const int64_t en = useful(e);
    if (&e == protect || en > n || common_prefix(e.tokens, tokens) < en) continue;
    for (const auto& snap : e.snapshots)
      if (snap->n_past <= en) entry->snapshots.push_back(snap);
    drop_entry(i);
  }
  std::sort(entry->snapshots.begin(), entry->snapshots.end(),
            [](const auto& a, const auto& b) { return a->n_past < b->n_past; });
  entry->snapshots.erase(std::unique(entry->snapshots.begin(), entry->snapshots.end(),
                                     [](const auto& a, const auto& b) { return a->n_past == b->n_past; }),
                         entry->snapshots.end());
  // No room on the backend (the entries left are protected): with a host tier, the entry
  // passes through the backend into it.
  const bool room = make_room(bytes, protect);
  if (!room && !be_) return;
  try {
    entry->state = model_.new_prefix_state(entry_rows(n));
    model_.copy_prefix(*h.state, *entry->state, 0, n, recurrent() ? entry->snapshots.back().get() : nullptr);
  } catch (const Error& e) {
    if (e.status() != Status::out_of_memory) throw;
    LOG_WARN("prompt cache: no memory for a prefix of ", n, " tokens (", e.what(), "); not kept");
    return;
  }
  entry->last_use = ++clock_;
  if (!room) {
    demote(*entry);
    return;
  }
  entry_bytes_ += bytes;
  entries_.push_back(std::move(entry));
}

bool PromptCache::make_room(uint64_t bytes, const Held* protect) {
  while (total_bytes() + bytes > opt_.budget_bytes) {
    size_t victim = entries_.size();
    for (size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].get() != protect && (victim == entries_.size() || entries_[i]->last_use < entries_[victim]->last_use))
        victim = i;
    if (victim < entries_.size()) {
      demote(*entries_[victim]);
      drop_entry(victim);
      ++counters_.evictions;
      continue;
    }
    // No entry left: the snapshots of free sequences, the least recently used one's first,
    // its earliest first (a running prompt's, and a source's, stay).
    Sequence* free = nullptr;
    for (Sequence& q : seq_)
      if (!q.in_use && &q.held != protect && !q.held.snapshots.empty() &&
          (!free || q.held.last_use < free->held.last_use))
        free = &q;
    if (!free) return false;
    free->held.snapshots.erase(free->held.snapshots.begin());
  }
  return true;
}

void PromptCache::drop_entry(size_t i) {
  entry_bytes_ -= model_.prefix_bytes(entries_[i]->state->n_ctx);
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
}

void PromptCache::demote(const Held& e) {
  if (!be_) return;
  const int64_t n = useful(e);
  const std::span<const int32_t> tokens = std::span(e.tokens).first(static_cast<size_t>(n));
  for (const auto& h : host_entries_) {
    if (resume_in(*h, tokens, n).n == n) {  // the host tier holds it already
      h->last_use = std::max(h->last_use, e.last_use);
      return;
    }
  }
  const std::vector<Tensor> rows = model_.prefix_tensors(*e.state);
  uint64_t bytes = 0;
  for (const Tensor& t : rows) bytes += t.nbytes();
  for (const auto& snap : e.snapshots)
    for (const Tensor& t : snap->tensors()) bytes += t.empty() ? 0 : t.nbytes();
  if (rows.empty() || bytes > opt_.host_budget_bytes) return;
  // Host entries this one extends go.
  std::erase_if(host_entries_, [&](const std::unique_ptr<Held>& h) {
    const int64_t hn = useful(*h);
    if (hn > n || common_prefix(h->tokens, tokens) < hn) return false;
    host_bytes_ -= h->host_bytes;
    return true;
  });
  if (!make_host_room(bytes)) return;
  auto h = std::make_unique<Held>();
  try {
    for (const Tensor& t : rows) h->host_rows.push_back(host_copy(*be_, t));
    for (const auto& snap : e.snapshots) {
      std::vector<Tensor> host;
      for (const Tensor& t : snap->tensors()) host.push_back(host_copy(*be_, t));
      h->snapshots.push_back(snap->with_tensors(std::move(host)));
    }
  } catch (const Error& err) {
    if (err.status() != Status::out_of_memory) throw;
    LOG_WARN("prompt cache: ", err.what(), "; a prefix of ", n, " tokens not moved to host memory");
    return;
  }
  h->tokens.assign(tokens.begin(), tokens.end());
  h->exact = n;
  h->host_n_ctx = e.state->n_ctx;
  h->host_bytes = bytes;
  h->last_use = e.last_use;
  host_bytes_ += bytes;
  host_entries_.push_back(std::move(h));
}

bool PromptCache::make_host_room(uint64_t bytes) {
  while (host_bytes_ + bytes > opt_.host_budget_bytes && !host_entries_.empty()) {
    auto victim = std::min_element(host_entries_.begin(), host_entries_.end(),
                                   [](const auto& a, const auto& b) { return a->last_use < b->last_use; });
    host_bytes_ -= (*victim)->host_bytes;
    host_entries_.erase(victim);
  }
  return host_bytes_ + bytes <= opt_.host_budget_bytes;
}

std::unique_ptr<PromptCache::Held> PromptCache::promote(const Held& h) {
  auto d = std::make_unique<Held>();
  d->state = model_.new_prefix_state(h.host_n_ctx);
  const std::vector<Tensor> rows = model_.prefix_tensors(*d->state);
  SLUICE_CHECK(rows.size() == h.host_rows.size(), Status::internal, "prompt cache: ", h.host_rows.size(),
               " host tensors for a prefix state of ", rows.size());
  for (size_t i = 0; i < rows.size(); ++i) be_->from_host(rows[i], h.host_rows[i].data);
  d->state->n_past = static_cast<int64_t>(h.tokens.size());
  d->tokens = h.tokens;
  d->exact = h.exact;
  for (const auto& snap : h.snapshots) {
    std::vector<Tensor> dev;
    for (const Tensor& t : snap->tensors()) dev.push_back(device_copy(*be_, t));
    d->snapshots.push_back(counted(snap->with_tensors(std::move(dev))));
  }
  d->last_use = ++clock_;
  return d;
}

PromptCache::Resume PromptCache::from_device(const Resume& r, std::unique_ptr<Held>& transient) {
  if (!r.from || r.from->state) return r;
  const auto it = std::find_if(host_entries_.begin(), host_entries_.end(),
                               [&](const auto& h) { return h.get() == r.from; });
  SLUICE_CHECK(it != host_entries_.end(), Status::internal, "prompt cache: a host entry that is not held");
  std::unique_ptr<Held> d;
  try {
    d = promote(**it);
  } catch (const Error& e) {
    if (e.status() != Status::out_of_memory) throw;
    LOG_WARN("prompt cache: no device memory to bring back a prefix of ", r.n, " tokens (", e.what(), ")");
    return {};
  }
  host_bytes_ -= (*it)->host_bytes;
  host_entries_.erase(it);  // it moves to the device; before make_room, which may move others here
  ++counters_.host_hits;
  Held* dp = d.get();
  const uint64_t rows = model_.prefix_bytes(dp->state->n_ctx);
  entry_bytes_ += rows;
  entries_.push_back(std::move(d));
  if (!make_room(0, dp)) {  // larger than the budget alone: used this once
    const auto at = std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.get() == dp; });
    transient = std::move(*at);
    entries_.erase(at);
    entry_bytes_ -= rows;
  }
  Resume out{dp, r.n, nullptr};
  for (const auto& snap : dp->snapshots)
    if (snap->n_past == r.n) out.at = snap;
  return out;
}

void PromptCache::ran_prompt(int i, std::span<const int32_t> tokens) {
  if (!enabled_) return;
  Held& h = seq_[static_cast<size_t>(i)].held;
  const bool was_exact = h.exact == static_cast<int64_t>(h.tokens.size());
  h.tokens.insert(h.tokens.end(), tokens.begin(), tokens.end());
  const int64_t n = static_cast<int64_t>(h.tokens.size());
  // A hybrid's rows are exact up to a grid position reached from an exact start.
  if (!recurrent() || (was_exact && n % opt_.grid == 0)) h.exact = n;
  take_snapshot(h);
}

void PromptCache::ran_decode(int i, int32_t token) {
  if (!enabled_) return;
  Held& h = seq_[static_cast<size_t>(i)].held;
  h.tokens.push_back(token);
  if (!recurrent()) h.exact = static_cast<int64_t>(h.tokens.size());
}

void PromptCache::take_snapshot(Held& h) {
  const int64_t n = h.state->n_past;
  if (!recurrent() || n == 0 || n % opt_.grid != 0 || h.exact != n) return;
  if (!h.snapshots.empty() && h.snapshots.back()->n_past >= n) return;
  if (!make_room(snapshot_bytes_, nullptr)) return;
  h.snapshots.push_back(counted(model_.snapshot(*h.state)));
  thin(h);
}

std::shared_ptr<const StateSnapshot> PromptCache::counted(std::unique_ptr<StateSnapshot> snap) {
  // The count of live snapshot bytes follows each snapshot's life, wherever it is shared.
  const uint64_t bytes = snapshot_bytes_;
  *snapshot_held_ += bytes;
  ++*snapshot_count_;
  std::shared_ptr<uint64_t> held = snapshot_held_, count = snapshot_count_;
  return std::shared_ptr<const StateSnapshot>(snap.release(), [held, count, bytes](const StateSnapshot* s) {
    *held -= bytes;
    --*count;
    delete s;
  });
}

void PromptCache::thin(Held& h) const {
  auto& s = h.snapshots;
  while (s.size() > static_cast<size_t>(opt_.snapshots_per_sequence)) {
    // Drop the one (never the newest) whose neighbours are closest: the rest stay spread out.
    size_t drop = 0;
    int64_t best_gap = INT64_MAX;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const int64_t gap = s[i + 1]->n_past - (i > 0 ? s[i - 1]->n_past : 0);
      if (gap < best_gap) {
        best_gap = gap;
        drop = i;
      }
    }
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(drop));
  }
}

int64_t PromptCache::reachable_from(int i, std::span<const int32_t> prompt, int j, int64_t shared) const {
  const Held& src = seq_[static_cast<size_t>(j)].held;
  const int64_t bound = std::min({shared, static_cast<int64_t>(prompt.size()) - 1,
                                  static_cast<int64_t>(src.tokens.size())});
  int64_t n = 0;
  if (!recurrent()) n = bound;
  else
    for (const auto& snap : src.snapshots)
      if (snap->n_past <= bound) n = snap->n_past;
  return n > seq_[static_cast<size_t>(i)].held.state->n_past ? n : 0;
}

int64_t PromptCache::resume_point_within(std::span<const int32_t> prompt, int64_t shared) const {
  const int64_t bound = std::min(shared, static_cast<int64_t>(prompt.size()) - 1);
  return recurrent() ? bound / opt_.grid * opt_.grid : bound;
}

int64_t PromptCache::catch_up(int i, std::span<const int32_t> prompt, int j) {
  Held& dst = seq_[static_cast<size_t>(i)].held;
  const int64_t before = dst.state->n_past;
  const Resume r = resume_in(seq_[static_cast<size_t>(j)].held, prompt, static_cast<int64_t>(prompt.size()) - 1);
  if (r.n <= before) return before;
  resume(r, dst);
  counters_.cached_tokens += static_cast<uint64_t>(r.n - before);
  return r.n;
}

PromptCacheCounters PromptCache::counters() const {
  PromptCacheCounters c = counters_;
  c.bytes = total_bytes();
  c.entries = entries_.size();
  c.snapshots = *snapshot_count_;
  c.host_bytes = host_bytes_;
  c.host_entries = host_entries_.size();
  return c;
}

}  // namespace sluice
