// Per-layer attention cache in float. Positions are appended in order; rows never move.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata {

struct KvCache {
  int n_ctx = 0;
  int k_width = 0;  // floats per position of k (GQA: n_head_kv * head_dim; MLA: kv_lora + rope)
  int v_width = 0;  // floats per position of v (0 when v is derived from k, as in MLA)
  std::vector<std::vector<float>> k;  // [layer][n_ctx][k_width]
  std::vector<std::vector<float>> v;  // [layer][n_ctx][v_width]

  void init(int n_layer, int ctx, int kw, int vw) {
    n_ctx = ctx;
    k_width = kw;
    v_width = vw;
    k.assign(size_t(n_layer), std::vector<float>(size_t(ctx) * size_t(kw)));
    v.assign(size_t(n_layer), std::vector<float>(size_t(ctx) * size_t(vw)));
  }
  float* k_row(int layer, int64_t pos) { return k[size_t(layer)].data() + size_t(pos) * size_t(k_width); }
  float* v_row(int layer, int64_t pos) { return v[size_t(layer)].data() + size_t(pos) * size_t(v_width); }
};

}  // namespace strata
