#include "engine/text_stream.h"

#include <algorithm>

namespace strata {
namespace {

// Bytes of `text` that form complete UTF-8 sequences (a trailing partial one is left out).
size_t complete_utf8_prefix(const std::string& text) {
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const unsigned char c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0xC0) {
      const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
      return back < need ? text.size() - back : text.size();
    }
    if ((c & 0x80) == 0) break;
  }
  return text.size();
}

}  // namespace

std::string_view TextStream::push(std::string_view piece) {
  if (stopped_) return {};
  text_ += piece;
  size_t end = complete_utf8_prefix(text_);
  for (const std::string& st : stop_) {
    if (st.empty()) continue;
    const size_t from = emitted_ > st.size() ? emitted_ - st.size() : 0;
    const size_t at = text_.find(st, from);
    if (at != std::string::npos) {
      text_.resize(at);
      end = at;
      stopped_ = true;
    }
  }
  // hold back a tail that is a prefix of a stop string
  size_t hold = 0;
  if (!stopped_) {
    for (const std::string& st : stop_)
      for (size_t k = std::min(st.empty() ? 0 : st.size() - 1, end); k > hold; --k)
        if (text_.compare(end - k, k, st, 0, k) == 0) hold = k;
  }
  const size_t from = emitted_;
  if (end - hold > emitted_) emitted_ = end - hold;
  return std::string_view(text_).substr(from, emitted_ - from);
}

std::string_view TextStream::flush() {
  const size_t from = emitted_;
  emitted_ = text_.size();
  return std::string_view(text_).substr(from);
}

}  // namespace strata
