// libFuzzer target: any bytes into the GGUF reader. It must return a file or an Error, never
// crash, hang or read out of bounds; a parsed file's tensor data must lie inside the input, and
// what is built on the reader (model summary, tokenizer, model loading) must hold up on it too.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "model/gguf.h"
#include "model/model.h"
#include "model/model_info.h"
#include "model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // an exact-size copy so ASan sees reads one past the end
  std::vector<uint8_t> bytes(data, data + size);
  auto f = strata::GgufFile::parse(bytes, "fuzz");
  if (!f.ok()) {
    if (f.error().message.empty()) __builtin_trap();  // every error says something
    return 0;
  }
  uint64_t sum = 0;
  for (const auto& t : f->tensors()) {
    auto d = f->tensor_data(t);
    if (d.size() != t.n_bytes) __builtin_trap();
    if (!d.empty()) sum += d.front() + d.back();  // touch both ends
  }
  for (const auto& kv : f->kvs()) sum += kv.value.to_display_string().size();
  auto s = strata::summarize_model(*f);
  if (s.ok()) sum += s->active_bytes_per_token;
  auto t = strata::Tokenizer::from_gguf(*f);
  if (t.ok()) sum += t->n_tokens();
  auto m = strata::Model::load(std::move(*f));  // hparams and every weight's shape and type
  if (m.ok()) sum += (*m)->layers.size();
  volatile uint64_t sink = sum;
  (void)sink;
  return 0;
}
