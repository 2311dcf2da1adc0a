#include "cpu/kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "cpu/fp16.h"
#include "cpu/kernels.h"
#include "cpu/quant_blocks.h"
#include "cpu/quant_ref.h"

namespace strata::cpu {

size_t kv_key_block_bytes(KvType t, int64_t dk) {
  switch (t) {
    case KvType::f32: return size_t(dk * kKvKeyBlock) * 4;
    case KvType::f16: return size_t(dk * kKvKeyBlock) * 2;
    case KvType::q8_0: return size_t(dk * kKvKeyBlock) + size_t(dk / 32 * kKvKeyBlock) * 2;
  }
  return 0;
}

size_t kv_value_row_bytes(KvType t, int64_t dv) {
  switch (t) {
    case KvType::f32: return size_t(dv) * 4;
    case KvType::f16: return size_t(dv) * 2;
    case KvType::q8_0: return size_t(dv / 32) * sizeof(block_q8_0);
  }
  return 0;
}

bool kv_type_fits(KvType t, int64_t dk, int64_t dv) {
  return t != KvType::q8_0 || (dk % 32 == 0 && dv % 32 == 0 && dk <= kAttendQ8MaxDim);
}

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::f32: return "f32";
    case KvType::f16: return "f16";
    case KvType::q8_0: return "q8_0";
  }
  return "?";
}

namespace {

// q8_0 blocks of n floats with the start-up ISA's quantizer (the reference's rounding exactly; the
// scalar reference's roundf calls were most of a decode layer's 5-9 us of KV stores)
void quantize_q8_0(const float* x, block_q8_0* y, int64_t n) {
  static const QuantizeRowFn quantize = cpu_kernels().quantize(GgmlType::q8_0);
  quantize(x, y, n);
}

}  // namespace

void kv_store_key(KvType t, const float* k, int64_t dk, uint8_t* block, int64_t slot) {
  const int64_t kb = kKvKeyBlock;
  if (t == KvType::f32) {
    auto* b = reinterpret_cast<float*>(block);
    for (int64_t d = 0; d < dk; ++d) b[d * kb + slot] = k[d];
  } else if (t == KvType::f16) {
    auto* b = reinterpret_cast<uint16_t*>(block);
    for (int64_t d = 0; d < dk; ++d) b[d * kb + slot] = f32_to_fp16(k[d]);
  } else {
    auto* scales = reinterpret_cast<uint16_t*>(block + dk * kb);
    block_q8_0 qb[kAttendQ8MaxDim / 32];
    STRATA_CHECK(dk <= kAttendQ8MaxDim, "q8_0 keys of more than kAttendQ8MaxDim dims");
    quantize_q8_0(k, qb, dk);
    for (int64_t g = 0; g < dk / 32; ++g) {
      scales[g * kb + slot] = qb[g].d;
      for (int64_t i = 0; i < 32; ++i) block[kv_q8_key_offset(g * 32 + i, slot)] = uint8_t(qb[g].qs[i] ^ 0x80);
    }
  }
}

void kv_store_value(KvType t, const float* v, int64_t dv, uint8_t* row) {
  if (t == KvType::f32) {
    std::memcpy(row, v, size_t(dv) * 4);
  } else if (t == KvType::f16) {
    auto* r = reinterpret_cast<uint16_t*>(row);
    for (int64_t d = 0; d < dv; ++d) r[d] = f32_to_fp16(v[d]);
  } else {
    quantize_q8_0(v, reinterpret_cast<block_q8_0*>(row), dv);
  }
}

void kv_widen_keys(KvType t, const uint8_t* block, int64_t dk, float* out) {
  const int64_t kb = kKvKeyBlock;
  if (t == KvType::f32) {
    std::memcpy(out, block, size_t(dk * kb) * 4);
  } else if (t == KvType::f16) {
    cpu_kernels().half_to_float(reinterpret_cast<const uint16_t*>(block), out, dk * kb);
  } else {
    const auto* scales = reinterpret_cast<const uint16_t*>(block + dk * kb);
    for (int64_t g = 0; g < dk / 32; ++g) {
      float s[kKvKeyBlock];
      for (int64_t j = 0; j < kb; ++j) s[j] = fp16_to_f32(scales[g * kb + j]);
      for (int64_t d = g * 32; d < g * 32 + 32; ++d)
        for (int64_t j = 0; j < kb; ++j) out[d * kb + j] = float(int(block[kv_q8_key_offset(d, j)]) - 128) * s[j];
    }
  }
}

void kv_widen_values(KvType t, const uint8_t* rows, size_t row_stride, int64_t n, int64_t dv, float* out) {
  if (t == KvType::f16 && row_stride == size_t(dv) * 2) {  // contiguous rows: one call
    cpu_kernels().half_to_float(reinterpret_cast<const uint16_t*>(rows), out, n * dv);
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* r = rows + size_t(j) * row_stride;
    float* y = out + j * dv;
    if (t == KvType::f32) std::memcpy(y, r, size_t(dv) * 4);
    else if (t == KvType::f16) cpu_kernels().half_to_float(reinterpret_cast<const uint16_t*>(r), y, dv);
    else ref::dequantize_row_q8_0(reinterpret_cast<const block_q8_0*>(r), y, dv);
  }
}

void kv_query(KvType t, const float* q, int rows, int64_t dk, float* out) {
  if (t != KvType::q8_0) {
    if (out != q) std::copy(q, q + rows * dk, out);
    return;
  }
  int8_t qi[kAttendQ8MaxDim];
  float d[kAttendQ8MaxDim / 32];
  int32_t off[kAttendQ8MaxDim / 32];
  for (int r = 0; r < rows; ++r) {  // a row read whole before it is written: in place is fine
    kv_quantize_query(q + r * dk, 1, dk, qi, d, off);
    for (int64_t i = 0; i < dk; ++i) out[r * dk + i] = d[i / 32] * float(qi[i]);
  }
}

void kv_quantize_query(const float* q, int rows, int64_t dk, int8_t* qi, float* d, int32_t* off) {
  const QuantizeRowFn quantize = cpu_kernels().quantize(GgmlType::q8_0);  // each ISA's: bit-identical
  block_q8_0 b[8];
  const int64_t ng = dk / 32;
  for (int r = 0; r < rows; ++r)
    for (int64_t g0 = 0; g0 < ng; g0 += 8) {
      const int64_t n = std::min<int64_t>(8, ng - g0);
      quantize(q + r * dk + g0 * 32, b, n * 32);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t g = g0 + i;
        int32_t sum = 0;
        for (int e = 0; e < 32; ++e) sum += (qi[r * dk + g * 32 + e] = b[i].qs[e]);
        d[r * ng + g] = fp16_to_f32(b[i].d);
        off[r * ng + g] = -128 * sum;
      }
    }
}

namespace {

// The reference: each key's score and value widened one at a time, the running state updated
// per key block (the same (m, l) steps as the SIMD kernels).
void attend_ref(KvType t, const AttendArgs& a) {
  const int64_t kb = kKvKeyBlock;
  std::vector<float> kf(size_t(a.dk * kb)), vf(size_t(kb * a.dv));
  std::vector<float> q(size_t(a.rows * a.dk));
  kv_query(t, a.q, a.rows, a.dk, q.data());
  float s[kKvKeyBlock];
  for (int64_t j0 = 0; j0 < a.n; j0 += kb) {
    const int64_t lo = std::max<int64_t>(a.first - j0, 0), hi = std::min<int64_t>(a.n - j0, kb);
    if (lo >= hi) continue;
    kv_widen_keys(t, a.k + size_t(j0 / kb) * a.k_block_stride, a.dk, kf.data());
    kv_widen_values(t, a.v + size_t(j0 + lo) * a.v_row_stride, a.v_row_stride, hi - lo, a.dv, vf.data());
    for (int r = 0; r < a.rows; ++r) {
      float mx = -INFINITY;
      for (int64_t j = lo; j < hi; ++j) {
        float acc = 0;
        for (int64_t d = 0; d < a.dk; ++d) acc += q[size_t(r * a.dk + d)] * kf[size_t(d * kb + j)];
        s[j] = acc;
        mx = std::max(mx, acc);
      }
      const float m_new = std::max(a.m[r], mx);
      const float corr = a.m[r] == -INFINITY ? 0.0f : std::exp(a.m[r] - m_new);
      float sum = 0;
      for (int64_t j = lo; j < hi; ++j) sum += (s[j] = std::exp(s[j] - m_new));
      a.l[r] = a.l[r] * corr + sum;
      a.m[r] = m_new;
      float* o = a.o + r * a.dv;
      for (int64_t i = 0; i < a.dv; ++i) {
        float acc = o[i] * corr;
        for (int64_t j = lo; j < hi; ++j) acc += s[j] * vf[size_t((j - lo) * a.dv + i)];
        o[i] = acc;
      }
    }
  }
}

}  // namespace

namespace detail {
void add_attend_ref(AttendFn* attend) {
  attend[size_t(KvType::f32)] = [](const AttendArgs& a) { attend_ref(KvType::f32, a); };
  attend[size_t(KvType::f16)] = [](const AttendArgs& a) { attend_ref(KvType::f16, a); };
  attend[size_t(KvType::q8_0)] = [](const AttendArgs& a) { attend_ref(KvType::q8_0, a); };
}
}  // namespace detail

}  // namespace strata::cpu
