// Output quality the way llama-perplexity measures it: perplexity over non-overlapping chunks of
// n_ctx tokens, each scored on its second half (the tokens after position n_ctx / 2, so every
// scored token sees at least half a context), and the divergence of the token distributions from a
// reference: the same model on strata's exact float path in the same run (kl_exact), or base
// log-probabilities written to a file by an earlier run (kl_base, e.g. of the F32 model).
//
// Per scored token t, with p the reference distribution and q the one under test:
//   KL(p || q) = sum_v p_v (log p_v - log q_v)       mean, its standard error, percentiles
//   top-1      argmax p == argmax q                   the fraction that agree
//   delta-p    q(token) - p(token) of the true token  its RMS
// As llama.cpp does, a vocabulary that adds BOS gets it as each chunk's first token (options.bos).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "base/error.h"
#include "cpu/ops.h"

namespace strata {

class Engine;

struct PerplexityOptions {
  int n_ctx = 512;
  int max_chunks = 0;  // 0: every whole chunk of the text
  cpu::MatmulPath path = cpu::MatmulPath::quantized;
  bool kl_exact = false;     // reference: the exact path, in the same run
  std::string kl_base;       // reference file: read when it exists, else written by this run
  int32_t bos = -1;          // >= 0: replaces each chunk's first token (vocabularies that add BOS)
};

struct KlStats {
  double ppl_ref = 0;              // perplexity of the reference on the same tokens
  double mean = 0, mean_err = 0;   // KL divergence, nats
  double median = 0, p90 = 0, p99 = 0, max = 0;
  double top1 = 0;                 // fraction of scored tokens whose argmax agrees
  double rms_dp = 0;               // RMS of delta-p (a probability, 0..1)
};

struct PerplexityResult {
  double ppl = 0, ppl_err = 0;  // exp(mean NLL) and its standard error (first order)
  int n_chunks = 0;
  int64_t n_scored = 0;
  std::optional<KlStats> kl;    // with a reference
  bool wrote_base = false;      // kl_base did not exist: this run wrote it
};

// chunk (1-based), n_chunks, the perplexity so far.
using PerplexityProgress = std::function<void(int chunk, int n_chunks, double ppl)>;

// Errors: fewer tokens than one chunk, n_ctx < 8 or above the model's context, a base file that
// cannot be read or was written for other tokens, vocabulary or n_ctx (it says which).
Result<PerplexityResult> perplexity(const Engine& engine, std::span<const int32_t> tokens,
                                    const PerplexityOptions& options, const PerplexityProgress& progress = nullptr);

}  // namespace strata
