#include "model/engram.h"

#include "cpu/ops.h"
#include "model/experts.h"

namespace strata {

void engram_row_ids(const EngramParams& e, int slot, const int32_t* c, int64_t p, int64_t* out) {
  const int per = e.rows_per_token();
  const uint64_t* mult = e.multipliers.data() + size_t(slot) * size_t(e.max_ngram);
  const uint64_t* prime = e.primes.data() + size_t(slot) * size_t(per);
  const uint64_t* offset = e.offsets.data() + size_t(slot) * size_t(per);
  // the running XOR after shift k is the hash of the (k + 1)-gram ending at p; unsigned
  // arithmetic wraps as the reference's 64-bit integers do (its multipliers keep every product
  // below 2^63, so the sign never matters)
  uint64_t r = 0;
  for (int k = 0; k < e.max_ngram; ++k) {
    const uint64_t id = p >= k ? uint64_t(uint32_t(c[p - k])) : uint64_t(uint32_t(e.pad_id));
    r = k == 0 ? id * mult[0] : r ^ (id * mult[k]);
    if (k == 0) continue;
    for (int h = 0; h < e.n_head; ++h) {
      const int col = (k - 1) * e.n_head + h;
      out[col] = int64_t(r % prime[col] + offset[col]);
    }
  }
}

bool ResidentEngram::gather(const LayerWeights& l, int, std::span<const int64_t> rows, float* out) {
  const int64_t width = l.engram_embd.n_in;
  for (size_t i = 0; i < rows.size(); ++i) cpu::get_row(l.engram_embd, rows[i], out + int64_t(i) * width);
  return true;
}

EngramRows& resident_engram() {
  static ResidentEngram engram;
  return engram;
}

}  // namespace strata
