#include "engine/engram_tier.h"

#include "cpu/quant_traits.h"

namespace strata {

std::vector<RowTable> engram_tables(const Model& m) {
  std::vector<RowTable> tables;
  const uint8_t* file = m.file().bytes_.data();
  for (int il : m.hparams().engram.layers) {
    const Weight& w = m.layers[size_t(il)].engram_embd;
    STRATA_CHECK(!w.interleaved && w.data >= file, "a streamed Engram table stays in the file's layout");
    tables.push_back({uint64_t(w.data - file), uint64_t(w.n_out), uint32_t(w.row_bytes)});
  }
  return tables;
}

void StreamedEngram::prefetch(int il, std::span<const int64_t> rows) {
  store_.prefetch(model_.hparams().engram.slot(il), rows);
}

bool StreamedEngram::gather(const LayerWeights& l, int il, std::span<const int64_t> rows, float* out) {
  const Weight& w = l.engram_embd;
  thread_local std::vector<uint8_t> bytes;
  bytes.resize(rows.size() * w.row_bytes);
  if (!store_.gather(model_.hparams().engram.slot(il), rows, bytes.data(), il)) return false;
  const QuantTraits& qt = quant_traits(w.type);
  for (size_t i = 0; i < rows.size(); ++i) qt.dequantize_row(bytes.data() + i * w.row_bytes, out + int64_t(i) * w.n_in, w.n_in);
  return true;
}

}  // namespace strata
