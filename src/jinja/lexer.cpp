// The Jinja lexer: data, {{ }}, {% %} and {# #} with jinja2's whitespace rules as transformers
// configures them (trim_blocks: the newline after a block or comment tag goes; lstrip_blocks: the
// spaces before one on its line go; `-` strips all whitespace on that side, `+` keeps it), and
// jinja2's defaults (newlines normalised to \n, one trailing newline of the template dropped).
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "jinja/internal.h"

namespace strata::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string rstrip_ws(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && is_ws(s[n - 1])) --n;
  return std::string(s.substr(0, n));
}

struct Lexer {
  std::string src;
  size_t pos = 0;
  int line = 1;
  std::vector<Token> out;
  bool line_starting = true;

  [[noreturn]] void error(const std::string& what) const { fail("line " + std::to_string(line) + ": " + what); }

  void advance_to(size_t p) {
    for (size_t i = pos; i < p; ++i)
      if (src[i] == '\n') ++line;
    pos = p;
  }
  void emit(Token::Type t, std::string text = {}) { out.push_back(Token{t, std::move(text), line}); }

  void skip_ws_after() {  // after `-%}`: \s*
    size_t p = pos;
    while (p < src.size() && is_ws(src[p])) ++p;
    advance_to(p);
  }

  void run() {
    while (pos < src.size()) {
      size_t start = pos, at = std::string::npos;
      char kind = 0;
      for (size_t p = pos; p + 1 < src.size(); ++p)
        if (src[p] == '{' && (src[p + 1] == '{' || src[p + 1] == '%' || src[p + 1] == '#')) {
          at = p;
          kind = src[p + 1];
          break;
        }
      if (at == std::string::npos) {
        emit_data(src.substr(start));
        advance_to(src.size());
        break;
      }
      std::string text = src.substr(start, at - start);
      char sign = at + 2 < src.size() ? src[at + 2] : 0;
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool all_ws = l_pos < text.size();
          for (size_t i = l_pos; i < text.size(); ++i)
            if (!is_ws(text[i])) all_ws = false;
          if (all_ws) text.resize(l_pos);
        }
      }
      emit_data(text);
      advance_to(at + 2 + (sign == '-' || sign == '+'));
      line_starting = false;
      if (kind == '#') comment();
      else if (kind == '%' && raw_block()) continue;
      else tag(kind == '{' ? Token::var_begin : Token::block_begin);
    }
    emit(Token::eof);
  }

  void emit_data(std::string text) {
    if (!text.empty()) emit(Token::data, std::move(text));
  }

  void comment() {
    size_t end = src.find("#}", pos);
    if (end == std::string::npos) error("missing end of comment tag");
    char sign = end > pos ? src[end - 1] : 0;
    advance_to(end + 2);
    if (sign == '-') skip_ws_after();
    else if (sign != '+') trim_newline();
    line_starting = pos > 0 && src[pos - 1] == '\n';
  }

  void trim_newline() {
    if (pos < src.size() && src[pos] == '\n') advance_to(pos + 1);
  }

  // {% raw %}...{% endraw %}: the text between, verbatim.
  bool raw_block() {
    size_t p = pos;
    while (p < src.size() && is_ws(src[p])) ++p;
    if (src.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src.size() && is_ws(src[p])) ++p;
    bool strip_after = false;
    if (p < src.size() && src[p] == '-') {
      strip_after = true;
      ++p;
    }
    if (src.compare(p, 2, "%}") != 0) return false;
    advance_to(p + 2);
    if (strip_after) skip_ws_after();
    // find {%[-+]? endraw [-]?%}
    size_t q = pos;
    for (;;) {
      size_t b = src.find("{%", q);
      if (b == std::string::npos) error("missing end of raw directive");
      size_t r = b + 2;
      char sign = r < src.size() ? src[r] : 0;
      if (sign == '-' || sign == '+') ++r;
      while (r < src.size() && is_ws(src[r])) ++r;
      if (src.compare(r, 6, "endraw") != 0) {
        q = b + 2;
        continue;
      }
      r += 6;
      while (r < src.size() && is_ws(src[r])) ++r;
      char end_sign = 0;
      if (r < src.size() && (src[r] == '-' || src[r] == '+')) end_sign = src[r++];
      if (src.compare(r, 2, "%}") != 0) {
        q = b + 2;
        continue;
      }
      std::string text = src.substr(pos, b - pos);
      if (sign == '-') text = rstrip_ws(text);
      emit_data(text);
      advance_to(r + 2);
      if (end_sign == '-') skip_ws_after();
      else if (end_sign != '+') trim_newline();
      line_starting = pos > 0 && src[pos - 1] == '\n';
      return true;
    }
  }

  void tag(Token::Type begin) {
    emit(begin);
    bool block = begin == Token::block_begin;
    std::vector<char> brackets;
    for (;;) {
      while (pos < src.size() && is_ws(src[pos])) advance_to(pos + 1);
      if (pos >= src.size()) error(block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
      if (brackets.empty()) {
        const char* close = block ? "%}" : "}}";
        char sign = src[pos];
        if ((sign == '-' || (block && sign == '+')) && src.compare(pos + 1, 2, close) == 0) {
          advance_to(pos + 3);
          emit(block ? Token::block_end : Token::var_end);
          if (sign == '-') skip_ws_after();
          line_starting = pos > 0 && src[pos - 1] == '\n';
          return;
        }
        if (src.compare(pos, 2, close) == 0) {
          advance_to(pos + 2);
          emit(block ? Token::block_end : Token::var_end);
          if (block) trim_newline();
          line_starting = pos > 0 && src[pos - 1] == '\n';
          return;
        }
      }
      char c = src[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src.size() && (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
        emit(Token::name, src.substr(pos, e - pos));
        advance_to(e);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
      } else if (c == '\'' || c == '"') {
        string_literal(c);
      } else {
        static const char* const two[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (const char* t : two)
          if (src.compare(pos, 2, t) == 0) op = t;
        if (op.empty()) {
          if (!std::strchr("+-/*%~[](){}><=.:|,;", c)) error(std::string("unexpected char '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") brackets.push_back(op[0]);
        if (op == ")" || op == "]" || op == "}") {
          char want = op == ")" ? '(' : op == "]" ? '[' : '{';
          if (brackets.empty() || brackets.back() != want) error("unexpected '" + op + "'");
          brackets.pop_back();
        }
        emit(Token::op, op);
        advance_to(pos + op.size());
      }
    }
  }

  void number() {
    auto digits = [&](size_t p) {  // \d+(_\d+)*
      size_t e = p;
      while (e < src.size() && (std::isdigit(static_cast<unsigned char>(src[e])) ||
                                (src[e] == '_' && e > p && e + 1 < src.size() &&
                                 std::isdigit(static_cast<unsigned char>(src[e + 1])))))
        ++e;
      return e;
    };
    size_t e = digits(pos);
    bool after_dot = !out.empty() && out.back().type == Token::op && out.back().text == ".";
    bool is_float = false;
    if (!after_dot) {
      if (e + 1 < src.size() && src[e] == '.' && std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
        e = digits(e + 1);
        is_float = true;
      }
      if (e < src.size() && (src[e] == 'e' || src[e] == 'E')) {
        size_t x = e + 1;
        if (x < src.size() && (src[x] == '+' || src[x] == '-')) ++x;
        if (x < src.size() && std::isdigit(static_cast<unsigned char>(src[x]))) {
          e = digits(x);
          is_float = true;
        }
      }
    }
    std::string text;
    for (size_t i = pos; i < e; ++i)
      if (src[i] != '_') text.push_back(src[i]);
    Token t{is_float ? Token::floating : Token::integer, text, line};
    if (is_float) {
      t.fval = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      t.ival = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) error("integer literal " + text + " is too large");
    }
    out.push_back(std::move(t));
    advance_to(e);
  }

  // A string literal, decoded as Python's unicode-escape does.
  void string_literal(char quote) {
    size_t p = pos + 1;
    std::string v;
    auto hex = [&](size_t at, int n) -> long {
      if (at + size_t(n) > src.size()) return -1;
      long x = 0;
      for (int k = 0; k < n; ++k) {
        char h = src[at + size_t(k)];
        int d = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                : (h >= 'a' && h <= 'f')                   ? h - 'a' + 10
                : (h >= 'A' && h <= 'F')                   ? h - 'A' + 10
                                                           : -1;
        if (d < 0) return -1;
        x = x * 16 + d;
      }
      return x;
    };
    for (;;) {
      if (p >= src.size()) error("unexpected end of string");
      char c = src[p];
      if (c == quote) break;
      if (c != '\\') {
        v.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src.size()) error("unexpected end of string");
      char e = src[p + 1];
      p += 2;
      switch (e) {
        case 'n': v.push_back('\n'); break;
        case 't': v.push_back('\t'); break;
        case 'r': v.push_back('\r'); break;
        case '\\': v.push_back('\\'); break;
        case '\'': v.push_back('\''); break;
        case '"': v.push_back('"'); break;
        case 'a': v.push_back('\a'); break;
        case 'b': v.push_back('\b'); break;
        case 'f': v.push_back('\f'); break;
        case 'v': v.push_back('\v'); break;
        case '\n': break;  // a line continuation
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          long cp = hex(p, n);
          if (cp < 0 || cp > 0x10ffff) error(std::string("malformed \\") + e + " escape in a string");
          v += encode(std::u32string(1, char32_t(cp)));
          p += size_t(n);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            int x = e - '0', k = 1;
            while (k < 3 && p < src.size() && src[p] >= '0' && src[p] <= '7') {
              x = x * 8 + (src[p++] - '0');
              ++k;
            }
            v += encode(std::u32string(1, char32_t(x)));
          } else {  // unknown escapes keep their backslash
            v.push_back('\\');
            v.push_back(e);
          }
      }
    }
    emit(Token::string, std::move(v));
    advance_to(p + 1);
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  Lexer lx;
  lx.src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {  // \r\n and \r become \n
    if (source[i] == '\r') {
      lx.src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      lx.src.push_back(source[i]);
    }
  }
  if (!lx.src.empty() && lx.src.back() == '\n') lx.src.pop_back();  // keep_trailing_newline=False
  lx.run();
  return std::move(lx.out);
}

}  // namespace strata::jinja
