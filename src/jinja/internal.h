// The parts of the Jinja engine shared by its files: Python-like values, tokens, the syntax tree
// and the evaluator's entry points. Not part of the API (jinja.h is).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/jinja.h"

namespace strata::jinja {

// A template error inside the engine: thrown by the evaluator and parser, caught at the API, where
// it becomes an Error. `message` is what Python's exception would say.
struct TemplateError {
  std::string message;
};
[[noreturn]] void fail(std::string message);

struct Value;
struct Dict;
struct Interp;
using List = std::vector<Value>;

// Arguments of a call: positional, then keywords in the order given.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct Function {
  std::string name;
  std::function<Value(Interp&, Args&)> call;
  bool is_macro = false;
};

// A Python value. Strings are UTF-8 (invalid bytes survive as U+DC80..U+DCFF, Python's
// surrogateescape); lists, dicts and functions are shared, as Python objects are.
struct Value {
  enum Kind : uint8_t { k_undefined, k_none, k_bool, k_int, k_float, k_str, k_list, k_dict, k_func };
  Kind kind = k_undefined;
  bool is_tuple = false;  // k_list printed as (a, b)
  bool b = false;
  int64_t i = 0;
  double f = 0;
  // k_str: the text; k_undefined: the message of the error raised when it is used (null: none)
  std::shared_ptr<const std::string> s;
  std::shared_ptr<List> l;
  std::shared_ptr<Dict> d;
  std::shared_ptr<Function> fn;

  static Value none() { Value v; v.kind = k_none; return v; }
  static Value boolean(bool x) { Value v; v.kind = k_bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = k_int; v.i = x; return v; }
  static Value floating(double x) { Value v; v.kind = k_float; v.f = x; return v; }
  static Value str(std::string x);
  static Value list(List items, bool tuple = false);
  static Value dict(std::shared_ptr<Dict> d);
  static Value func(std::string name, std::function<Value(Interp&, Args&)> f, bool macro = false);
  // Undefined whose use raises `message` ("'x' is undefined").
  static Value undefined(std::string message);
  // Python's Undefined(obj=obj, name=name): "'dict object' has no attribute 'x'".
  static Value missing(const Value& obj, const Value& name);

  bool is_undefined() const { return kind == k_undefined; }
  bool is_str() const { return kind == k_str; }
  bool is_number() const { return kind == k_int || kind == k_float || kind == k_bool; }
  const std::string& str() const { return *s; }
};

// A dict, a namespace() or a loop object (attributes are its keys), ordered as Python's.
struct Dict {
  enum Type : uint8_t { plain, name_space, loop };
  Type type = plain;
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(const Value& key, Value v);
};

// value.cpp: Python semantics
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
int compare(const Value& a, const Value& b, const char* op);  // <0, 0, >0; TypeError if unordered
std::string to_str(const Value& v);   // str(v)
std::string repr(const Value& v);     // repr(v)
std::string float_repr(double x);
std::string type_name(const Value& v);  // "int", "str", "NoneType"
std::string object_type_repr(const Value& v);  // "dict object", "None"
[[noreturn]] void raise_undefined(const Value& v);
Value from_json(const Json& j);
struct DumpOptions {
  int indent = -1;  // -1: none
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};
std::string dumps(const Value& v, const DumpOptions& o);
// Iterates like Python's iter(): lists, tuples, dict keys, string characters; Undefined is empty.
List iterate(const Value& v);
int64_t length(const Value& v);
// obj.name (attribute first, then item) and obj[key] (item first, then attribute).
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
Value binary_op(const std::string& op, const Value& a, const Value& b);
Value percent_format(const std::string& fmt, const Value& args);
bool contains(const Value& container, const Value& item);

// utf8 helpers (value.cpp)
std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
bool py_isspace(char32_t c);
char32_t py_upper(char32_t c);
char32_t py_lower(char32_t c);
// The string is at most the output limit; longer is an error.
void check_size(size_t n);
constexpr size_t max_output = 64u << 20;

// Tokens of the lexer (lexer.cpp).
struct Token {
  enum Type : uint8_t { data, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };
  Type type;
  std::string text;  // data and strings decoded; names and operators as written
  int line;
  int64_t ival = 0;
  double fval = 0;
};
// Splits a template into tokens with jinja2's whitespace rules (trim_blocks, lstrip_blocks);
// a syntax error is a TemplateError "line N: ...".
std::vector<Token> tokenize(std::string_view source);

// The syntax tree (parser.cpp).
struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Expr {
  enum Kind : uint8_t {
    literal, variable, list, tuple, dict, attr, item, slice, call, filter, test, neg, pos, not_, and_, or_,
    binary, concat, compare, cond
  };
  Kind kind;
  int line = 0;
  Value value;                 // literal
  std::string name;            // name, attr, filter/test name, binary operator
  std::vector<ExprP> kids;     // operands; call: callee then positional args; filter/test: input
                               // (null in a filter block) then args; dict: key, value, ...
  std::vector<std::pair<std::string, ExprP>> kwargs;  // call, filter, test keyword arguments
  std::vector<std::string> ops;  // compare: the operators between kids
};

// An assignment target: a name, a tuple of names, or namespace attribute `ns.attr`.
struct Target {
  std::vector<std::string> names;
  std::string attr;  // non-empty: names[0].attr
  bool tuple = false;
};

struct Node {
  enum Kind : uint8_t { data, output, if_, for_, set, set_block, macro, call_block, filter_block, with, break_, continue_ };
  Kind kind;
  int line = 0;
  std::string text;  // data; macro name
  ExprP expr;        // output, if condition, for iterable, set value, call_block call
  ExprP cond;        // for ... if cond
  Target target;     // for, set, set_block
  std::vector<ExprP> filters;  // set_block, filter_block: filters applied to the body
  std::vector<std::pair<std::string, ExprP>> params;  // macro, call_block caller: name, default
  std::vector<std::pair<Target, ExprP>> assigns;      // with
  std::vector<Node> body, else_body;
  bool recursive = false;
};

std::vector<Node> parse_template(std::string_view source);

// filters.cpp
bool is_filter(std::string_view name);
bool is_test(std::string_view name);
Value apply_filter(Interp& in, const std::string& name, Value input, Args& args);
bool apply_test(Interp& in, const std::string& name, const Value& input, Args& args);
// A method of a builtin type (str.strip, dict.items, list.index) bound to `self`; Undefined
// when the type has no such method.
Value method(const Value& self, const std::string& name);

// eval.cpp: what filters need of the evaluator.
Value call_value(Interp& in, const Value& fn, Args& args);

// Argument helpers: positional index i or keyword `name`, else `def`.
const Value* arg(const Args& a, size_t i, std::string_view name);
Value arg_or(const Args& a, size_t i, std::string_view name, Value def);

}  // namespace strata::jinja
