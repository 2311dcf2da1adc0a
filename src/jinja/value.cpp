// Python values for the Jinja engine: truth, equality, ordering, str() and repr(), json.dumps,
// iteration, attribute and item access, the arithmetic operators, printf-style formatting.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "jinja/internal.h"

namespace strata::jinja {

void fail(std::string message) { throw TemplateError{std::move(message)}; }

void check_size(size_t n) {
  if (n > max_output) fail("the template's output passed " + std::to_string(max_output >> 20) + " MiB");
}

// ---- construction

Value Value::str(std::string x) {
  Value v;
  v.kind = k_str;
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}

Value Value::list(List items, bool tuple) {
  Value v;
  v.kind = k_list;
  v.is_tuple = tuple;
  v.l = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::dict(std::shared_ptr<Dict> d) {
  Value v;
  v.kind = k_dict;
  v.d = std::move(d);
  return v;
}

Value Value::func(std::string name, std::function<Value(Interp&, Args&)> f, bool macro) {
  Value v;
  v.kind = k_func;
  v.fn = std::make_shared<Function>(Function{std::move(name), std::move(f), macro});
  return v;
}

Value Value::undefined(std::string message) {
  Value v;
  v.s = std::make_shared<const std::string>(std::move(message));
  return v;
}

Value Value::missing(const Value& obj, const Value& name) {
  if (name.is_str()) return undefined(object_type_repr(obj) + " has no attribute '" + name.str() + "'");
  return undefined(object_type_repr(obj) + " has no element " + repr(name));
}

void raise_undefined(const Value& v) {
  if (v.s) fail(*v.s);
  fail("the value is undefined");
}

const Value* Dict::find(const Value& key) const {
  for (auto& [k, v] : items)
    if (equal(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (auto& [k, v] : items)
    if (k.is_str() && k.str() == key) return &v;
  return nullptr;
}

void Dict::set(const Value& key, Value v) {
  for (auto& item : items)
    if (equal(item.first, key)) {
      item.second = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value from_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value::boolean(j.get<bool>());
    case Json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value::floating(double(u));
      return Value::integer(int64_t(u));
    }
    case Json::value_t::number_float: return Value::floating(j.get<double>());
    case Json::value_t::string: return Value::str(j.get<std::string>());
    case Json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (auto& e : j) l.push_back(from_json(e));
      return Value::list(std::move(l));
    }
    case Json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (auto& [k, e] : j.items()) d->items.emplace_back(Value::str(k), from_json(e));
      return Value::dict(std::move(d));
    }
    default: return Value::none();  // binary, discarded: not in a chat request
  }
}

// ---- UTF-8

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    bool ok = n > 0 && i + n <= s.size();
    for (int k = 1; ok && k < n; ++k) {
      unsigned char t = s[i + k];
      if ((t >> 6) != 2) ok = false;
      cp = (cp << 6) | (t & 0x3f);
    }
    if (ok && ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
               (cp >= 0xd800 && cp < 0xe000)))
      ok = false;
    if (!ok) {  // surrogateescape: the byte survives and encodes back to itself
      out.push_back(0xdc00 + c);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c >= 0xdc80 && c <= 0xdcff) {
      out.push_back(char(c - 0xdc00));
    } else if (c < 0x80) {
      out.push_back(char(c));
    } else if (c < 0x800) {
      out.push_back(char(0xc0 | (c >> 6)));
      out.push_back(char(0x80 | (c & 0x3f)));
    } else if (c < 0x10000) {
      out.push_back(char(0xe0 | (c >> 12)));
      out.push_back(char(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(char(0x80 | (c & 0x3f)));
    } else {
      out.push_back(char(0xf0 | (c >> 18)));
      out.push_back(char(0x80 | ((c >> 12) & 0x3f)));
      out.push_back(char(0x80 | ((c >> 6) & 0x3f)));
      out.push_back(char(0x80 | (c & 0x3f)));
    }
  }
  return out;
}

bool py_isspace(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

// Case mapping of ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic: what chat text needs.
char32_t py_upper(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c == 0xff) return 0x178;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17f) {
    bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_lower ? (c % 2 == 0) : (c % 2 == 1)) return c - 1;
    return c;
  }
  if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) return c - 32;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}

char32_t py_lower(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 32;
  if (c == 0x178) return 0xff;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17f) {
    bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_lower ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}

// ---- truth, equality, order

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::k_undefined:
    case Value::k_none: return false;
    case Value::k_bool: return v.b;
    case Value::k_int: return v.i != 0;
    case Value::k_float: return v.f != 0;
    case Value::k_str: return !v.s->empty();
    case Value::k_list: return !v.l->empty();
    case Value::k_dict: return v.d->type != Dict::plain || !v.d->items.empty();
    case Value::k_func: return true;
  }
  return false;
}

static double as_double(const Value& v) {
  return v.kind == Value::k_float ? v.f : v.kind == Value::k_int ? double(v.i) : v.b ? 1.0 : 0.0;
}
static int64_t as_int(const Value& v) { return v.kind == Value::k_int ? v.i : v.b ? 1 : 0; }

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::k_float || b.kind == Value::k_float) return as_double(a) == as_double(b);
    return as_int(a) == as_int(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::k_undefined:
    case Value::k_none: return true;
    case Value::k_str: return *a.s == *b.s;
    case Value::k_list: {
      if (a.is_tuple != b.is_tuple || a.l->size() != b.l->size()) return false;
      for (size_t i = 0; i < a.l->size(); ++i)
        if (!equal((*a.l)[i], (*b.l)[i])) return false;
      return true;
    }
    case Value::k_dict: {
      if (a.d == b.d) return true;
      if (a.d->type != Dict::plain || b.d->type != Dict::plain) return false;
      if (a.d->items.size() != b.d->items.size()) return false;
      for (auto& [k, v] : a.d->items) {
        const Value* o = b.d->find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    }
    case Value::k_func: return a.fn == b.fn;
    default: return false;
  }
}

int compare(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::k_float || b.kind == Value::k_float) {
      double x = as_double(a), y = as_double(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    int64_t x = as_int(a), y = as_int(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_str() && b.is_str()) {
    // code point order is byte order in UTF-8
    int c = a.s->compare(*b.s);
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind == Value::k_list && b.kind == Value::k_list && a.is_tuple == b.is_tuple) {
    size_t n = std::min(a.l->size(), b.l->size());
    for (size_t i = 0; i < n; ++i)
      if (!equal((*a.l)[i], (*b.l)[i])) return compare((*a.l)[i], (*b.l)[i], op);
    return a.l->size() < b.l->size() ? -1 : a.l->size() > b.l->size() ? 1 : 0;
  }
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  fail(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
       type_name(b) + "'");
}

// ---- names of types

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::k_undefined: return "Undefined";
    case Value::k_none: return "NoneType";
    case Value::k_bool: return "bool";
    case Value::k_int: return "int";
    case Value::k_float: return "float";
    case Value::k_str: return "str";
    case Value::k_list: return v.is_tuple ? "tuple" : "list";
    case Value::k_dict: return v.d->type == Dict::name_space ? "Namespace" : v.d->type == Dict::loop ? "LoopContext" : "dict";
    case Value::k_func: return v.fn->is_macro ? "Macro" : "function";
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  if (v.kind == Value::k_none) return "None";
  return "'" + type_name(v) + " object'";
}

// ---- str() and repr()

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  // the shortest digits that read back as x (Python's repr), then Python's layout of them
  char buf[40];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s = buf;
  bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  size_t e = s.find('e');
  int exp = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (s[i] != '.') digits.push_back(s[i]);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp + 1;  // digits d1 d2 ... with the point after decpt of them
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(size_t(-decpt), '0') + digits;
    } else if (size_t(decpt) >= digits.size()) {
      out = digits + std::string(size_t(decpt) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    int ex = decpt - 1;
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    out += eb;
  }
  return neg ? "-" + out : out;
}

// Python's str.isprintable, for the characters chat text holds.
static bool printable(char32_t c) {
  if (c < 0x20 || c == 0x7f) return false;
  if (c >= 0x80 && c <= 0xa0) return false;
  if (c == 0xad) return false;
  if (c >= 0x2000 && c <= 0x200f) return false;
  if (c >= 0x2028 && c <= 0x202f) return false;
  if (c >= 0x205f && c <= 0x206f) return false;
  if (c == 0x3000 || c == 0xfeff || c == 0x1680) return false;
  if (c >= 0xd800 && c <= 0xdfff) return false;
  if (c >= 0xe000 && c <= 0xf8ff) return false;  // private use
  if (c >= 0xfff9 && c <= 0xfffb) return false;
  if (c >= 0xf0000) return false;
  return true;
}

static std::string str_repr(const std::string& s) {
  bool sq = s.find('\'') != std::string::npos, dq = s.find('"') != std::string::npos;
  char quote = sq && !dq ? '"' : '\'';
  std::u32string u = decode(s);
  std::u32string out;
  out.push_back(quote);
  auto hex = [&](const char* fmt, unsigned v) {
    char b[16];
    std::snprintf(b, sizeof b, fmt, v);
    for (char* p = b; *p; ++p) out.push_back(char32_t(*p));
  };
  for (char32_t c : u) {
    if (c == char32_t(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += U"\\n";
    } else if (c == '\r') {
      out += U"\\r";
    } else if (c == '\t') {
      out += U"\\t";
    } else if (printable(c)) {
      out.push_back(c);
    } else if (c < 0x100) {
      hex("\\x%02x", unsigned(c));
    } else if (c < 0x10000) {
      hex("\\u%04x", unsigned(c));
    } else {
      hex("\\U%08x", unsigned(c));
    }
  }
  out.push_back(quote);
  return encode(out);
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Value::k_str: return str_repr(*v.s);
    case Value::k_list: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t i = 0; i < v.l->size(); ++i) {
        if (i) out += ", ";
        out += repr((*v.l)[i]);
        check_size(out.size());
      }
      if (v.is_tuple && v.l->size() == 1) out += ",";
      return out + (v.is_tuple ? ")" : "]");
    }
    case Value::k_dict: {
      std::string out = v.d->type == Dict::name_space ? "<Namespace {" : "{";
      bool first = true;
      for (auto& [k, e] : v.d->items) {
        if (!first) out += ", ";
        first = false;
        out += repr(k) + ": " + repr(e);
        check_size(out.size());
      }
      return out + (v.d->type == Dict::name_space ? "}>" : "}");
    }
    case Value::k_undefined: return "Undefined";
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::k_undefined: return "";
    case Value::k_none: return "None";
    case Value::k_bool: return v.b ? "True" : "False";
    case Value::k_int: return std::to_string(v.i);
    case Value::k_float: return float_repr(v.f);
    case Value::k_str: return *v.s;
    case Value::k_func: return "<function " + v.fn->name + ">";
    default: return repr(v);
  }
}

// ---- json.dumps

static void dump_string(std::string& out, const std::string& s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out.push_back(char(c));
        }
    }
  }
  out.push_back('"');
}

static void dump(std::string& out, const Value& v, const DumpOptions& o, int depth) {
  if (depth > 200) fail("tojson: the value nests deeper than 200 levels");
  check_size(out.size());
  auto newline = [&](int d) {
    if (o.indent < 0) return;
    out.push_back('\n');
    out.append(size_t(o.indent) * size_t(d), ' ');
  };
  switch (v.kind) {
    case Value::k_none: out += "null"; return;
    case Value::k_bool: out += v.b ? "true" : "false"; return;
    case Value::k_int: out += std::to_string(v.i); return;
    case Value::k_float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f < 0 ? "-Infinity" : "Infinity";
      else out += float_repr(v.f);
      return;
    case Value::k_str: dump_string(out, *v.s); return;
    case Value::k_list: {
      if (v.l->empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < v.l->size(); ++i) {
        if (i) out += o.item_sep;
        newline(depth + 1);
        dump(out, (*v.l)[i], o, depth + 1);
      }
      newline(depth);
      out.push_back(']');
      return;
    }
    case Value::k_dict: {
      if (v.d->type != Dict::plain) break;
      if (v.d->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (auto& it : v.d->items) items.push_back(&it);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return compare(a->first, b->first, "<") < 0; });
      out.push_back('{');
      bool first = true;
      for (auto* it : items) {
        if (!first) out += o.item_sep;
        first = false;
        newline(depth + 1);
        const Value& k = it->first;
        if (k.is_str()) dump_string(out, *k.s);
        else if (k.kind == Value::k_none) out += "\"null\"";
        else if (k.kind == Value::k_bool) out += k.b ? "\"true\"" : "\"false\"";
        else if (k.kind == Value::k_int || k.kind == Value::k_float) out += "\"" + to_str(k) + "\"";
        else fail("keys must be str, int, float, bool or None, not " + type_name(k));
        out += o.key_sep;
        dump(out, it->second, o, depth + 1);
      }
      newline(depth);
      out.push_back('}');
      return;
    }
    default: break;
  }
  fail("Object of type " + type_name(v) + " is not JSON serializable");
}

std::string dumps(const Value& v, const DumpOptions& o) {
  std::string out;
  dump(out, v, o, 0);
  return out;
}

// ---- iteration, length, access

List iterate(const Value& v) {
  switch (v.kind) {
    case Value::k_undefined: return {};
    case Value::k_list: return *v.l;
    case Value::k_dict: {
      if (v.d->type != Dict::plain) break;
      List keys;
      for (auto& it : v.d->items) keys.push_back(it.first);
      return keys;
    }
    case Value::k_str: {
      List chars;
      for (char32_t c : decode(*v.s)) chars.push_back(Value::str(encode(std::u32string(1, c))));
      return chars;
    }
    default: break;
  }
  fail("'" + type_name(v) + "' object is not iterable");
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Value::k_undefined: return 0;
    case Value::k_str: return int64_t(decode(*v.s).size());
    case Value::k_list: return int64_t(v.l->size());
    case Value::k_dict:
      if (v.d->type == Dict::plain) return int64_t(v.d->items.size());
      break;
    default: break;
  }
  fail("object of type '" + type_name(v) + "' has no len()");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) raise_undefined(obj);
  switch (obj.kind) {
    case Value::k_dict:
      if (const Value* v = obj.d->find(key)) return *v;
      break;
    case Value::k_list:
      if (key.kind == Value::k_int || key.kind == Value::k_bool) {
        int64_t n = int64_t(obj.l->size()), i = as_int(key);
        if (i < 0) i += n;
        if (i >= 0 && i < n) return (*obj.l)[size_t(i)];
      }
      break;
    case Value::k_str:
      if (key.kind == Value::k_int || key.kind == Value::k_bool) {
        std::u32string u = decode(*obj.s);
        int64_t n = int64_t(u.size()), i = as_int(key);
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value::str(encode(u.substr(size_t(i), 1)));
      }
      break;
    default: break;
  }
  if (key.is_str()) {
    Value m = method(obj, key.str());
    if (!m.is_undefined() || m.s) return m;
  }
  return Value::missing(obj, key);
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) raise_undefined(obj);
  Value m = method(obj, name);
  if (!m.is_undefined() || m.s) return m;  // a method, or an unsafe one's Undefined
  if (obj.kind == Value::k_dict)
    if (const Value* v = obj.d->find(std::string_view(name))) return *v;
  return Value::missing(obj, Value::str(name));
}

static int64_t slice_index(const Value& v, const char* what) {
  if (v.kind == Value::k_int || v.kind == Value::k_bool) return as_int(v);
  fail(std::string("slice ") + what + " must be an integer or None, not " + type_name(v));
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) raise_undefined(obj);
  auto none = [](const Value& v) { return v.kind == Value::k_none || v.is_undefined(); };
  int64_t st = none(step) ? 1 : slice_index(step, "step");
  if (st == 0) fail("slice step cannot be zero");
  auto pick = [&](int64_t n, std::vector<size_t>& idx) {
    int64_t lo, hi;
    if (st > 0) {
      lo = none(start) ? 0 : slice_index(start, "start");
      hi = none(stop) ? n : slice_index(stop, "stop");
      if (lo < 0) lo = std::max<int64_t>(0, lo + n);
      if (hi < 0) hi = std::max<int64_t>(0, hi + n);
      lo = std::min(lo, n);
      hi = std::min(hi, n);
      for (int64_t i = lo; i < hi; i += st) idx.push_back(size_t(i));
    } else {
      lo = none(start) ? n - 1 : slice_index(start, "start");
      hi = none(stop) ? -1 : slice_index(stop, "stop");
      if (lo < 0) lo += n;
      if (!none(stop) && hi < 0) hi = std::max<int64_t>(-1, hi + n);
      lo = std::min(lo, n - 1);
      for (int64_t i = lo; i > hi && i >= 0; i += st) idx.push_back(size_t(i));
    }
  };
  std::vector<size_t> idx;
  if (obj.kind == Value::k_list) {
    pick(int64_t(obj.l->size()), idx);
    List out;
    for (size_t i : idx) out.push_back((*obj.l)[i]);
    return Value::list(std::move(out), obj.is_tuple);
  }
  if (obj.is_str()) {
    std::u32string u = decode(*obj.s);
    pick(int64_t(u.size()), idx);
    std::u32string out;
    for (size_t i : idx) out.push_back(u[i]);
    return Value::str(encode(out));
  }
  if (obj.kind == Value::k_dict && obj.d->type == Dict::plain) fail("unhashable type: 'slice'");
  fail("'" + type_name(obj) + "' object is not subscriptable");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::k_undefined: return false;
    case Value::k_str:
      if (!item.is_str())
        fail("'in <string>' requires string as left operand, not " + type_name(item));
      return container.s->find(*item.s) != std::string::npos;
    case Value::k_list:
      for (auto& e : *container.l)
        if (equal(e, item)) return true;
      return false;
    case Value::k_dict:
      if (container.d->type != Dict::plain) break;
      if ((item.kind == Value::k_list && !item.is_tuple) || item.kind == Value::k_dict)
        fail("unhashable type: '" + type_name(item) + "'");
      return container.d->find(item) != nullptr;
    default: break;
  }
  fail("argument of type '" + type_name(container) + "' is not iterable");
}

// ---- operators

static Value repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  const size_t len = seq.is_str() ? seq.s->size() : seq.l->size();
  if (len > 0 && uint64_t(n) > max_output) check_size(max_output + 1);
  if (seq.is_str()) {
    check_size(seq.s->size() * size_t(n));
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += *seq.s;
    return Value::str(std::move(out));
  }
  check_size(seq.l->size() * size_t(n));
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.l->begin(), seq.l->end());
  return Value::list(std::move(out), seq.is_tuple);
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) raise_undefined(a);
  if (op == "%" && a.is_str()) return percent_format(*a.s, b);  // str % Undefined formats ''
  if (b.is_undefined()) raise_undefined(b);
  auto unsupported = [&]() -> Value {
    fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  bool num = a.is_number() && b.is_number();
  bool flt = num && (a.kind == Value::k_float || b.kind == Value::k_float);
  // ints are 64-bit here (Python's are unbounded): past that range is an error, not a wrap
  auto checked = [](bool (*checked_op)(int64_t, int64_t, int64_t*), int64_t x, int64_t y) {
    int64_t r = 0;
    if (checked_op(x, y, &r)) fail("integer overflow: the result does not fit in 64 bits");
    return Value::integer(r);
  };
  auto add = [](int64_t x, int64_t y, int64_t* r) { return __builtin_add_overflow(x, y, r); };
  auto sub = [](int64_t x, int64_t y, int64_t* r) { return __builtin_sub_overflow(x, y, r); };
  auto mul = [](int64_t x, int64_t y, int64_t* r) { return __builtin_mul_overflow(x, y, r); };
  if (op == "+") {
    if (num) return flt ? Value::floating(as_double(a) + as_double(b)) : checked(add, as_int(a), as_int(b));
    if (a.is_str() && b.is_str()) {
      check_size(a.s->size() + b.s->size());
      return Value::str(*a.s + *b.s);
    }
    if (a.kind == Value::k_list && b.kind == Value::k_list && a.is_tuple == b.is_tuple) {
      List out = *a.l;
      out.insert(out.end(), b.l->begin(), b.l->end());
      return Value::list(std::move(out), a.is_tuple);
    }
    if (a.is_str()) fail("can only concatenate str (not \"" + type_name(b) + "\") to str");
    if (a.kind == Value::k_list)
      fail("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
    return unsupported();
  }
  if (op == "-") {
    if (!num) return unsupported();
    return flt ? Value::floating(as_double(a) - as_double(b)) : checked(sub, as_int(a), as_int(b));
  }
  if (op == "*") {
    if (num) return flt ? Value::floating(as_double(a) * as_double(b)) : checked(mul, as_int(a), as_int(b));
    if ((a.is_str() || a.kind == Value::k_list) && (b.kind == Value::k_int || b.kind == Value::k_bool))
      return repeat(a, as_int(b));
    if ((b.is_str() || b.kind == Value::k_list) && (a.kind == Value::k_int || a.kind == Value::k_bool))
      return repeat(b, as_int(a));
    return unsupported();
  }
  if (op == "/") {
    if (!num) return unsupported();
    if (as_double(b) == 0) fail("division by zero");
    return Value::floating(as_double(a) / as_double(b));
  }
  if (op == "//" || op == "%") {
    if (!num) return unsupported();
    if (flt) {
      double x = as_double(a), y = as_double(b);
      if (y == 0) fail(op == "//" ? "float floor division by zero" : "float modulo");
      double q = std::floor(x / y);
      return Value::floating(op == "//" ? q : x - q * y);
    }
    int64_t x = as_int(a), y = as_int(b);
    if (y == 0) fail(op == "//" ? "integer division or modulo by zero" : "integer modulo by zero");
    if (y == -1) return op == "//" ? checked(sub, 0, x) : Value::integer(0);
    int64_t q = x / y, r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {
      --q;
      r += y;
    }
    return Value::integer(op == "//" ? q : r);
  }
  if (op == "**") {
    if (!num) return unsupported();
    if (!flt && as_int(b) >= 0) {
      int64_t base = as_int(a), e = as_int(b), r = 1;
      for (int64_t i = 0; i < e; ++i) {
        if (__builtin_mul_overflow(r, base, &r)) return Value::floating(std::pow(as_double(a), as_double(b)));
        if (r == 0 || r == 1) break;
      }
      return Value::integer(r);
    }
    double r = std::pow(as_double(a), as_double(b));
    if (std::isinf(r) && std::isfinite(as_double(a)) && std::isfinite(as_double(b))) {
      if (as_double(a) == 0) fail("0.0 cannot be raised to a negative power");
      fail("(34, 'Numerical result out of range')");
    }
    return Value::floating(r);
  }
  return unsupported();
}

// printf-style formatting of str % args: the conversions templates use (s r d i f x o e g c %).
Value percent_format(const std::string& fmt, const Value& args) {
  // Python: a tuple gives the arguments; any other value is the one argument, and one with
  // items (a dict, a list) may also go unused, or be looked up by %(key)s when a dict
  List items;
  const Value* mapping = nullptr;
  bool may_go_unused = false;
  if (args.kind == Value::k_list && args.is_tuple) {
    items = *args.l;
  } else if (args.kind == Value::k_dict && args.d->type == Dict::plain) {
    mapping = &args;
  } else {
    items.push_back(args);
    may_go_unused = args.kind == Value::k_list || args.is_undefined();
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    if (fmt[i] == '%') {
      out.push_back('%');
      continue;
    }
    const Value* arg = nullptr;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos || !mapping) fail("format requires a mapping");
      const Value* v = mapping->d->find(std::string_view(fmt).substr(i + 1, close - i - 1));
      if (!v) fail("KeyError: '" + fmt.substr(i + 1, close - i - 1) + "'");
      arg = v;
      i = close + 1;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::strchr("-+ #0123456789.", fmt[i])) spec.push_back(fmt[i++]);
    if (i >= fmt.size()) fail("incomplete format");
    char conv = fmt[i];
    if (!arg) {
      if (mapping) {  // a dict with unkeyed conversions: the dict itself is the one argument
        if (next++ > 0) fail("not enough arguments for format string");
        arg = mapping;
      } else {
        if (next >= items.size()) fail("not enough arguments for format string");
        arg = &items[next++];
      }
    }
    char buf[512];
    switch (conv) {
      case 's':
      case 'r': {
        std::string s = conv == 's' ? to_str(*arg) : repr(*arg);
        if (spec == "%") {
          out += s;
        } else {  // a width counts code points
          int width = std::atoi(spec.c_str() + 1 + (spec.size() > 1 && spec[1] == '-'));
          bool left = spec.size() > 1 && spec[1] == '-';
          int n = int(decode(s).size());
          if (n < width && !left) out.append(size_t(width - n), ' ');
          out += s;
          if (n < width && left) out.append(size_t(width - n), ' ');
        }
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o':
      case 'c': {
        if (!arg->is_number()) fail("%" + std::string(1, conv) + " format: a real number is required, not " + type_name(*arg));
        if (arg->kind == Value::k_float && conv != 'd' && conv != 'i')
          fail("%" + std::string(1, conv) + " format: an integer is required, not float");
        long long n = arg->kind == Value::k_float ? (long long)arg->f : (long long)as_int(*arg);
        if (conv == 'c') {
          out += encode(std::u32string(1, char32_t(n)));
          break;
        }
        if (n < 0 && conv != 'd' && conv != 'i') {  // Python: -3 in hex is -3
          std::snprintf(buf, sizeof buf, (spec + "ll" + conv).c_str(), -n);
          out += "-";
        } else {
          std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), n);
        }
        out += buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        if (!arg->is_number()) fail("must be real number, not " + type_name(*arg));
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), as_double(*arg));
        out += buf;
        break;
      default: fail(std::string("unsupported format character '") + conv + "'");
    }
    check_size(out.size());
  }
  if (!mapping && !may_go_unused && next < items.size()) fail("not all arguments converted during string formatting");
  return Value::str(std::move(out));
}

}  // namespace strata::jinja
