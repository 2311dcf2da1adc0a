// The entries of a GQA KV cache in each KvType (cpu/kernels.h states the layouts): their sizes,
// writing one key or value row into them, and widening them back to floats (prefill's attention
// reads a block at a time through these; decode's reads them in the attend kernels).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/kernels.h"

namespace strata::cpu {

// Bytes of one transposed key block (kKvKeyBlock keys of dk dims) and of one value row (dv).
size_t kv_key_block_bytes(KvType t, int64_t dk);
size_t kv_value_row_bytes(KvType t, int64_t dv);
// Whether a cache of type t can hold heads of these dims (q8_0: multiples of 32, keys of at most
// kAttendQ8MaxDim dims).
bool kv_type_fits(KvType t, int64_t dk, int64_t dv);
// "f32", "f16", "q8_0".
const char* kv_type_name(KvType t);

// Writes key k[dk] as entry `slot` (< kKvKeyBlock) of a key block; q8_0 quantizes each group of
// 32 dims as ggml's reference quantize_row_q8_0 does (scale amax / 127 in half, round to nearest).
void kv_store_key(KvType t, const float* k, int64_t dk, uint8_t* block, int64_t slot);
// Writes value row v[dv].
void kv_store_value(KvType t, const float* v, int64_t dv, uint8_t* row);
// A key block as floats, [dk][kKvKeyBlock].
void kv_widen_keys(KvType t, const uint8_t* block, int64_t dk, float* out);
// out [rows][dk] = the query rows q as the attend kernels multiply them with keys of type t: q8_0
// keys take the query quantized to q8_0 (kv_quantize_query, here widened back; dk at most
// kAttendQ8MaxDim); other types take it as it is. out may be q.
void kv_query(KvType t, const float* q, int rows, int64_t dk, float* out);
// The query rows [rows][dk] prepared for q8_0 keys (kernels.h QueryQ8View): qi [rows][dk], d and
// off [rows][dk / 32]. dk a multiple of 32.
void kv_quantize_query(const float* q, int rows, int64_t dk, int8_t* qi, float* d, int32_t* off);
// n value rows (row_stride bytes apart) as floats, [n][dv].
void kv_widen_values(KvType t, const uint8_t* rows, size_t row_stride, int64_t n, int64_t dv, float* out);

}  // namespace strata::cpu
