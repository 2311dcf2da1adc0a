// Per-layer attention cache. Positions are appended in order; rows never move. GQA caches hold
// float, IEEE half or q8_0 entries (cpu::KvType, layouts in cpu/kernels.h; half by default on the
// quantized path, as llama.cpp's default cache: half the memory and half the bytes each decoded
// token reads; q8_0 about half of that again); MLA's latent rows are float.
//
// K has two layouts. By position (k_row): [n_ctx][k_width], for MLA's latent rows. Transposed in
// blocks of kKeyBlock positions (GQA caches, k_heads > 0): [k_heads][n_ctx / kKeyBlock][head_dim]
// [kKeyBlock], so the scores of a block of queries against a block of keys are one float GEMM
// (Q [rows][head_dim] x K^T [head_dim][kKeyBlock]) over 16 contiguous KiB, in prefill and decode
// alike, with no transpose.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/error.h"
#include "cpu/kernels.h"
#include "cpu/kv_format.h"

namespace strata {

using KvType = cpu::KvType;

struct KvCache {
  KvCache() = default;
  KvCache(const KvCache&) = delete;  // uid names one set of rows
  KvCache& operator=(const KvCache&) = delete;
  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;

  // Names these rows for a device backend's copy of them (CudaBackend's KV mirror); new at each
  // init, so a cache that reuses another's memory is never taken for it.
  uint64_t uid = 0;
  KvType type = KvType::f32;
  int n_ctx = 0;
  int k_width = 0;  // floats per position of k (GQA: n_head_kv * head_dim; MLA: kv_lora + rope)
  int v_width = 0;  // floats per position of v (0 when v is derived from k, as in MLA)
  int k_heads = 0;  // > 0: K stored by dimension (k_col), k_width = k_heads * head dim
  std::vector<std::vector<float>> k;  // [layer][n_ctx][k_width] (f32)
  std::vector<std::vector<float>> v;  // [layer][k_heads][n_ctx][v_width / k_heads] (GQA only, f32)
  std::vector<std::vector<uint16_t>> k16, v16;  // the same layouts in half (GQA, KvType::f16)
  std::vector<std::vector<uint8_t>> kq, vq;      // the same layouts in q8_0 (GQA, KvType::q8_0)

  // deepseek4's compressed attention, per layer (ratio 0: unused). A compressor keeps the (a, s)
  // rows of the tokens its next block pools in a ring (token p in slot p mod slots: 2 x ratio
  // slots for ratio 4, whose blocks also pool the previous block, ratio slots for 128); a block's
  // row is appended when its last token is processed and never changes. The indexer's keys (ratio
  // 4) are built the same way from their own ring.
  struct Compressor {
    int slots = 0, pool_width = 0, width = 0;  // ring slots, values per (a, s), row width
    std::vector<float> ring_a, ring_s;         // [slots][pool_width]
    std::vector<float> rows;                   // [n_ctx / ratio][width]
  };
  struct CompressedLayer {
    int ratio = 0;
    Compressor attn, index;
  };
  std::vector<CompressedLayer> compressed;
  // deepseek41's Engram: the compressed token id of every position (its n-gram hashes read the
  // ids before it)
  std::vector<int32_t> engram_ids;  // [n_ctx]

  // Layers below `first` get no rows (a cache of the multi-token-prediction layer alone).
  void init(int n_layer, int ctx, int kw, int vw, int first = 0) {
    uid = next_uid();
    type = KvType::f32;
    n_ctx = ctx;
    k_width = kw;
    v_width = vw;
    k.assign(size_t(n_layer), {});
    v.assign(size_t(n_layer), {});
    for (int il = first; il < n_layer; ++il) {
      k[size_t(il)].resize(size_t(ctx) * size_t(kw));
      v[size_t(il)].resize(size_t(ctx) * size_t(vw));
    }
  }
  static constexpr int kKeyBlock = int(cpu::kKvKeyBlock);
  // K stored in transposed key blocks, GQA: n_head_kv heads of head_dim floats per position.
  void init_key_blocks(int n_layer, int ctx, int n_head_kv, int head_dim, int vw, KvType t = KvType::f32,
                       int first = 0) {
    const int padded = (ctx + kKeyBlock - 1) / kKeyBlock * kKeyBlock;
    uid = next_uid();
    type = t;
    n_ctx = ctx;
    k_width = n_head_kv * head_dim;
    v_width = vw;
    k_heads = n_head_kv;
    const size_t nk = size_t(padded) * size_t(k_width), nv = size_t(ctx) * size_t(vw);
    k.clear();
    v.clear();
    k16.clear();
    v16.clear();
    kq.clear();
    vq.clear();
    if (t == KvType::q8_0) {
      const int64_t dv = vw / n_head_kv;
      const size_t kbytes = size_t(n_head_kv) * (size_t(padded) / kKeyBlock) * cpu::kv_key_block_bytes(t, head_dim);
      // one row more: the attend kernels may read the row after a range's last (AttendArgs::v)
      const size_t vbytes = (size_t(n_head_kv) * size_t(ctx) + 1) * cpu::kv_value_row_bytes(t, dv);
      kq.resize(size_t(n_layer));
      vq.resize(size_t(n_layer));
      for (int il = first; il < n_layer; ++il) {
        kq[size_t(il)].resize(kbytes);
        vq[size_t(il)].resize(vbytes);
      }
    } else if (t == KvType::f16) {
      k16.resize(size_t(n_layer));
      v16.resize(size_t(n_layer));
      for (int il = first; il < n_layer; ++il) {
        k16[size_t(il)].resize(nk);
        v16[size_t(il)].resize(nv);
      }
    } else {
      k.resize(size_t(n_layer));
      v.resize(size_t(n_layer));
      for (int il = first; il < n_layer; ++il) {
        k[size_t(il)].resize(nk);
        v[size_t(il)].resize(nv);
      }
    }
  }
  uint8_t* layer_k(int layer) {
    const size_t L = size_t(layer);
    return type == KvType::q8_0 ? kq[L].data()
           : type == KvType::f16 ? reinterpret_cast<uint8_t*>(k16[L].data())
                                 : reinterpret_cast<uint8_t*>(k[L].data());
  }
  uint8_t* layer_v(int layer) {
    const size_t L = size_t(layer);
    return type == KvType::q8_0 ? vq[L].data()
           : type == KvType::f16 ? reinterpret_cast<uint8_t*>(v16[L].data())
                                 : reinterpret_cast<uint8_t*>(v[L].data());
  }
  static uint64_t next_uid() {
    static std::atomic<uint64_t> n{0};
    return ++n;
  }
  // Bytes of cache per position, all layers.
  size_t bytes_per_position() const {
    if (type == KvType::q8_0) {
      const int64_t dk = k_width / k_heads, dv = v_width / k_heads;
      return kq.size() * size_t(k_heads) *
             (cpu::kv_key_block_bytes(type, dk) / size_t(kKeyBlock) + cpu::kv_value_row_bytes(type, dv));
    }
    const size_t layers = type == KvType::f16 ? k16.size() : k.size();
    return layers * size_t(k_width + v_width) * (type == KvType::f16 ? 2 : 4);
  }
  // Any entry type (GQA caches): key block `block` of head `head` as bytes, and the bytes from
  // one key block to the next; value row `pos` of head `head`, and the bytes between rows.
  size_t k_block_stride() const { return cpu::kv_key_block_bytes(type, k_width / k_heads); }
  size_t v_row_stride() const { return cpu::kv_value_row_bytes(type, v_width / k_heads); }
  uint8_t* k_block_bytes(int layer, int head, int64_t block) {
    const size_t n_blocks = (size_t(n_ctx) + kKeyBlock - 1) / kKeyBlock;
    return layer_k(layer) + (size_t(head) * n_blocks + size_t(block)) * k_block_stride();
  }
  uint8_t* v_row_bytes(int layer, int head, int64_t pos) {
    return layer_v(layer) + (size_t(head) * size_t(n_ctx) + size_t(pos)) * v_row_stride();
  }
  float* k_row(int layer, int64_t pos) { return k[size_t(layer)].data() + size_t(pos) * size_t(k_width); }
  // The key block holding positions [block * kKeyBlock, +kKeyBlock) of head `head`:
  // [head_dim][kKeyBlock] floats, element (d, pos % kKeyBlock).
  size_t k_block_offset(int head, int64_t block) const {
    const size_t head_dim = size_t(k_width / k_heads);
    const size_t n_blocks = (size_t(n_ctx) + kKeyBlock - 1) / kKeyBlock;
    return ((size_t(head) * n_blocks + size_t(block)) * head_dim) * kKeyBlock;
  }
  float* k_block(int layer, int head, int64_t block) {
    STRATA_CHECK(type == KvType::f32);
    return k[size_t(layer)].data() + k_block_offset(head, block);
  }
  uint16_t* k_block16(int layer, int head, int64_t block) {
    STRATA_CHECK(type == KvType::f16);
    return k16[size_t(layer)].data() + k_block_offset(head, block);
  }
  // V by head (GQA caches): [k_heads][n_ctx][head_dim_v]; the rows one head attends over are
  // contiguous. Element (pos, i) of head h: v_head(layer, h)[pos * head_dim_v + i].
  float* v_head(int layer, int head) {
    STRATA_CHECK(type == KvType::f32);
    return v[size_t(layer)].data() + size_t(head) * size_t(n_ctx) * size_t(v_width / k_heads);
  }
  uint16_t* v_head16(int layer, int head) {
    STRATA_CHECK(type == KvType::f16);
    return v16[size_t(layer)].data() + size_t(head) * size_t(n_ctx) * size_t(v_width / k_heads);
  }
};

}  // namespace strata
