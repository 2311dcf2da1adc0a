// deepseek41's Engram rows (HParams::engram, fixtures README): which rows of an Engram layer's
// table a position reads. They depend on the token ids alone, so a tier can read them before the
// layer runs (model/experts.h EngramRows).
#pragma once

#include <cstdint>

#include "model/model.h"

namespace strata {

// The rows (e.rows_per_token() of them, order 2 heads first) Engram slot `slot` reads for position p
// of a sequence whose compressed ids are c[0..p]: out[(n - 2) * n_head + h] for order n, head h.
// Positions before the sequence's start hash as e.pad_id.
void engram_row_ids(const EngramParams& e, int slot, const int32_t* c, int64_t p, int64_t* out);

}  // namespace strata
