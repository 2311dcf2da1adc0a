#include "cpu/onednn_matmul.h"

#if STRATA_HAVE_ONEDNN
#include <omp.h>

#include <cstring>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "cpu/thread_pool.h"
#endif

namespace strata::cpu {

#if STRATA_HAVE_ONEDNN

namespace {

struct Onednn {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
};

Onednn& onednn() {
  static Onednn o = [] {
    omp_set_num_threads(compute_pool().size());
    return Onednn{};
  }();
  return o;
}

// Round to nearest even (finite inputs; NaN stays NaN).
inline uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((b >> 16) | 0x40);
  return uint16_t((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

}  // namespace

bool onednn_available() { return true; }

bool onednn_bf16_supported() {
  static const bool ok = [] {
    using namespace dnnl;
    try {
      const memory::dim M = kOnednnMinTokens, K = 256, N = 64;
      const memory::desc src_md({M, K}, memory::data_type::bf16, memory::dims{K, 1});
      const memory::desc wei_md({K, N}, memory::data_type::bf16, memory::dims{1, K});
      const memory::desc dst_md({M, N}, memory::data_type::f32, memory::dims{N, 1});
      const matmul::primitive_desc pd(matmul::desc(src_md, wei_md, dst_md), onednn().eng);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

bool onednn_matmul_bf16(const Weight& w, const float* x, int64_t n_tok, float* y, int64_t ldy) {
  using namespace dnnl;
  if (!onednn_bf16_supported()) return false;  // asked once, not by an exception per matmul
  // row-interleaved weights (cpu/repack.h) are oneDNN's BA16a16b2a, but its kernels read that no
  // faster than strata's own interleaved tile (2048 x 768: 255 / 221 GFLOP/s at 64 / 512 tokens,
  // against 414 / 537 on the file layout, whose own preferred layout is BA16a64b2a): not used
  if (w.type != GgmlType::bf16 || w.interleaved || w.n_mat != 1 || n_tok <= 0) return false;
  Onednn& o = onednn();
  const memory::dim M = n_tok, K = w.n_in, N = w.n_out;
  const memory::dim row_elems = memory::dim(w.row_bytes / 2);
  try {
    const memory::desc src_md({M, K}, memory::data_type::bf16, memory::dims{K, 1});
    const memory::desc wei_md({K, N}, memory::data_type::bf16, memory::dims{1, row_elems});  // W^T, rows of W
    const memory::desc dst_md({M, N}, memory::data_type::f32, memory::dims{ldy, 1});
    // oneDNN keeps created primitives in its own cache: a shape seen before costs a lookup
    const matmul::primitive_desc pd(matmul::desc(src_md, wei_md, dst_md), o.eng);
    thread_local std::vector<uint16_t> xb;
    xb.resize(size_t(M * K));
    for (size_t i = 0; i < xb.size(); ++i) xb[i] = to_bf16(x[i]);
    memory src(src_md, o.eng, xb.data());
    memory wei(wei_md, o.eng, const_cast<uint8_t*>(w.data));
    memory dst(dst_md, o.eng, y);
    matmul(pd).execute(o.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    o.strm.wait();
  } catch (const dnnl::error&) {
    return false;
  }
  return true;
}

#else

bool onednn_available() { return false; }
bool onednn_bf16_supported() { return false; }
bool onednn_matmul_bf16(const Weight&, const float*, int64_t, float*, int64_t) { return false; }

#endif

}  // namespace strata::cpu
