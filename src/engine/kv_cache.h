// Per-layer attention cache in float. Positions are appended in order; rows never move.
//
// K has two layouts. By position (k_row): [n_ctx][k_width], for MLA's latent rows. Transposed in
// blocks of kKeyBlock positions (GQA caches, k_heads > 0): [k_heads][n_ctx / kKeyBlock][head_dim]
// [kKeyBlock], so the scores of a block of queries against a block of keys are one float GEMM
// (Q [rows][head_dim] x K^T [head_dim][kKeyBlock]) over 16 contiguous KiB, in prefill and decode
// alike, with no transpose.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata {

struct KvCache {
  int n_ctx = 0;
  int k_width = 0;  // floats per position of k (GQA: n_head_kv * head_dim; MLA: kv_lora + rope)
  int v_width = 0;  // floats per position of v (0 when v is derived from k, as in MLA)
  int k_heads = 0;  // > 0: K stored by dimension (k_col), k_width = k_heads * head dim
  std::vector<std::vector<float>> k;  // [layer][n_ctx][k_width]
  std::vector<std::vector<float>> v;  // [layer][k_heads][n_ctx][v_width / k_heads] (GQA only)

  void init(int n_layer, int ctx, int kw, int vw) {
    n_ctx = ctx;
    k_width = kw;
    v_width = vw;
    k.assign(size_t(n_layer), std::vector<float>(size_t(ctx) * size_t(kw)));
    v.assign(size_t(n_layer), std::vector<float>(size_t(ctx) * size_t(vw)));
  }
  static constexpr int kKeyBlock = 32;
  // K stored in transposed key blocks, GQA: n_head_kv heads of head_dim floats per position.
  void init_key_blocks(int n_layer, int ctx, int n_head_kv, int head_dim, int vw) {
    const int padded = (ctx + kKeyBlock - 1) / kKeyBlock * kKeyBlock;
    n_ctx = ctx;
    k_width = n_head_kv * head_dim;
    v_width = vw;
    k_heads = n_head_kv;
    k.assign(size_t(n_layer), std::vector<float>(size_t(padded) * size_t(k_width)));
    v.assign(size_t(n_layer), std::vector<float>(size_t(ctx) * size_t(vw)));
  }
  float* k_row(int layer, int64_t pos) { return k[size_t(layer)].data() + size_t(pos) * size_t(k_width); }
  // The key block holding positions [block * kKeyBlock, +kKeyBlock) of head `head`:
  // [head_dim][kKeyBlock] floats, element (d, pos % kKeyBlock).
  float* k_block(int layer, int head, int64_t block) {
    const size_t head_dim = size_t(k_width / k_heads);
    const size_t n_blocks = (size_t(n_ctx) + kKeyBlock - 1) / kKeyBlock;
    return k[size_t(layer)].data() + ((size_t(head) * n_blocks + size_t(block)) * head_dim) * kKeyBlock;
  }
  // V by head (GQA caches): [k_heads][n_ctx][head_dim_v]; the rows one head attends over are
  // contiguous. Element (pos, i) of head h: v_head(layer, h)[pos * head_dim_v + i].
  float* v_head(int layer, int head) {
    return v[size_t(layer)].data() + size_t(head) * size_t(n_ctx) * size_t(v_width / k_heads);
  }
};

}  // namespace strata
