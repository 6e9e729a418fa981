// StreamState (stream_state.h).
#include "experts/stream_state.h"

#include <xxhash.h>

#include "core/bits.h"

namespace sluice {

IoEngineOptions StreamState::io_options(const StreamerOptions& opt) {
  IoEngineOptions io;
  io.mode = opt.io_mode;
  io.queue_depth = opt.io_depth;
  io.request_timeout = opt.io_timeout;
  if (opt.io_fault_injection)
    io.fault_injection = [f = opt.io_fault_injection](const ReadRequest& q, int64_t res) { return f(q.record, res); };
  return io;
}

StreamState::StreamState(std::shared_ptr<const Pack> p, DType k, int64_t topk, const StreamerOptions& o,
                         std::function<void(int32_t, int64_t, DType)> on_evict)
    : pack(std::move(p)), kind(k), top_k(topk), opt(o) {
  SLUICE_CHECK(pack, Status::internal, "expert streamer without a pack");
  const PackManifest& m = pack->manifest();
  check_streaming_options(*pack, kind, top_k, opt);
  n_expert = m.n_expert;
  n_layers = static_cast<int64_t>(m.moe_layers.size());
  slot_bytes = streaming_slot_bytes(*pack, kind, opt.miss_kind);
  layout = plan_cache_layout(*pack, top_k, slot_bytes, opt);

  ResidencyOptions ro;
  ro.n_slots = layout.n_slots;
  ro.n_records = m.n_records();
  ro.n_expert = m.n_expert;
  // The speculative share (speculative_share: 2 top_k, at most a quarter of the cache), never
  // so much that a token's experts would not fit beside it.
  ro.speculative_slots = layout.speculative_slots;
  ro.policy = opt.policy;
  ro.policy_options.step_experts = top_k;  // markov's half-life follows the cache's shape
  ro.on_evict = std::move(on_evict);
  residency = std::make_unique<Residency>(ro);
  if (layout.host_slots > 0) {
    ResidencyOptions ho;
    ho.n_slots = layout.host_slots;
    ho.n_records = m.n_records();
    ho.policy = PolicyKind::lru;
    host = std::make_unique<Residency>(ho);
  }

  io = std::make_unique<IoEngine>(io_options(opt));
  files[kind] = io->add_file(pack->expert_file(kind));
  if (opt.miss_kind) files[*opt.miss_kind] = io->add_file(pack->expert_file(*opt.miss_kind));
  for (auto& per_layer : layers) per_layer.assign(static_cast<size_t>(n_layers), LayerStats{});
  io_base = io->counters();
}

std::string StreamState::describe(int64_t record, DType k) const {
  return str("expert record ", record, " (", pack->describe_record(k, record), ")");
}

ReadRequest StreamState::read_request(int64_t record, DType k, void* dest, uint64_t tag, IoPriority priority) const {
  ReadRequest q;
  q.file = files.at(k);
  q.offset = pack->record_offset(k, record);
  q.bytes = pack->kind(k).record_stride;
  q.dest = dest;
  q.record = record;
  q.tag = tag;
  q.priority = priority;
  return q;
}

std::optional<Error> StreamState::landed_error(const ReadCompletion& c, int64_t record, DType k,
                                               const uint8_t* bytes) const {
  if (c.status != Status::ok) return Error(c.status, str(describe(record, k), ": ", c.error));
  if (!opt.verify_reads) return std::nullopt;
  const PackKindInfo& info = pack->kind(k);
  const uint64_t got = XXH3_64bits(bytes, info.record_bytes);
  const uint64_t want = info.checksums[static_cast<size_t>(record)];
  if (got == want) return std::nullopt;
  return Error(Status::corrupt, str(describe(record, k), " read from ", pack->expert_file(k).string(), " at offset ",
                                    pack->record_offset(k, record), ": checksum mismatch (manifest ", hex16(want),
                                    ", data ", hex16(got), "); the pack is corrupt (sluice verify lists every bad record)"));
}

RunStats StreamState::run_stats() const {
  RunStats s;
  s.layers = layers[0];
  for (size_t l = 0; l < s.layers.size(); ++l) {
    s.layers[l] += layers[1][l];
    s.prefill += layers[0][l];
    s.decode += layers[1][l];
  }
  s.slots = residency->n_slots();
  s.slot_bytes = slot_bytes;
  s.cache_bytes = static_cast<uint64_t>(s.slots) * slot_bytes;
  s.speculative_slots = residency->speculative_capacity();
  s.host_cache_bytes = host ? static_cast<uint64_t>(host->n_slots()) * slot_bytes : 0;
  s.policy = std::string(policy_name(opt.policy));
  s.kind = std::string(expert_kind_name(kind));
  if (opt.miss_kind) s.miss_kind = std::string(expert_kind_name(*opt.miss_kind));
  s.lookahead = opt.lookahead;
  s.cut = opt.cut;
  s.cut_share = opt.cut_share;
  const IoCounters c = io->counters();
  s.io_mode = io->file_is_direct(files.at(kind)) ? "direct" : "buffered";
  s.io_uring = io->uses_io_uring();
  s.io_depth = io->queue_depth();
  s.io_reads = c.reads - io_base.reads;
  s.io_bytes = c.bytes - io_base.bytes;
  s.io_busy_seconds = c.busy_seconds - io_base.busy_seconds;
  return s;
}

void StreamState::reset_counters() {
  for (auto& per_layer : layers) per_layer.assign(per_layer.size(), LayerStats{});
  io_base = io->counters();
}

}  // namespace sluice
