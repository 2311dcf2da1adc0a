#include "engine/json_constraint.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/tokenizer.h"

namespace strata {

namespace {
bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
}  // namespace

bool JsonPrefix::push(std::string_view text) {
  JsonPrefix saved = *this;
  for (char c : text) {
    if (!step(c)) {
      *this = std::move(saved);
      return false;
    }
  }
  return true;
}

bool JsonPrefix::step(char c) {
  // the end of a value inside a container: what may follow it
  auto end_value = [&] { state_ = stack_.empty() ? State::done : State::after_value; };
  auto begin_value = [&](char v) {
    switch (v) {
      case '"': key_ = false; state_ = State::string; return true;
      case '{': stack_.push_back('{'); state_ = State::key_or_end; return true;
      case '[': stack_.push_back('['); state_ = State::value_or_end; return true;
      case '-': num_ = Num::minus; state_ = State::number; return true;
      case 't': literal_ = "rue"; state_ = State::literal; return true;
      case 'f': literal_ = "alse"; state_ = State::literal; return true;
      case 'n': literal_ = "ull"; state_ = State::literal; return true;
      default:
        if (!is_digit(v)) return false;
        num_ = v == '0' ? Num::zero : Num::digits;
        state_ = State::number;
        return true;
    }
  };
  auto close = [&](char c2) {
    if (stack_.empty() || stack_.back() != (c2 == '}' ? '{' : '[')) return false;
    stack_.pop_back();
    end_value();
    return true;
  };
  switch (state_) {
    case State::start:
      if (is_ws(c)) return true;
      if (c != '{') return false;
      stack_.push_back('{');
      state_ = State::key_or_end;
      return true;
    case State::key_or_end:
      if (is_ws(c)) return true;
      if (c == '}') return close(c);
      [[fallthrough]];
    case State::key:
      if (is_ws(c)) return true;
      if (c != '"') return false;
      key_ = true;
      state_ = State::string;
      return true;
    case State::colon:
      if (is_ws(c)) return true;
      if (c != ':') return false;
      state_ = State::value;
      return true;
    case State::value_or_end:
      if (is_ws(c)) return true;
      if (c == ']') return close(c);
      return begin_value(c);
    case State::value:
      if (is_ws(c)) return true;
      return begin_value(c);
    case State::string:
      if (c == '"') {
        if (key_) state_ = State::colon;
        else end_value();
        return true;
      }
      if (c == '\\') {
        state_ = State::escape;
        return true;
      }
      {
        // control characters must be escaped; a multi-byte character's lead byte says how many
        // continuation bytes follow and (E0, ED, F0, F4) their first one's range (RFC 3629)
        const auto b = static_cast<unsigned char>(c);
        if (b < 0x80) return b >= 0x20;
        if (b < 0xC2 || b > 0xF4) return false;
        utf8_left_ = b < 0xE0 ? 1 : b < 0xF0 ? 2 : 3;
        utf8_lo_ = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80;
        utf8_hi_ = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
        state_ = State::utf8;
        return true;
      }
    case State::utf8: {
      const auto b = static_cast<unsigned char>(c);
      if (b < utf8_lo_ || b > utf8_hi_) return false;
      utf8_lo_ = 0x80;
      utf8_hi_ = 0xBF;
      if (--utf8_left_ == 0) state_ = State::string;
      return true;
    }
    case State::escape:
      if (c == 'u') {
        hex_left_ = 4;
        state_ = State::unicode;
        return true;
      }
      if (std::string_view("\"\\/bfnrt").find(c) == std::string_view::npos) return false;
      state_ = State::string;
      return true;
    case State::unicode:
      if (!is_hex(c)) return false;
      if (--hex_left_ == 0) state_ = State::string;
      return true;
    case State::literal:
      if (literal_.empty() || c != literal_[0]) return false;
      literal_.remove_prefix(1);
      if (literal_.empty()) end_value();
      return true;
    case State::number:
      switch (num_) {
        case Num::minus:
          if (!is_digit(c)) return false;
          num_ = c == '0' ? Num::zero : Num::digits;
          return true;
        case Num::dot:
          if (!is_digit(c)) return false;
          num_ = Num::frac;
          return true;
        case Num::exp:
          if (c == '+' || c == '-') {
            num_ = Num::exp_sign;
            return true;
          }
          [[fallthrough]];
        case Num::exp_sign:
          if (!is_digit(c)) return false;
          num_ = Num::exp_digits;
          return true;
        case Num::zero:
        case Num::digits:
        case Num::frac:
        case Num::exp_digits:
          if (is_digit(c) && num_ != Num::zero) return true;
          if (c == '.' && (num_ == Num::zero || num_ == Num::digits)) {
            num_ = Num::dot;
            return true;
          }
          if ((c == 'e' || c == 'E') && num_ != Num::exp_digits) {
            num_ = Num::exp;
            return true;
          }
          // the number ended: the character belongs to what follows it
          end_value();
          return state_ != State::done && step(c);
      }
      return false;
    case State::after_value:
      if (is_ws(c)) return true;
      if (c == ',') {
        state_ = stack_.back() == '{' ? State::key : State::value;
        return true;
      }
      if (c == '}' || c == ']') return close(c);
      return false;
    case State::done:
      return false;
  }
  return false;
}

std::string JsonPrefix::closing() const {
  JsonPrefix j = *this;
  std::string out;
  // one character at a time, each the shortest way on from its state; every state has one, and
  // each path closes a container within a few characters, so this ends
  for (int guard = 0; !j.complete() && guard < 1 << 20; ++guard) {
    char c = '}';
    switch (j.state_) {
      case State::start: c = '{'; break;
      case State::key_or_end: c = '}'; break;
      case State::key: c = '"'; break;
      case State::colon: c = ':'; break;
      case State::value: c = '0'; break;
      case State::value_or_end: c = ']'; break;
      case State::string: c = '"'; break;
      case State::utf8: c = char(j.utf8_lo_); break;
      case State::escape: c = 'n'; break;
      case State::unicode: c = '0'; break;
      case State::literal: c = j.literal_[0]; break;
      case State::number:
        c = j.num_ == Num::minus || j.num_ == Num::dot || j.num_ == Num::exp || j.num_ == Num::exp_sign
                ? '0'
                : (j.stack_.back() == '{' ? '}' : ']');
        break;
      case State::after_value: c = j.stack_.back() == '{' ? '}' : ']'; break;
      case State::done: break;
    }
    const bool ok = j.step(c);
    (void)ok;  // each choice above is valid in its state
    out += c;
  }
  return out;
}

bool constrain_to_json(std::span<float> logits, const JsonPrefix& json, const Tokenizer& tok, bool special_text,
                       int keep, int max_tries) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t tries = std::min(order.size(), size_t(std::max(max_tries, 1)));
  std::partial_sort(order.begin(), order.begin() + long(tries), order.end(),
                    [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  std::vector<int32_t> valid;
  for (size_t i = 0; i < tries && int(valid.size()) < keep; ++i) {
    const int32_t t = order[i];
    if (!std::isfinite(logits[size_t(t)]) || tok.is_eog(t) || tok.is_control(t)) continue;
    const std::string piece = tok.token_to_piece(t, special_text);
    if (piece.empty()) continue;
    JsonPrefix j = json;
    if (j.push(piece)) valid.push_back(t);
  }
  if (valid.empty()) return false;
  std::vector<float> kept(valid.size());
  for (size_t i = 0; i < valid.size(); ++i) kept[i] = logits[size_t(valid[i])];
  std::fill(logits.begin(), logits.end(), -INFINITY);
  for (size_t i = 0; i < valid.size(); ++i) logits[size_t(valid[i])] = kept[i];
  return true;
}

}  // namespace strata
