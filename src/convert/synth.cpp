// synth_plan and synth_pack: the tensor list from the family's loader, random values as a
// pure function of (seed, position), dense.bin in chunks and expert records in batches, each
// generated on the thread pool while the previous one is written.
#include "convert/synth.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <set>

#include "convert/pack_writer.h"
#include "core/bits.h"
#include "core/error.h"
#include "core/log.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "models/meta_source.h"

namespace sluice {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;


// ---- counter-based random numbers ----

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// splitmix64's output function: a bijective 64-bit mix.
inline uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The key of one random stream (a tensor, or a block row of a record).
inline uint64_t stream_key(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return mix64(mix64(mix64(seed * kGolden + a) + b * kGolden) + c * kGolden + 1);
}

// Element i of a stream: splitmix64 at counter i, so any range is computed independently.
inline uint64_t rand_at(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * kGolden); }

// Uniform in [0, 1) from the top 24 bits.
inline float uniform_from(uint64_t r) { return static_cast<float>(r >> 40) * (1.0f / 16777216.0f); }

// bf16 values mean + std * z for elements [e0, e1) of a stream, z about N(0, 1): the sum of
// the four bytes of a 32-bit hash (Irwin-Hall, n = 4: 1021 levels within +-3.45, which is
// all a random weight needs; bf16 keeps 8 bits anyway), centred and scaled to unit variance.
// The hash is murmur3's fmix32 of a Weyl sequence, 32-bit so that the loop vectorizes
// (AVX2 has 32-bit but no 64-bit multiplies): the bulk of dense.bin costs well under a
// nanosecond per element, far below the disk.
void fill_normal_bf16(uint16_t* out, uint64_t key, uint64_t e0, uint64_t e1, float mean, float std) {
  constexpr float kMean = 4 * 127.5f, kStd = 147.80f;  // sqrt(4 (256^2 - 1) / 12)
  const float a = std / kStd, b = mean - kMean * a;      // value = b + a * (byte sum)
  for (uint64_t e = e0; e < e1;) {
    // A 2^32-element segment shares one 32-bit key (no real tensor has more than one).
    const uint64_t hi = e >> 32, seg_end = std::min(e1, (hi + 1) << 32);
    const uint32_t k32 = static_cast<uint32_t>(mix64(key + hi * kGolden));
    const uint32_t lo = static_cast<uint32_t>(e);
    const uint32_t n = static_cast<uint32_t>(seg_end - e);
    uint16_t* o = out + (e - e0);
    for (uint32_t j = 0; j < n; ++j) {
      uint32_t x = k32 + (lo + j) * 0x9E3779B9u;
      x ^= x >> 16;
      x *= 0x85EBCA6Bu;
      x ^= x >> 13;
      x *= 0xC2B2AE35u;
      x ^= x >> 16;
      const float sum = static_cast<float>((x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24));
      const float v = b + a * sum;  // finite: no NaN handling needed
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      o[j] = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);  // round to nearest even
    }
    e = seg_end;
  }
}

// ---- dense values ----

// Standard deviation of the random dense weights and of dequantized expert weights: the
// initializer_range of the Qwen and Mixtral configs.
constexpr float kWeightStd = 0.02f;

enum class DenseInit { normal, norm_one, norm_zero, ones, a_log, dt_bias, conv };

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What a dense tensor holds, from the loader's hint and the checkpoint naming conventions
// shared by the families (transformers' _init_weights of the Qwen families).
DenseInit dense_init(const std::string& name, WeightHint hint) {
  if (hint == WeightHint::zero_centered_norm) return DenseInit::norm_zero;  // stored as w, used as 1 + w
  // input_layernorm, q_norm, Gemma 4's post_feedforward_layernorm_1, ...: a ".weight" whose
  // module's name holds "norm".
  if (ends_with(name, ".weight")) {
    const std::string module = name.substr(0, name.size() - 7);
    if (module.find("norm", module.rfind('.') + 1) != std::string::npos) return DenseInit::norm_one;
  }
  // Gemma 4's router scales and layer scalar: transformers initializes them to ones.
  if (ends_with(name, ".router.scale") || ends_with(name, ".router.per_expert_scale") || ends_with(name, ".layer_scalar"))
    return DenseInit::ones;
  if (ends_with(name, ".A_log")) return DenseInit::a_log;
  if (ends_with(name, ".dt_bias")) return DenseInit::dt_bias;
  if (ends_with(name, "conv1d.weight")) return DenseInit::conv;
  return DenseInit::normal;
}

// Elements [e0, e1) of a dense tensor as bf16. `taps`: the conv kernel size (last dimension).
void fill_dense(DenseInit init, uint16_t* out, uint64_t key, uint64_t e0, uint64_t e1, int64_t taps) {
  switch (init) {
    case DenseInit::normal: return fill_normal_bf16(out, key, e0, e1, 0.0f, kWeightStd);
    case DenseInit::norm_one: return fill_normal_bf16(out, key, e0, e1, 1.0f, kWeightStd);
    case DenseInit::norm_zero: return fill_normal_bf16(out, key, e0, e1, 0.0f, kWeightStd);
    case DenseInit::a_log:  // A ~ U(0.01, 16), as transformers initializes it
      for (uint64_t e = e0; e < e1; ++e) out[e - e0] = f32_to_bf16(std::log(0.01f + 15.99f * uniform_from(rand_at(key, e))));
      return;
    case DenseInit::ones:
    case DenseInit::dt_bias:  // transformers: ones
      for (uint64_t e = e0; e < e1; ++e) out[e - e0] = f32_to_bf16(1.0f);
      return;
    case DenseInit::conv: {  // PyTorch's default for a depthwise conv: U(-1/sqrt(k), 1/sqrt(k))
      const float bound = 1.0f / std::sqrt(static_cast<float>(taps));
      for (uint64_t e = e0; e < e1; ++e) out[e - e0] = f32_to_bf16(bound * (2.0f * uniform_from(rand_at(key, e)) - 1.0f));
      return;
    }
  }
}

// ---- expert record values ----

// Scales that give dequantized weights a standard deviation of kWeightStd, for packed values
// uniform over their range:
//   int8: q uniform in [-127, 127]: E[q^2] = 127 * 128 / 3 = 5418.7
//   q4:   q uniform in [0, 15]: E[(q - 8)^2] = 21.5
//   q2:   q uniform in [0, 3] with min = -1.5 scale: w in {-1.5, -0.5, 0.5, 1.5} * scale, E[w^2] = 1.25 scale^2
//   mxfp4: codes uniform over the 16 e2m1 values: E[w^2] = 68.5 / 8 = 8.5625 scale^2, the
//         scale a power of two (the nearest to kWeightStd / sqrt(8.5625)), each group's
//         exponent that one or its neighbour above or below (a hash)
// Each row (int8) or group (q4, q2) gets the scale times a jitter in [0.75, 1.25) (256
// levels, tabulated once: converting to f16 per group would cost more than the bytes), and
// q4 scales a random sign, as Q4_0's d = m / -8 has; the jitter changes the variance by 2%.
struct ScaleTables {
  float int8[256];
  uint16_t q4[256];      // f16, positive
  uint32_t q2[256];      // f16 scale | f16 min << 16, as the record stores them
  uint8_t mxfp4 = 127;   // e8m0 exponent of the centre scale
};

const ScaleTables& scale_tables() {
  static const ScaleTables t = [] {
    ScaleTables t{};
    const float int8 = kWeightStd / std::sqrt(127.0f * 128.0f / 3.0f), q4 = kWeightStd / std::sqrt(21.5f),
                q2 = kWeightStd / std::sqrt(1.25f);
    for (int i = 0; i < 256; ++i) {
      const float jitter = 0.75f + 0.5f * (static_cast<float>(i) + 0.5f) / 256.0f;
      t.int8[i] = int8 * jitter;
      t.q4[i] = f32_to_f16(q4 * jitter);
      t.q2[i] = f32_to_f16(q2 * jitter) | static_cast<uint32_t>(f32_to_f16(-1.5f * q2 * jitter)) << 16;
    }
    t.mxfp4 = static_cast<uint8_t>(127 + std::lround(std::log2(kWeightStd / std::sqrt(8.5625f))));
    return t;
  }();
  return t;
}

// A 32-bit counter-based hash (murmur3's fmix32 of a Weyl sequence) for the bulk bytes of
// records: 32-bit so that the loops vectorize.
inline uint32_t hash32(uint32_t key, uint32_t i) {
  uint32_t x = key + (i + 1) * 0x9E3779B9u;
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  return x ^ (x >> 16);
}

// Fills `n` bytes (n < 2^34) with the stream's bytes 0..n-1.
void fill_random_bytes(uint8_t* out, size_t n, uint32_t key) {
  const uint32_t words = static_cast<uint32_t>(n / 4);
  for (uint32_t j = 0; j < words; ++j) {
    const uint32_t x = hash32(key, j);
    std::memcpy(out + 4 * static_cast<size_t>(j), &x, 4);
  }
  if (n % 4) {
    const uint32_t x = hash32(key, words);
    std::memcpy(out + 4 * static_cast<size_t>(words), &x, n % 4);
  }
}

// One row of a block of a kind: packed values and scales, as the quantizer would lay them
// out (a partial last group's missing elements are zero bits).
void fill_expert_row(DType kind, int64_t cols, uint64_t key, uint8_t* data, uint8_t* scales) {
  const ScaleTables& t = scale_tables();
  const uint32_t k32 = static_cast<uint32_t>(key), scale_k32 = static_cast<uint32_t>(key >> 32);
  switch (kind) {
    case DType::bf16: {
      fill_normal_bf16(reinterpret_cast<uint16_t*>(data), key, 0, static_cast<uint64_t>(cols), 0.0f, kWeightStd);
      return;
    }
    case DType::q8: {
      fill_random_bytes(data, static_cast<size_t>(cols), k32);
      for (int64_t c = 0; c < cols; ++c) data[c] = static_cast<uint8_t>(static_cast<int8_t>(data[c] % 255 - 127));
      std::memcpy(scales, &t.int8[hash32(scale_k32, 0) & 255], 4);
      return;
    }
    case DType::q4: {
      const int64_t groups = quant_groups(DType::q4, cols);
      fill_random_bytes(data, static_cast<size_t>(quant_row_bytes(DType::q4, cols)), k32);
      for (int64_t e = cols; e < groups * kQ4Group; ++e) data[e / 2] &= static_cast<uint8_t>(e % 2 ? 0x0F : 0xF0);
      for (int64_t g = 0; g < groups; ++g) {
        const uint32_t x = hash32(scale_k32, static_cast<uint32_t>(g));
        const uint16_t h = static_cast<uint16_t>(t.q4[x & 255] | (x & 0x100) << 7);  // bit 8: the sign (f16 bit 15)
        std::memcpy(scales + 2 * g, &h, 2);
      }
      return;
    }
    case DType::q2: {
      const int64_t groups = quant_groups(DType::q2, cols);
      fill_random_bytes(data, static_cast<size_t>(quant_row_bytes(DType::q2, cols)), k32);
      for (int64_t e = cols; e < groups * kQ2Group; ++e) data[e / 4] &= static_cast<uint8_t>(~(3u << (2 * (e % 4))));
      for (int64_t g = 0; g < groups; ++g)
        std::memcpy(scales + 4 * g, &t.q2[hash32(scale_k32, static_cast<uint32_t>(g)) & 255], 4);
      return;
    }
    case DType::mxfp4: {
      const int64_t groups = quant_groups(DType::mxfp4, cols);
      fill_random_bytes(data, static_cast<size_t>(quant_row_bytes(DType::mxfp4, cols)), k32);
      for (int64_t e = cols; e < groups * kMxfp4Group; ++e) data[e / 2] &= static_cast<uint8_t>(e % 2 ? 0x0F : 0xF0);
      for (int64_t g = 0; g < groups; ++g)
        scales[g] = static_cast<uint8_t>(t.mxfp4 + static_cast<int>(hash32(scale_k32, static_cast<uint32_t>(g)) % 3) - 1);
      return;
    }
    default: break;
  }
}

void check_cancel(const SynthOptions& opt) {
  if (opt.cancel && opt.cancel->load()) fail(Status::io, "synth interrupted; nothing was written to the output");
}

}  // namespace

// ---- the plan ----

SynthPlan synth_plan(const nlohmann::json& config, std::vector<DType> kinds, DType dense) {
  SLUICE_CHECK(dense == DType::bf16 || dense == DType::f32 || is_dense_quant_dtype(dense), Status::invalid_argument,
               "synth: dense dtype must be bf16, f32, int8 or q4");
  SLUICE_CHECK(!kinds.empty(), Status::invalid_argument, "synth: no expert kinds to write");
  std::sort(kinds.begin(), kinds.end());
  std::string family;
  std::vector<MetaTensor> tensors;
  try {
    tensors = family_tensors(config, &family);
  } catch (const Error& e) {
    if (e.status() != Status::not_found) throw;
    // The loader took a tensor's shape from the checkpoint instead of declaring it.
    fail(Status::unsupported, "synth: ", e.what(), " (synth makes up only tensors whose shape the config ",
         "determines: qwen4_exp's PLE n-gram tables are not, so use a config without ple_layer_ids)");
  }
  std::vector<TensorDecl> decls;
  for (const MetaTensor& t : tensors) decls.push_back({t.name, DType::bf16, t.shape});
  std::set<std::string> expert_names;
  const std::vector<ExpertLayer> layers =
      find_expert_layers(decls, str("synth (", family, ")"), expert_names, find_family(config).fused_experts);

  SynthPlan plan;
  PackManifest& m = plan.manifest;
  m.family = family;
  m.config = config;
  m.dense_dtype = dense == DType::f32 ? DType::f32 : DType::bf16;  // quantized: the other tensors bf16
  pack_manifest_set_experts(m, layers, kinds);
  uint64_t at = kPackHeaderBytes;
  for (const MetaTensor& t : tensors) {
    if (expert_names.count(t.name)) continue;
    at = round_up(at, kPackBlockAlign);
    if (is_dense_quant_dtype(dense) && t.matrix && dense_quantizable_shape(t.shape)) {
      PackDenseTensor q{t.name, dense, t.shape, at, static_cast<uint64_t>(t.shape[0] * quant_row_bytes(dense, t.shape[1]))};
      q.scale_offset = round_up(at + q.bytes, kPackBlockAlign);
      q.scale_bytes = static_cast<uint64_t>(t.shape[0] * quant_scale_row_bytes(dense, t.shape[1]));
      at = q.scale_offset + q.scale_bytes;
      m.dense.push_back(std::move(q));
    } else {
      uint64_t bytes = dtype_size(m.dense_dtype);
      for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
      m.dense.push_back({t.name, m.dense_dtype, t.shape, at, bytes});
      at += bytes;
    }
    plan.dense_hints.push_back(t.hint);
  }
  m.dense_file_bytes = at;
  plan.dense_bytes = at;
  for (const auto& [kind, info] : m.kinds)
    plan.expert_bytes += kPackHeaderBytes + static_cast<uint64_t>(m.n_records()) * info.record_stride;
  return plan;
}

// ---- writing ----

SynthSummary synth_pack(const nlohmann::json& config, const fs::path& out_arg, const SynthOptions& opt) {
  const auto t_start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t_start).count(); };

  // 1. The plan (config errors fail here, before anything is written), then the output.
  SynthPlan plan = synth_plan(config, opt.kinds, opt.dense);
  PackManifest& m = plan.manifest;
  PackStaging staging(out_arg, opt.force, "synth");
  const fs::path& dir = staging.dir();
  ThreadPool& pool = ThreadPool::global();

  SynthProgress prog;
  prog.records_total = m.n_records();
  prog.bytes_total = plan.total_bytes();
  prog.bytes_done = kPackHeaderBytes;  // dense.bin's header page
  auto report = [&](std::string_view stage) {
    prog.stage = stage;
    prog.seconds = elapsed();
    if (opt.progress) opt.progress(prog);
  };

  // 2. dense.bin, a chunk of the file at a time: zero gaps, each tensor's overlapping
  // elements generated in parallel pieces, the chunk written (O_DIRECT: chunks are 4096-
  // aligned, all but the last whole) while the next is generated.
  {
    DenseFileWriter out(dir / kPackDenseName, /*direct=*/true);
    const uint64_t chunk_bytes = std::max<uint64_t>(kPackRecordAlign, round_up(opt.batch_bytes, kPackRecordAlign));
    AlignedBuffer bufs[2] = {AlignedBuffer(chunk_bytes), AlignedBuffer(chunk_bytes)};
    std::future<void> pending;
    std::vector<uint64_t> keys;
    std::vector<DenseInit> inits;
    for (size_t i = 0; i < m.dense.size(); ++i) {
      keys.push_back(stream_key(opt.seed, 0, i));
      inits.push_back(dense_init(m.dense[i].name, plan.dense_hints[i]));
    }
    // A piece: bytes [begin, end) of one region of a tensor: its values (float elements, or
    // a quantized tensor's packed rows) or a quantized tensor's scales.
    struct Piece {
      size_t tensor;
      bool scales;
      uint64_t begin, end;
      uint8_t* out;  // where byte `begin` goes
    };
    constexpr uint64_t kPieceBytes = uint64_t{1} << 17;
    size_t first = 0;  // the first tensor that may overlap the chunk
    int which = 0;
    auto tensor_end = [](const PackDenseTensor& t) { return t.scale_bytes ? t.scale_offset + t.scale_bytes : t.offset + t.bytes; };
    for (uint64_t c0 = kPackHeaderBytes; c0 < m.dense_file_bytes; c0 += chunk_bytes, which ^= 1) {
      check_cancel(opt);
      const uint64_t c1 = std::min(m.dense_file_bytes, c0 + chunk_bytes);
      uint8_t* buf = bufs[which].data();
      const size_t n = static_cast<size_t>(c1 - c0);
      std::memset(buf, 0, n);
      std::vector<Piece> pieces;
      while (first < m.dense.size() && tensor_end(m.dense[first]) <= c0) ++first;
      for (size_t i = first; i < m.dense.size() && m.dense[i].offset < c1; ++i) {
        const PackDenseTensor& t = m.dense[i];
        for (bool sc : {false, true}) {
          const uint64_t off = sc ? t.scale_offset : t.offset, bytes = sc ? t.scale_bytes : t.bytes;
          const uint64_t b0 = std::max(off, c0), b1 = std::min(off + bytes, c1);  // whole float elements
          for (uint64_t b = b0; b < b1; b += kPieceBytes)
            pieces.push_back({i, sc, b - off, std::min(b1, b + kPieceBytes) - off, buf + (b - c0)});
        }
      }
      pool.parallel_for(static_cast<int64_t>(pieces.size()), 1, [&](int64_t p0, int64_t p1) {
        std::vector<uint16_t> wide;
        std::vector<uint8_t> row, row_scales;
        for (int64_t p = p0; p < p1; ++p) {
          const Piece& pc = pieces[static_cast<size_t>(p)];
          const PackDenseTensor& t = m.dense[pc.tensor];
          if (dtype_is_quantized(t.dtype)) {
            // Rows made up as the quantizer would lay them out (fill_expert_row), the piece's
            // bytes copied out of them: a row cut by a piece boundary is made twice, the same.
            const int64_t cols = t.shape[1];
            const uint64_t rb = quant_row_bytes(t.dtype, cols), sb = quant_scale_row_bytes(t.dtype, cols);
            const uint64_t stride = pc.scales ? sb : rb;
            row.resize(rb);
            row_scales.resize(sb);
            for (uint64_t r = pc.begin / stride; r * stride < pc.end; ++r) {
              fill_expert_row(t.dtype, cols, mix64(keys[pc.tensor] + r * kGolden), row.data(), row_scales.data());
              const uint8_t* src = pc.scales ? row_scales.data() : row.data();
              const uint64_t lo = std::max(pc.begin, r * stride), hi = std::min(pc.end, (r + 1) * stride);
              std::memcpy(pc.out + (lo - pc.begin), src + (lo - r * stride), hi - lo);
            }
          } else if (t.dtype == DType::f32) {  // the bf16 values, widened (exact)
            wide.resize((pc.end - pc.begin) / 4);
            fill_dense(inits[pc.tensor], wide.data(), keys[pc.tensor], pc.begin / 4, pc.end / 4, t.shape.back());
            dtype_convert_row(wide.data(), DType::bf16, pc.out, DType::f32, static_cast<int64_t>(wide.size()));
          } else {
            fill_dense(inits[pc.tensor], reinterpret_cast<uint16_t*>(pc.out), keys[pc.tensor], pc.begin / 2, pc.end / 2,
                       t.shape.back());
          }
        }
      });
      if (pending.valid()) pending.get();
      pending = std::async(std::launch::async, [&out, buf, n] { out.write(buf, n); });
      prog.bytes_done += c1 - c0;
      report("dense");
    }
    if (pending.valid()) pending.get();
    const uint64_t planned = m.dense_file_bytes;
    out.finish(m);
    SLUICE_ASSERT(m.dense_file_bytes == planned);
  }

  // 3. Expert records, a batch at a time; checksums computed in parallel with the fill.
  std::vector<DType> kinds;
  std::vector<std::unique_ptr<OutFile>> files;
  std::vector<OutFile*> file_ptrs;
  std::vector<PackKindInfo*> infos;
  uint64_t stride_sum = 0;
  for (auto& [kind, info] : m.kinds) {
    kinds.push_back(kind);
    files.push_back(open_expert_file(dir, info, m.n_records()));
    file_ptrs.push_back(files.back().get());
    infos.push_back(&info);
    stride_sum += info.record_stride;
  }
  const int64_t n_records = m.n_records();
  const int64_t per_batch = std::clamp<int64_t>(static_cast<int64_t>(opt.batch_bytes / stride_sum), 1, n_records);
  RecordBatch batches[2];
  for (RecordBatch& b : batches)
    for (const PackKindInfo* info : infos) b.out.push_back(std::make_unique<AlignedBuffer>(per_batch * info->record_stride));
  prog.bytes_done += kPackHeaderBytes * infos.size();
  {
    RecordBatchWriter writer(file_ptrs, infos, /*checksum=*/false);
    constexpr int64_t kRowsPerItem = 128;
    struct Item {
      int kind, proj;  // index into infos; 0 gate, 1 up, 2 down
      int64_t rec, row_begin, row_end;
    };
    int which = 0;
    for (int64_t r0 = 0; r0 < n_records; r0 += per_batch, which ^= 1) {
      check_cancel(opt);
      RecordBatch& b = batches[which];
      writer.wait_free(&b);
      b.r0 = r0;
      b.count = std::min(per_batch, n_records - r0);
      std::vector<Item> items;
      for (int k = 0; k < static_cast<int>(infos.size()); ++k)
        for (int64_t i = 0; i < b.count; ++i)
          for (int p = 0; p < 3; ++p) {
            const PackKindInfo& info = *infos[static_cast<size_t>(k)];
            const int64_t rows = (p == 0 ? info.gate : p == 1 ? info.up : info.down).rows;
            for (int64_t r = 0; r < rows; r += kRowsPerItem) items.push_back({k, p, r0 + i, r, std::min(rows, r + kRowsPerItem)});
          }
      pool.parallel_for(static_cast<int64_t>(items.size()), 1, [&](int64_t i0, int64_t i1) {
        for (int64_t it = i0; it < i1; ++it) {
          const Item& item = items[static_cast<size_t>(it)];
          const PackKindInfo& info = *infos[static_cast<size_t>(item.kind)];
          const PackBlock& blk = item.proj == 0 ? info.gate : item.proj == 1 ? info.up : info.down;
          uint8_t* rec = b.out[static_cast<size_t>(item.kind)]->data() + (item.rec - r0) * info.record_stride;
          const DType dt = info.kind;
          const uint64_t row_bytes = dt == DType::bf16 ? static_cast<uint64_t>(blk.cols) * 2 : quant_row_bytes(dt, blk.cols);
          const uint64_t scale_row_bytes = dt == DType::bf16 ? 0 : quant_scale_row_bytes(dt, blk.cols);
          const uint64_t key = stream_key(opt.seed, 1 + static_cast<uint64_t>(info.kind), static_cast<uint64_t>(item.rec),
                                          static_cast<uint64_t>(item.proj));
          for (int64_t r = item.row_begin; r < item.row_end; ++r)
            fill_expert_row(info.kind, blk.cols, mix64(key + static_cast<uint64_t>(r) * kGolden),
                            rec + blk.offset + static_cast<uint64_t>(r) * row_bytes,
                            rec + blk.scale_offset + static_cast<uint64_t>(r) * scale_row_bytes);
        }
      });
      const int64_t n_rec_items = static_cast<int64_t>(infos.size()) * b.count;
      pool.parallel_for(n_rec_items, 1, [&](int64_t i0, int64_t i1) {
        for (int64_t it = i0; it < i1; ++it) {
          PackKindInfo& info = *infos[static_cast<size_t>(it / b.count)];
          const int64_t i = it % b.count;
          uint8_t* rec = b.out[static_cast<size_t>(it / b.count)]->data() + i * info.record_stride;
          // Expert biases (gpt-oss) start at zero, as transformers initializes them.
          for (const PackBias* bias : {&info.gate_bias, &info.up_bias, &info.down_bias})
            if (bias->bytes) std::memset(rec + bias->offset, 0, bias->bytes);
          pack_record_zero_gaps(info, rec);
          info.checksums[static_cast<size_t>(r0 + i)] = XXH3_64bits(rec, info.record_bytes);
        }
      });
      writer.push(&b);
      prog.records_done = r0 + b.count;
      for (const PackKindInfo* info : infos) prog.bytes_done += static_cast<uint64_t>(b.count) * info->record_stride;
      report("experts");
    }
    writer.drain();
  }
  SynthSummary s;
  s.direct = !files.empty() && files.front()->direct();
  LOG_INFO("synth: expert files written with ", s.direct ? "O_DIRECT" : "buffered", " IO");
  uint64_t bytes_out = m.dense_file_bytes;
  for (auto& f : files) {
    bytes_out += f->size();
    f->finish();
  }

  // 4. The manifest (last: a directory without it is not a pack), the load check, into place.
  const std::string manifest = pack_manifest_to_json(m);
  write_small_file(dir / kPackManifestName, manifest.data(), manifest.size());
  fsync_dir(dir);
  check_pack_loads(dir, kinds, "synth");
  staging.commit();

  s.out_dir = staging.out_dir();
  s.family = m.family;
  s.n_records = n_records;
  s.bytes_out = bytes_out;
  s.seconds = elapsed();
  s.kinds = kinds;
  return s;
}

}  // namespace sluice
