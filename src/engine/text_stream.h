// Generated text as it becomes final: token pieces are appended, and what is passed on is held back
// only while it is an incomplete UTF-8 sequence or may still turn into a stop string. A stop string
// ends the text before it. Used by generate() and by every sequence of the server.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop = {}) : stop_(std::move(stop)) {}

  // Appends one token's text; returns the text that became final with it (maybe empty). After a
  // stop string, stopped() is true and the text ends before it.
  std::string_view push(std::string_view piece);
  // The rest, held back until now (at the end of generation).
  std::string_view flush();

  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }

 private:
  std::vector<std::string> stop_;
  std::string text_;
  size_t emitted_ = 0;  // bytes of text_ passed on
  bool stopped_ = false;
};

}  // namespace strata
