#include "engine/session.h"

#include <cinttypes>

#include "model/forward.h"

namespace strata {

Session::Session(const Model& model, int n_ctx, cpu::MatmulPath path)
    : model_(model), backend_(path) {
  init_cache(model, n_ctx, cache_);
}

Result<std::vector<float>> Session::eval(std::span<const int32_t> tokens, bool all_logits) {
  const HParams& hp = model_.hparams();
  if (tokens.empty()) return Error{"eval: no tokens"};
  for (int32_t id : tokens) {
    if (id < 0 || id >= hp.n_vocab)
      return Error{strfmt("eval: token id %d is outside the vocabulary (0..%d)", id, hp.n_vocab - 1)};
  }
  const int64_t n = int64_t(tokens.size());
  if (n_past_ + n > cache_.n_ctx) {
    return Error{strfmt("eval: context full: %" PRId64 " tokens cached + %" PRId64 " new > context %d",
                        n_past_, n, cache_.n_ctx)};
  }
  std::vector<float> logits(size_t((all_logits ? n : 1) * hp.n_vocab));
  switch (hp.arch) {
    case Arch::qwen3moe:
    case Arch::qwen2moe:
    case Arch::llama:
      forward_gqa_moe(model_, backend_, cache_, tokens.data(), n, n_past_, all_logits, logits.data());
      break;
    case Arch::deepseek2:
      forward_deepseek2(model_, backend_, cache_, tokens.data(), n, n_past_, all_logits, logits.data());
      break;
    case Arch::gpt_oss:
      forward_gpt_oss(model_, backend_, cache_, tokens.data(), n, n_past_, all_logits, logits.data());
      break;
  }
  n_past_ += n;
  return logits;
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[size_t(best)]) best = int32_t(i);
  return best;
}

}  // namespace strata
