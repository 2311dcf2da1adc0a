// The bytes of a synthetic model: quantized blocks written directly with random quants and valid
// scales chosen so each block dequantizes to values of about the wanted standard deviation, mean
// zero. Nothing is quantized from floats: one core generates about 1.3 GB/s, more than disks take.
//
// Determinism: a tensor is cut into fixed segments of about 64 KiB of whole blocks; segment s of
// tensor i draws from its own stream Rng(seed, i, s). Any byte range is produced by generating the
// segments it touches (in parallel) and copying the overlap, so the output does not depend on the
// writer's chunking or on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/fp16.h"
#include "cpu/quant_blocks.h"
#include "model/synth.h"
#include "model/synth_random.h"

namespace strata {

namespace {

using synth_random::Rng;

constexpr uint64_t kSegmentBytes = 64 << 10;

// Standard deviations of uniformly random integer quants: a nibble 0..15, five bits 0..31, six
// bits 0..63, and the difference of two 7-bit values (triangular on -127..127).
constexpr float kStdU4 = 4.6098f;     // sqrt((16^2 - 1) / 12)
constexpr float kStdU5 = 9.2331f;     // sqrt((32^2 - 1) / 12)
constexpr float kStdU6 = 18.4700f;    // sqrt((64^2 - 1) / 12)
constexpr float kStdTri7 = 52.2541f;  // sqrt(2 (128^2 - 1) / 12)
// MXFP4 (E2M1) values of ggml's kvalues_mxfp4 (twice the real values; the scale is halved): the
// std of a uniformly random nibble.
constexpr float kStdMxfp4 = 5.8523f;  // sqrt((0 + 1 + 4 + 9 + 16 + 36 + 64 + 144) / 8)

// What a tensor's generator needs, resolved once per fill() call.
struct TensorGen {
  GgmlType type;
  const SynthTensorFill* fill;
  uint64_t row_blocks;  // blocks per row
  uint64_t row_len;     // elements per row
  int mxfp4_exp;        // E8M0 exponent whose scale is just below the wanted std
  uint64_t seed;        // the plan's seed and the tensor's index, mixed (tables)
};

// Element j of row `row` of a token -> experts table: the row's k distinct experts, drawn from a
// stream of the row alone (rows straddle the segments).
int32_t table_entry(const TensorGen& g, uint64_t row, uint64_t j) {
  Rng rng(g.seed, 0x7461626c65ull /* "table" */, row);
  int32_t chosen[64];
  const uint64_t k = std::min<uint64_t>(g.row_len, 64);
  STRATA_CHECK(g.fill->n_expert >= k, "a table row needs k distinct experts");
  for (uint64_t i = 0; i < k;) {
    const int32_t e = int32_t(rng.next() % g.fill->n_expert);
    if (std::find(chosen, chosen + i, e) == chosen + i) chosen[i++] = e;
  }
  return chosen[j % k];
}

void random_bytes(Rng& rng, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t x = rng.next();
    std::memcpy(out + i, &x, std::min<size_t>(8, n - i));
  }
}

// A per-block scale multiplier in [0.75, 1.25): real blocks do not all share one scale.
float jitter(Rng& rng) {
  return 0.75f + 0.5f * rng.uniform();
}

// Whether block `k` of an embedding holds the shared channels, the first kSynthSharedChannels
// elements of a row (a whole block, or sub-block 0 of a K-quant super-block).
bool is_shared_block(const TensorGen& g, uint64_t k) {
  return g.fill->kind == SynthFill::embedding && k % g.row_blocks == 0;
}

// Packs 6-bit scales and mins of the 8 sub-blocks as Q4_K / Q5_K store them (ggml's
// quantize_row_q4_K_ref; get_scale_min_k4 reads them back).
void pack_k_scales(const uint8_t sc[8], const uint8_t mn[8], uint8_t out[K_SCALE_SIZE]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = uint8_t(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = uint8_t(mn[j] | ((mn[j + 4] >> 4) << 6));
    out[j + 8] = uint8_t((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
}

// Sub-block scales 32..63 with mins equal to them and dmin = mid * d: x = d sc (q - mid), mean 0.
// In a shared block, sub-block 0's min is lowered so its values average +1 of their std.
template <class Block>
void k_scales(Block& b, Rng& rng, float scale, float std_q, float mid, bool shared) {
  uint8_t sc[8], mn[8];
  const uint64_t x = rng.next();
  for (int j = 0; j < 8; ++j) mn[j] = sc[j] = uint8_t(32 + ((x >> (8 * j)) & 31));
  if (shared) mn[0] = uint8_t(std::lround(sc[0] * (1.0f - std_q / mid)));
  b.d = f32_to_fp16(scale / (std_q * 47.5f));  // 47.5: mean sub-block scale
  b.dmin = f32_to_fp16(mid * fp16_to_f32(b.d));
  pack_k_scales(sc, mn, b.scales);
}

void gen_block(const TensorGen& g, uint64_t k, Rng& rng, block_q8_0& b) {
  const float scale = g.fill->std * jitter(rng);
  uint8_t r[64];
  random_bytes(rng, r, sizeof r);
  if (is_shared_block(g, k)) {
    // mean 52 quanta = +1 std, spread halved
    b.d = f32_to_fp16(scale / 52.0f);
    for (int j = 0; j < QK8_0; ++j)
      b.qs[j] = int8_t(52 + ((r[2 * j] & 127) - (r[2 * j + 1] & 127)) / 2);
  } else {
    b.d = f32_to_fp16(scale / kStdTri7);
    for (int j = 0; j < QK8_0; ++j) b.qs[j] = int8_t((r[2 * j] & 127) - (r[2 * j + 1] & 127));
  }
}

void gen_block(const TensorGen& g, uint64_t k, Rng& rng, block_q5_0& b) {
  const float scale = g.fill->std * jitter(rng);
  random_bytes(rng, b.qs, sizeof b.qs);
  if (is_shared_block(g, k)) {
    // every 5th bit set: q - 16 in 0..15, mean 7.5 quanta = +1 std
    std::memset(b.qh, 0xFF, sizeof b.qh);
    b.d = f32_to_fp16(scale / 7.5f);
  } else {
    // x = d (q - 16) has mean -d/2; a random sign of d (as ggml's signed-max scale has) cancels it
    random_bytes(rng, b.qh, sizeof b.qh);
    b.d = f32_to_fp16((rng.next() & 1 ? scale : -scale) / kStdU5);
  }
}

void gen_block(const TensorGen& g, uint64_t k, Rng& rng, block_q5_1& b) {
  STRATA_CHECK(!is_shared_block(g, k), "no mix puts an embedding in q5_1");
  const float scale = g.fill->std * jitter(rng);
  random_bytes(rng, b.qh, sizeof b.qh);
  random_bytes(rng, b.qs, sizeof b.qs);
  b.d = f32_to_fp16(scale / kStdU5);
  b.m = f32_to_fp16(-15.5f * fp16_to_f32(b.d));  // x = d q + m, mean 0
}

void gen_block(const TensorGen& g, uint64_t k, Rng& rng, block_q4_K& b) {
  k_scales(b, rng, g.fill->std * jitter(rng), kStdU4, 7.5f, is_shared_block(g, k));
  random_bytes(rng, b.qs, sizeof b.qs);
}

void gen_block(const TensorGen& g, uint64_t k, Rng& rng, block_q5_K& b) {
  STRATA_CHECK(!is_shared_block(g, k), "no mix puts an embedding in q5_K");
  k_scales(b, rng, g.fill->std * jitter(rng), kStdU5, 15.5f, false);
  random_bytes(rng, b.qh, sizeof b.qh);
  random_bytes(rng, b.qs, sizeof b.qs);
}

void gen_block(const TensorGen& g, uint64_t k, Rng& rng, block_q6_K& b) {
  STRATA_CHECK(!is_shared_block(g, k), "no mix puts an embedding in q6_K");
  const float scale = g.fill->std * jitter(rng);
  random_bytes(rng, b.ql, sizeof b.ql);
  random_bytes(rng, b.qh, sizeof b.qh);
  // x = d sc (q - 32): |sc| 64..127 (mean 95.5) with random signs, which also cancel the -1/2
  // mean of q - 32
  uint8_t r[QK_K / 16];
  random_bytes(rng, r, sizeof r);
  for (int j = 0; j < QK_K / 16; ++j) {
    const int mag = 64 + (r[j] & 63);
    b.scales[j] = int8_t(r[j] & 0x80 ? -mag : mag);
  }
  b.d = f32_to_fp16(scale / (kStdU6 * 95.5f));
}

void gen_block(const TensorGen& g, uint64_t k, Rng& rng, block_mxfp4& b) {
  STRATA_CHECK(!is_shared_block(g, k), "no mix puts an embedding in mxfp4");
  random_bytes(rng, b.qs, sizeof b.qs);
  // power-of-two scales: half the blocks just below the wanted std, half just above
  b.e = uint8_t(g.mxfp4_exp + int(rng.next() & 1));
}

float gen_f32(const TensorGen& g, uint64_t k, Rng& rng) {
  const SynthTensorFill& f = *g.fill;
  const float n = f.std * rng.normal();
  switch (f.kind) {
    case SynthFill::norm:
      return 1.0f + n;
    case SynthFill::bias:
      return n;
    case SynthFill::router: {
      // ffn_gate_inp [n_embd, n_expert]: element k is channel k % n_embd of expert k / n_embd.
      // The shared channels hold only the expert's offset: random values there would read the
      // shared component too and blur the designed popularity by a random offset per expert.
      const uint64_t channel = k % g.row_len;
      if (channel >= kSynthSharedChannels) return n;
      return f.expert_bias[k / g.row_len] / float(kSynthSharedChannels);
    }
    case SynthFill::weight:
    case SynthFill::embedding:
    case SynthFill::table:
      break;
  }
  STRATA_CHECK(false, "every 2D weight is quantized in every mix");
  return 0;
}

template <class Block>
void gen_blocks(const TensorGen& g, uint64_t first, uint64_t n, uint8_t* out, Rng& rng) {
  Block b;
  for (uint64_t i = 0; i < n; ++i) {
    gen_block(g, first + i, rng, b);
    std::memcpy(out + i * sizeof(Block), &b, sizeof(Block));  // `out` need not be aligned
  }
}

// Blocks [first, first + n) of the tensor into `out`.
void generate(const TensorGen& g, uint64_t first, uint64_t n, uint8_t* out, Rng& rng) {
  switch (g.type) {
    case GgmlType::f32:
      for (uint64_t i = 0; i < n; ++i) {
        const float v = gen_f32(g, first + i, rng);
        std::memcpy(out + 4 * i, &v, 4);
      }
      return;
    case GgmlType::i32:
      STRATA_CHECK(g.fill->kind == SynthFill::table, "only tables are I32");
      for (uint64_t i = 0; i < n; ++i) {
        const int32_t v = table_entry(g, (first + i) / g.row_len, (first + i) % g.row_len);
        std::memcpy(out + 4 * i, &v, 4);
      }
      return;
    case GgmlType::q8_0:
      return gen_blocks<block_q8_0>(g, first, n, out, rng);
    case GgmlType::q5_0:
      return gen_blocks<block_q5_0>(g, first, n, out, rng);
    case GgmlType::q5_1:
      return gen_blocks<block_q5_1>(g, first, n, out, rng);
    case GgmlType::q4_k:
      return gen_blocks<block_q4_K>(g, first, n, out, rng);
    case GgmlType::q5_k:
      return gen_blocks<block_q5_K>(g, first, n, out, rng);
    case GgmlType::q6_k:
      return gen_blocks<block_q6_K>(g, first, n, out, rng);
    case GgmlType::mxfp4:
      return gen_blocks<block_mxfp4>(g, first, n, out, rng);
    default:
      break;
  }
  STRATA_CHECK(false, "synth_tensor_type picked a type without a generator");
}

}  // namespace

void SynthPlan::fill(size_t index, uint64_t offset, std::span<uint8_t> out) const {
  STRATA_CHECK(index < fills.size());
  const GgufTensorInfo& t = writer.tensors()[index];
  STRATA_CHECK(offset + out.size() <= t.n_bytes, "range beyond the tensor");
  const GgmlTypeTraits& tr = ggml_traits(t.type);
  TensorGen g{.type = t.type,
              .fill = &fills[index],
              .row_blocks = t.ne[0] / tr.block_size,
              .row_len = t.ne[0],
              .mxfp4_exp = 128 + int(std::floor(std::log2(fills[index].std / kStdMxfp4))),
              .seed = synth_random::mix64(seed + index)};

  const uint64_t block_bytes = tr.type_size;
  const uint64_t n_blocks = t.n_bytes / block_bytes;
  const uint64_t seg_blocks = std::max<uint64_t>(1, kSegmentBytes / block_bytes);
  const uint64_t seg_bytes = seg_blocks * block_bytes;
  const int64_t first_seg = int64_t(offset / seg_bytes);
  const int64_t end_seg = int64_t((offset + out.size() + seg_bytes - 1) / seg_bytes);
  const uint64_t end = offset + out.size();

#pragma omp parallel
  {
    std::vector<uint8_t> partial;  // a segment that sticks out of the range
#pragma omp for schedule(dynamic)
    for (int64_t s = first_seg; s < end_seg; ++s) {
      const uint64_t b0 = uint64_t(s) * seg_blocks;
      const uint64_t nb = std::min(seg_blocks, n_blocks - b0);
      const uint64_t lo = b0 * block_bytes, hi = lo + nb * block_bytes;
      Rng rng(seed, index, uint64_t(s));
      if (lo >= offset && hi <= end) {
        generate(g, b0, nb, out.data() + (lo - offset), rng);
      } else {
        partial.resize(hi - lo);
        generate(g, b0, nb, partial.data(), rng);
        const uint64_t from = std::max(lo, offset), to = std::min(hi, end);
        std::memcpy(out.data() + (from - offset), partial.data() + (from - lo), to - from);
      }
    }
  }
}

Status SynthPlan::write_file(const std::string& path,
                             const GgufWriter::ProgressFn& progress) const {
  return writer.write_file(
      path, [this](size_t i, uint64_t off, std::span<uint8_t> out) { fill(i, off, out); },
      progress);
}

std::vector<uint8_t> SynthPlan::write_memory() const {
  return writer.write_memory(
      [this](size_t i, uint64_t off, std::span<uint8_t> out) { fill(i, off, out); });
}

}  // namespace strata
