// Constrained generation of one JSON object (RFC 8259), what a forced tool call's arguments are
// held to (tool_choice "required" or a named function, docs/server.md): an incremental check that
// the text so far is a prefix of a JSON object, byte by byte, and the shortest text that completes
// it (a sequence out of tokens closes its object rather than leaving it broken).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

class Tokenizer;

class JsonPrefix {
 public:
  // Appends `text` when the result is still a prefix of one JSON object (whitespace before it
  // allowed, nothing after it closes; strings well-formed UTF-8, a character possibly split
  // between pushes); else returns false and stays as it was.
  bool push(std::string_view text);
  // The top-level object is closed.
  bool complete() const { return state_ == State::done; }
  // The shortest text after which complete() holds (empty when it does).
  std::string closing() const;

 private:
  enum class State : uint8_t {
    start,          // before the object: whitespace, then '{'
    key_or_end,     // after '{': '"' or '}'
    key,            // after ',' in an object: '"'
    colon,          // after a key
    value,          // after ':' or ',' in an array
    value_or_end,   // after '[': a value or ']'
    string,         // inside a string (key_ tells which)
    utf8,           // inside a multi-byte UTF-8 character of a string (utf8_left_ bytes to go)
    escape,         // after '\'
    unicode,        // inside \uXXXX (hex_left digits to go)
    number,         // inside a number (num_ tells where)
    literal,        // inside true / false / null (literal_ is what is left)
    after_value,    // ',' or the container's end
    done,
  };
  enum class Num : uint8_t { minus, zero, digits, dot, frac, exp, exp_sign, exp_digits };
  bool step(char c);
  State state_ = State::start;
  std::vector<char> stack_;  // open containers: '{' or '['
  bool key_ = false;
  int hex_left_ = 0;
  int utf8_left_ = 0;
  unsigned char utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the range of the next continuation byte
  Num num_ = Num::digits;
  std::string_view literal_;
};

// The logits of the tokens that would break `json` set to -inf, so that sampling keeps the text a
// JSON object prefix; end-of-generation and control tokens are refused too (the object must close
// first). Candidates are tried in logit order, the best `keep` valid ones kept (at most
// `max_tries` looked at). Returns false when no candidate is valid: the caller closes the object
// with closing().
bool constrain_to_json(std::span<float> logits, const JsonPrefix& json, const Tokenizer& tok, bool special_text,
                       int keep = 40, int max_tries = 4096);

}  // namespace strata
