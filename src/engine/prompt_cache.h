// PromptCache: the sequences of a BatchEngine and the prompt cache. A request whose prompt
// begins with tokens some state already holds starts after them instead of prefilling them
// again. Where a prefix can come from:
//   - the engine's sequences: a running one, or a free one, which keeps what its last request
//     left (prompt and generated tokens) at no cost beyond the states allocated at start. A
//     prompt takes the free sequence that holds most of it as it is (nothing copied), or a
//     free sequence into which the prefix is copied from wherever it is held;
//   - entries: detached copies of prefixes (Model::new_prefix_state), least recently used
//     first out, within budget_bytes. A free sequence's content becomes an entry when the
//     sequence is given to a prompt that does not continue it; an entry that a new one extends
//     is dropped;
//   - the host tier (host_budget_bytes; 0: none): entries evicted for room are copied into
//     host memory, least recently used first out again; a prompt that resumes from one moves
//     it back (copied to the device, where it counts in budget_bytes again).
// budget_bytes counts the entries' rows and every snapshot on the backend (below); 0 turns the
// cache off (every prompt prefilled from its first token, as without it).
//
// A KV cache resumes at any position it holds. The hybrid families' recurrent state resumes
// only where a snapshot was taken (Model::snapshot): at every multiple of `grid` tokens (the
// prefill chunk) that a prompt's prefill reaches, at most snapshots_per_sequence a sequence;
// a running prompt's snapshots may push out those of free sequences when the budget is full.
// Resuming is exact, not only close: the chunks after a snapshot at a multiple of the prefill
// chunk are the chunks a prefill from the first token runs, and a KV row does not depend on
// how its prompt was cut into chunks (on the CPU, bit for bit). A hybrid's chunked delta rule
// depends on where its chunks start, and a decode step (the recurrent form) rounds otherwise
// than a prefill of the same token, so a hybrid's rows past the last grid position of a
// prefill are never a source.
//
// Everything here runs on the engine thread (counters() is a copy for the engine to publish).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "models/model.h"

namespace sluice {

struct PromptCacheOptions {
  uint64_t budget_bytes = 0;       // entries and snapshots; 0: no prompt cache
  uint64_t host_budget_bytes = 0;  // the host tier's entries; 0: none
  int64_t grid = 512;              // snapshot positions are its multiples (the prefill chunk)
  int snapshots_per_sequence = 8;  // at most, per sequence (spread out when thinned)
};

struct PromptCacheCounters {
  uint64_t budget_bytes = 0;
  uint64_t bytes = 0;            // held now: the entries' rows and every snapshot
  uint64_t entries = 0;          // detached prefixes now
  uint64_t snapshots = 0;        // snapshots now (sequences' and entries')
  uint64_t evictions = 0;        // entries evicted for room (to the host tier, or dropped)
  uint64_t host_budget_bytes = 0;
  uint64_t host_bytes = 0;       // the host tier now: its entries' rows and snapshots
  uint64_t host_entries = 0;
  uint64_t host_hits = 0;        // prompts resumed from the host tier
  uint64_t requests = 0;         // prompts looked up
  uint64_t hits = 0;             // of them, resumed after at least one token
  uint64_t cached_tokens = 0;    // prompt tokens not prefilled (resumed)
};

class PromptCache {
 public:
  // n_sequences states of n_ctx tokens (Model::new_state), all free.
  PromptCache(Model& model, int n_sequences, int64_t n_ctx, const PromptCacheOptions& options);
  ~PromptCache();
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;

  // The options asked for a cache and the model's states can be copied.
  bool enabled() const { return enabled_; }
  int free_count() const;

  // A free sequence for `prompt` (one must be free), at the longest prefix of it (at most
  // prompt.size() - 1 tokens: the last one is always run, for its logits) that any held state
  // can resume; its state's n_past says where. Copies may throw (a device error): the
  // sequence is then free again and empty.
  int acquire(std::span<const int32_t> prompt);
  // The request on sequence i ended: it is free and keeps what it holds for later prompts;
  // valid false (a model call failed on it): what it holds is forgotten.
  void release(int i, bool valid);
  SequenceState& state(int i) { return *seq_[static_cast<size_t>(i)].held.state; }

  // The model ran a prompt chunk (prefill) or a decode step's token on sequence i.
  void ran_prompt(int i, std::span<const int32_t> tokens);
  void ran_decode(int i, int32_t token);
  // Sequence i prefills `prompt` (its n_past tokens done): how far sequence j (running, its
  // prompt sharing `shared` tokens with this one) lets it jump now, without copying anything.
  int64_t reachable_from(int i, std::span<const int32_t> prompt, int j, int64_t shared) const;
  // Where sequence i would resume from sequence j once j's prefill reached `shared` tokens
  // of this prompt: the point a sequence that shares them may wait for (0: none).
  int64_t resume_point_within(std::span<const int32_t> prompt, int64_t shared) const;
  // Moves sequence i, prefilling `prompt`, to the longest prefix sequence j holds (beyond
  // its n_past); returns its n_past after.
  int64_t catch_up(int i, std::span<const int32_t> prompt, int j);

  PromptCacheCounters counters() const;

 private:
  // A state with the tokens it holds: the engine's sequences and the entries alike. An entry
  // of the host tier has no state: its prefix state's tensors (Model::prefix_tensors) and its
  // snapshots' are host copies.
  struct Held {
    std::unique_ptr<SequenceState> state;
    std::vector<Tensor> host_rows;  // host tier: the prefix state's tensors
    int64_t host_n_ctx = 0;         // host tier: the rows of that prefix state
    uint64_t host_bytes = 0;        // host tier: its rows' and snapshots' bytes
    std::vector<int32_t> tokens;  // what the state holds: tokens.size() == state->n_past
    // Rows [0, exact) are what a prefill from the first token in grid chunks writes (the
    // sources of a hybrid; every row of a KV cache).
    int64_t exact = 0;
    std::vector<std::shared_ptr<const StateSnapshot>> snapshots;  // ascending n_past, each <= exact
    mutable uint64_t last_use = 0;  // the cache's clock at its last use (LRU)
  };
  struct Sequence {
    Held held;
    bool in_use = false;
  };
  // A place to resume: n tokens of `from`, with the snapshot taken at n (hybrids).
  struct Resume {
    const Held* from = nullptr;
    int64_t n = 0;
    std::shared_ptr<const StateSnapshot> at;
  };

  bool recurrent() const { return snapshot_bytes_ > 0; }
  // The longest prefix of prompt (at most limit tokens) that h can resume.
  Resume resume_in(const Held& h, std::span<const int32_t> prompt, int64_t limit) const;
  // The best over every sequence and entry; a free sequence wins a tie (nothing to copy).
  Resume find(std::span<const int32_t> prompt, int64_t limit) const;
  // dst holds r.n tokens of r.from after it (dst's own where they agree; cut back when r.from
  // is dst).
  void resume(const Resume& r, Held& dst);
  // Copies what a free sequence holds into an entry (unless an entry holds it already, or it
  // does not fit); protect: an entry not to evict for room.
  void keep(const Held& h, const Held* protect);
  // Evicts entries, least recently used first (never protect), until `bytes` more fit (they
  // go to the host tier where it has room); then the snapshots free sequences hold.
  bool make_room(uint64_t bytes, const Held* protect);
  // The rows of a prefix h can give (KV: all; a hybrid's: to its last snapshot).
  int64_t useful(const Held& h) const;
  // Host tier: a copy of device entry e; the entry a copy of host entry h makes on the device
  // (its snapshots counted, not its rows); room for `bytes` more, least recently used out.
  void demote(const Held& e);
  std::unique_ptr<Held> promote(const Held& h);
  bool make_host_room(uint64_t bytes);
  // r's source made a device entry where it is a host one (kept among the entries when it
  // fits the budget, else in `transient` for this one resume).
  Resume from_device(const Resume& r, std::unique_ptr<Held>& transient);
  // A snapshot taken here, its bytes counted while it lives.
  std::shared_ptr<const StateSnapshot> counted(std::unique_ptr<StateSnapshot> snap);
  // A snapshot of h's state if it sits at a grid position it holds exactly and room is left.
  void take_snapshot(Held& h);
  // Drops snapshots past the limit, keeping the newest and the others spread out.
  void thin(Held& h) const;
  void forget(Held& h);
  void drop_entry(size_t i);
  uint64_t total_bytes() const { return entry_bytes_ + *snapshot_held_; }
  // Rows an entry of n tokens allocates: n rounded up, so that the allocator's blocks repeat.
  static int64_t entry_rows(int64_t n);

  Model& model_;
  PromptCacheOptions opt_;
  bool enabled_ = false;
  uint64_t snapshot_bytes_ = 0;  // Model::snapshot_bytes()
  std::vector<Sequence> seq_;
  std::vector<std::unique_ptr<Held>> entries_;
  uint64_t entry_bytes_ = 0;
  Backend* be_ = nullptr;  // Model::state_backend() (the host tier's copies)
  std::vector<std::unique_ptr<Held>> host_entries_;
  uint64_t host_bytes_ = 0;
  // The bytes of every snapshot alive, kept by the snapshots' deleters (which may run after
  // the cache is gone: a shared count).
  std::shared_ptr<uint64_t> snapshot_held_ = std::make_shared<uint64_t>(0);
  std::shared_ptr<uint64_t> snapshot_count_ = std::make_shared<uint64_t>(0);
  uint64_t clock_ = 0;
  PromptCacheCounters counters_;
};

}  // namespace sluice
