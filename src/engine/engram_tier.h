// deepseek41's Engram tables on the NVMe tier: the forward pass's EngramRows (model/experts.h)
// over a RowStore (storage/row_store.h) that reads the tables' rows from the model file into a RAM
// row cache. Each Engram layer's engram_embd is one row table; rows arrive in the file's type and
// are dequantized here.
#pragma once

#include <memory>
#include <vector>

#include "model/experts.h"
#include "model/model.h"
#include "storage/row_store.h"

namespace strata {

// The Engram tables of a model loaded with streamed weights (engram_embd left in the file), in
// slot order (HParams::engram.layers).
std::vector<RowTable> engram_tables(const Model& m);

class StreamedEngram final : public EngramRows {
 public:
  StreamedEngram(const Model& m, RowStore& store) : model_(m), store_(store) {}
  void prefetch(int il, std::span<const int64_t> rows) override;
  bool gather(const LayerWeights& l, int il, std::span<const int64_t> rows, float* out) override;

 private:
  const Model& model_;
  RowStore& store_;
};

}  // namespace strata
