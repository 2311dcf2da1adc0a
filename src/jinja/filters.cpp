// jinja2's builtin filters and tests (filters.py, tests.py), transformers' tojson, and the methods
// of Python's str, dict and list that templates call, under the immutable sandbox (no method that
// changes a list or dict).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>

#include "jinja/internal.h"

namespace strata::jinja {

const Value* arg(const Args& a, size_t i, std::string_view name) {
  if (i < a.pos.size()) return &a.pos[i];
  for (auto& [k, v] : a.kw)
    if (k == name) return &v;
  return nullptr;
}

Value arg_or(const Args& a, size_t i, std::string_view name, Value def) {
  const Value* v = arg(a, i, name);
  return v ? *v : std::move(def);
}

namespace {

int64_t int_arg(const Args& a, size_t i, std::string_view name, int64_t def) {
  const Value* v = arg(a, i, name);
  if (!v || v->kind == Value::k_none) return def;
  if (v->kind == Value::k_int) return v->i;
  if (v->kind == Value::k_bool) return v->b;
  if (v->kind == Value::k_float) return int64_t(v->f);
  fail("'" + type_name(*v) + "' object cannot be interpreted as an integer (argument '" + std::string(name) + "')");
}

bool bool_arg(const Args& a, size_t i, std::string_view name, bool def) {
  const Value* v = arg(a, i, name);
  return v ? truthy(*v) : def;
}

std::string str_arg(const Args& a, size_t i, std::string_view name, const char* def) {
  const Value* v = arg(a, i, name);
  return v ? to_str(*v) : std::string(def);
}

// ---- string helpers (code points)

std::u32string strip_chars(const std::u32string& s, const Value* chars, bool left, bool right) {
  std::u32string set;
  bool ws = !chars || chars->kind == Value::k_none;
  if (!ws) {
    if (!chars->is_str()) fail("strip arg must be None or str");
    set = decode(chars->str());
  }
  auto strip = [&](char32_t c) { return ws ? py_isspace(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && strip(s[b])) ++b;
  if (right)
    while (e > b && strip(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string strip_str(const std::string& s, const Value* chars, bool left = true, bool right = true) {
  return encode(strip_chars(decode(s), chars, left, right));
}

bool cased(char32_t c) { return py_upper(c) != c || py_lower(c) != c; }
bool is_upper_c(char32_t c) { return py_lower(c) != c; }
bool is_lower_c(char32_t c) { return py_upper(c) != c; }

std::string map_case(const std::string& s, bool up) {
  std::u32string u = decode(s);
  for (auto& c : u) c = up ? py_upper(c) : py_lower(c);
  return encode(u);
}

std::string capitalize(const std::string& s) {
  std::u32string u = decode(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? py_upper(u[i]) : py_lower(u[i]);
  return encode(u);
}

std::string py_title(const std::string& s) {  // str.title
  std::u32string u = decode(s);
  bool prev = false;
  for (auto& c : u) {
    if (cased(c)) {
      c = prev ? py_lower(c) : py_upper(c);
      prev = true;
    } else {
      prev = false;
    }
  }
  return encode(u);
}

std::string filter_title(const std::string& s) {  // jinja2's title: words split at [-\s({\[<]+
  std::u32string u = decode(s);
  bool start = true;
  for (auto& c : u) {
    bool sep = c == '-' || py_isspace(c) || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      start = true;
    } else {
      c = start ? py_upper(c) : py_lower(c);
      start = false;
    }
  }
  return encode(u);
}

std::vector<std::string> split_ws(const std::string& s, int64_t maxsplit) {
  std::u32string u = decode(s);
  std::vector<std::string> out;
  size_t i = 0;
  while (i < u.size()) {
    while (i < u.size() && py_isspace(u[i])) ++i;
    if (i >= u.size()) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      size_t e = u.size();
      while (e > i && py_isspace(u[e - 1])) --e;
      out.push_back(encode(u.substr(i, e - i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !py_isspace(u[j])) ++j;
    out.push_back(encode(u.substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> split_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  if (sep.empty()) fail("empty separator");
  std::vector<std::string> out;
  size_t i = 0;
  for (;;) {
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) break;
    size_t j = s.find(sep, i);
    if (j == std::string::npos) break;
    out.push_back(s.substr(i, j - i));
    i = j + sep.size();
  }
  out.push_back(s.substr(i));
  return out;
}

std::vector<std::string> rsplit_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  if (sep.empty()) fail("empty separator");
  std::vector<std::string> out;
  size_t end = s.size();
  for (;;) {
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) break;
    if (end < sep.size()) break;
    size_t j = s.rfind(sep, end - sep.size());
    if (j == std::string::npos) break;
    out.push_back(s.substr(j + sep.size(), end - j - sep.size()));
    end = j;
  }
  out.push_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

Value str_list(const std::vector<std::string>& parts) {
  List l;
  for (auto& p : parts) l.push_back(Value::str(p));
  return Value::list(std::move(l));
}

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

std::vector<std::u32string> splitlines(const std::u32string& u, bool keepends = false) {
  std::vector<std::u32string> out;
  size_t i = 0, start = 0;
  while (i < u.size()) {
    if (is_line_break(u[i])) {
      size_t e = i + 1;
      if (u[i] == '\r' && e < u.size() && u[e] == '\n') ++e;
      out.push_back(u.substr(start, (keepends ? e : i) - start));
      start = i = e;
    } else {
      ++i;
    }
  }
  if (start < u.size()) out.push_back(u.substr(start));
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// jinja2's make_attrgetter: "a.b.0" looked up item by item (digits as integers).
Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t i = 0;
  for (;;) {
    size_t j = path.find('.', i);
    std::string part = path.substr(i, j == std::string::npos ? std::string::npos : j - i);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = get_item(cur, digits ? Value::integer(std::strtoll(part.c_str(), nullptr, 10)) : Value::str(part));
    if (j == std::string::npos) return cur;
    i = j + 1;
  }
}

// Sort key of sort/unique/min/max/dictsort: strings lowered unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_str()) return Value::str(map_case(v.str(), false));
  return v;
}

Value py_int(const Value& v, const Value& def, int base) {
  switch (v.kind) {
    case Value::k_int: return v;
    case Value::k_bool: return Value::integer(v.b);
    case Value::k_float:
      if (std::isfinite(v.f)) return Value::integer(int64_t(v.f));
      return def;
    case Value::k_str: {
      std::string s = strip_str(v.str(), nullptr);
      std::string t;
      for (char c : s)
        if (c != '_') t.push_back(c);
      if (!t.empty()) {
        char* end = nullptr;
        errno = 0;
        long long x = std::strtoll(t.c_str(), &end, base);
        if (*end == 0 && errno == 0) return Value::integer(x);
        double d = std::strtod(t.c_str(), &end);  // jinja2 falls back to int(float(s))
        if (*end == 0 && std::isfinite(d)) return Value::integer(int64_t(d));
      }
      return def;
    }
    default: return def;
  }
}

Value py_float(const Value& v, const Value& def) {
  switch (v.kind) {
    case Value::k_int: return Value::floating(double(v.i));
    case Value::k_bool: return Value::floating(v.b);
    case Value::k_float: return v;
    case Value::k_str: {
      std::string s = strip_str(v.str(), nullptr);
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == 0) return Value::floating(d);
      return def;
    }
    default: return def;
  }
}

std::string join(Interp&, const Value& seq, const std::string& sep, const Value* attribute) {
  std::string out;
  bool first = true;
  for (auto& e : iterate(seq)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute && attribute->kind != Value::k_none ? attr_path(e, to_str(*attribute)) : e);
    check_size(out.size());
  }
  return out;
}

// Python's str.format for the fields {} {0} {name} (with an optional !r/!s, no format spec).
std::string str_format(const std::string& fmt, const Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out.push_back('}');
      ++i;
    } else if (c == '{') {
      size_t close = fmt.find('}', i);
      if (close == std::string::npos) fail("Single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, close - i - 1);
      bool use_repr = false;
      size_t bang = field.find('!');
      if (bang != std::string::npos) {
        use_repr = field.substr(bang + 1) == "r";
        field = field.substr(0, bang);
      }
      if (field.find(':') != std::string::npos) field = field.substr(0, field.find(':'));
      const Value* v = nullptr;
      if (field.empty()) {
        if (auto_index >= a.pos.size()) fail("Replacement index " + std::to_string(auto_index) + " out of range for positional args tuple");
        v = &a.pos[auto_index++];
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        size_t k = std::strtoul(field.c_str(), nullptr, 10);
        if (k >= a.pos.size()) fail("Replacement index " + field + " out of range for positional args tuple");
        v = &a.pos[k];
      } else {
        for (auto& [k, e] : a.kw)
          if (k == field) v = &e;
        if (!v) fail("KeyError: '" + field + "'");
      }
      out += use_repr ? repr(*v) : to_str(*v);
      i = close;
    } else if (c == '}') {
      fail("Single '}' encountered in format string");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

Value unsafe(const Value& self, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + type_name(self) + "' object is unsafe.");
}

Value str_method(const Value& self, const std::string& name) {
  const std::string s = self.str();
  auto bind = [&](auto f) {
    return Value::func(name, [s, f](Interp&, Args& a) -> Value { return f(s, a); });
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    return bind([l, r](const std::string& x, Args& a) { return Value::str(strip_str(x, arg(a, 0, "chars"), l, r)); });
  }
  if (name == "split" || name == "rsplit") {
    bool right = name == "rsplit";
    return bind([right](const std::string& x, Args& a) {
      const Value* sep = arg(a, 0, "sep");
      int64_t maxsplit = int_arg(a, 1, "maxsplit", -1);
      if (!sep || sep->kind == Value::k_none) {
        if (!right || maxsplit < 0) return str_list(split_ws(x, maxsplit));
        // rsplit(None, n): split from the right
        std::vector<std::string> all = split_ws(x, -1);
        if (int64_t(all.size()) <= maxsplit + 1) return str_list(all);
        std::u32string u = decode(x);
        size_t e = u.size();
        while (e > 0 && py_isspace(u[e - 1])) --e;
        std::vector<std::string> out;
        for (int64_t k = 0; k < maxsplit; ++k) {
          size_t b = e;
          while (b > 0 && !py_isspace(u[b - 1])) --b;
          out.push_back(encode(u.substr(b, e - b)));
          e = b;
          while (e > 0 && py_isspace(u[e - 1])) --e;
        }
        size_t b = 0;
        while (b < e && py_isspace(u[b])) ++b;
        out.push_back(encode(u.substr(b, e - b)));
        std::reverse(out.begin(), out.end());
        return str_list(out);
      }
      if (!sep->is_str()) fail("must be str or None, not " + type_name(*sep));
      return str_list(right ? rsplit_sep(x, sep->str(), maxsplit) : split_sep(x, sep->str(), maxsplit));
    });
  }
  if (name == "startswith" || name == "endswith") {
    bool start = name == "startswith";
    return bind([start, name](const std::string& x, Args& a) {
      const Value* p = arg(a, 0, "prefix");
      if (!p) fail(name + "() takes at least 1 argument (0 given)");
      List options = p->kind == Value::k_list && p->is_tuple ? *p->l : List{*p};
      for (auto& o : options) {
        if (!o.is_str()) fail(name + " first arg must be str or a tuple of str, not " + type_name(o));
        const std::string& t = o.str();
        if (t.size() <= x.size() && (start ? x.compare(0, t.size(), t) == 0 : x.compare(x.size() - t.size(), t.size(), t) == 0))
          return Value::boolean(true);
      }
      return Value::boolean(false);
    });
  }
  if (name == "replace")
    return bind([](const std::string& x, Args& a) {
      std::string from = str_arg(a, 0, "old", ""), to = str_arg(a, 1, "new", "");
      int64_t count = int_arg(a, 2, "count", -1);
      std::string out;
      if (from.empty()) {  // Python inserts `to` between every character
        std::u32string u = decode(x);
        int64_t n = 0;
        for (size_t i = 0; i <= u.size(); ++i) {
          if (count < 0 || n < count) {
            out += to;
            ++n;
          }
          if (i < u.size()) out += encode(u.substr(i, 1));
          check_size(out.size());
        }
        return Value::str(out);
      }
      size_t i = 0;
      int64_t n = 0;
      for (;;) {
        size_t j = count >= 0 && n >= count ? std::string::npos : x.find(from, i);
        if (j == std::string::npos) break;
        out.append(x, i, j - i);
        out += to;
        check_size(out.size());
        i = j + from.size();
        ++n;
      }
      out.append(x, i, std::string::npos);
      return Value::str(out);
    });
  if (name == "upper" || name == "lower") {
    bool up = name == "upper";
    return bind([up](const std::string& x, Args&) { return Value::str(map_case(x, up)); });
  }
  if (name == "title") return bind([](const std::string& x, Args&) { return Value::str(py_title(x)); });
  if (name == "capitalize") return bind([](const std::string& x, Args&) { return Value::str(capitalize(x)); });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return bind([name](const std::string& x, Args& a) {
      std::string sub = str_arg(a, 0, "sub", "");
      std::u32string u = decode(x), w = decode(sub);
      if (name == "count") {
        if (w.empty()) return Value::integer(int64_t(u.size()) + 1);
        int64_t n = 0;
        for (size_t i = u.find(w); i != std::u32string::npos; i = u.find(w, i + w.size())) ++n;
        return Value::integer(n);
      }
      bool right = name[0] == 'r';
      size_t at = right ? u.rfind(w) : u.find(w);
      if (at == std::u32string::npos) {
        if (name == "index" || name == "rindex") fail("substring not found");
        return Value::integer(-1);
      }
      return Value::integer(int64_t(at));
    });
  }
  if (name == "join")
    return bind([](const std::string& x, Args& a) {
      const Value* seq = arg(a, 0, "iterable");
      if (!seq) fail("join() takes exactly one argument (0 given)");
      std::string out;
      bool first = true;
      for (auto& e : iterate(*seq)) {
        if (!e.is_str()) fail("sequence item: expected str instance, " + type_name(e) + " found");
        if (!first) out += x;
        first = false;
        out += e.str();
        check_size(out.size());
      }
      return Value::str(out);
    });
  if (name == "splitlines")
    return bind([](const std::string& x, Args& a) {
      List l;
      for (auto& line : splitlines(decode(x), bool_arg(a, 0, "keepends", false))) l.push_back(Value::str(encode(line)));
      return Value::list(std::move(l));
    });
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower" || name == "isnumeric" || name == "isdecimal") {
    return bind([name](const std::string& x, Args&) {
      std::u32string u = decode(x);
      if (u.empty()) return Value::boolean(false);
      if (name == "isupper" || name == "islower") {
        bool any = false;
        for (char32_t c : u) {
          if (name == "isupper" ? is_lower_c(c) : is_upper_c(c)) return Value::boolean(false);
          any = any || cased(c);
        }
        return Value::boolean(any);
      }
      for (char32_t c : u) {
        bool digit = c >= '0' && c <= '9';
        bool alpha = cased(c) || (c > 0x7f && !py_isspace(c) && c != 0x3000);
        bool ok = name == "isspace" ? py_isspace(c)
                  : name == "isalpha" ? alpha && !digit
                  : name == "isalnum" ? alpha || digit
                                      : digit;
        if (!ok) return Value::boolean(false);
      }
      return Value::boolean(true);
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    bool prefix = name == "removeprefix";
    return bind([prefix](const std::string& x, Args& a) {
      std::string t = str_arg(a, 0, prefix ? "prefix" : "suffix", "");
      if (t.size() <= x.size() && (prefix ? x.compare(0, t.size(), t) == 0 : x.compare(x.size() - t.size(), t.size(), t) == 0))
        return Value::str(prefix ? x.substr(t.size()) : x.substr(0, x.size() - t.size()));
      return Value::str(x);
    });
  }
  if (name == "partition" || name == "rpartition") {
    bool right = name == "rpartition";
    return bind([right](const std::string& x, Args& a) {
      std::string sep = str_arg(a, 0, "sep", "");
      if (sep.empty()) fail("empty separator");
      size_t at = right ? x.rfind(sep) : x.find(sep);
      if (at == std::string::npos)
        return right ? Value::list({Value::str(""), Value::str(""), Value::str(x)}, true)
                     : Value::list({Value::str(x), Value::str(""), Value::str("")}, true);
      return Value::list({Value::str(x.substr(0, at)), Value::str(sep), Value::str(x.substr(at + sep.size()))}, true);
    });
  }
  if (name == "zfill" || name == "ljust" || name == "rjust" || name == "center") {
    return bind([name](const std::string& x, Args& a) {
      int64_t width = int_arg(a, 0, "width", 0);
      std::string fill = name == "zfill" ? "0" : str_arg(a, 1, "fillchar", " ");
      int64_t n = int64_t(decode(x).size());
      if (width <= n) return Value::str(x);
      check_size(size_t(width) * fill.size());
      auto pad = [&](int64_t k) {
        std::string p;
        for (int64_t i = 0; i < k; ++i) p += fill;
        return p;
      };
      int64_t total = width - n;
      if (name == "ljust") return Value::str(x + pad(total));
      if (name == "rjust") return Value::str(pad(total) + x);
      if (name == "zfill") {
        if (!x.empty() && (x[0] == '-' || x[0] == '+')) return Value::str(x.substr(0, 1) + pad(total) + x.substr(1));
        return Value::str(pad(total) + x);
      }
      int64_t left = total / 2 + (total & width & 1);
      return Value::str(pad(left) + x + pad(total - left));
    });
  }
  if (name == "format")
    return bind([](const std::string& x, Args& a) { return Value::str(str_format(x, a)); });
  if (name == "encode" || name == "translate" || name == "maketrans" || name == "format_map") return unsafe(self, name);
  return {};
}

Value dict_method(const Value& self, const std::string& name) {
  std::shared_ptr<Dict> d = self.d;
  if (name == "items" || name == "keys" || name == "values") {
    int which = name == "items" ? 0 : name == "keys" ? 1 : 2;
    return Value::func(name, [d, which](Interp&, Args&) {
      List l;
      for (auto& [k, v] : d->items)
        l.push_back(which == 0 ? Value::list({k, v}, true) : which == 1 ? k : v);
      return Value::list(std::move(l));
    });
  }
  if (name == "get")
    return Value::func(name, [d](Interp&, Args& a) {
      const Value* k = arg(a, 0, "key");
      if (!k) fail("get expected at least 1 argument, got 0");
      if (const Value* v = d->find(*k)) return *v;
      return arg_or(a, 1, "default", Value::none());
    });
  if (name == "copy")
    return Value::func(name, [d](Interp&, Args&) { return Value::dict(std::make_shared<Dict>(*d)); });
  if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear" ||
      name == "fromkeys")
    return unsafe(self, name);
  return {};
}

Value list_method(const Value& self, const std::string& name) {
  std::shared_ptr<List> l = self.l;
  if (name == "index" || name == "count") {
    bool index = name == "index";
    return Value::func(name, [l, index](Interp&, Args& a) {
      const Value* x = arg(a, 0, "value");
      if (!x) fail("expected 1 argument, got 0");
      int64_t n = 0;
      for (size_t i = 0; i < l->size(); ++i)
        if (equal((*l)[i], *x)) {
          if (index) return Value::integer(int64_t(i));
          ++n;
        }
      if (index) fail(repr(*x) + " is not in list");
      return Value::integer(n);
    });
  }
  if (name == "copy" && !self.is_tuple)
    return Value::func(name, [l](Interp&, Args&) { return Value::list(*l); });
  if (!self.is_tuple && (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
                         name == "remove" || name == "reverse" || name == "sort" || name == "clear"))
    return unsafe(self, name);
  return {};
}

Value tojson(const Value& v, const Args& a) {
  DumpOptions o;
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  const Value* indent = arg(a, 1, "indent");
  if (indent && indent->kind != Value::k_none) {
    if (indent->is_str()) fail("tojson: an indent string is not supported");
    o.indent = int(std::clamp<int64_t>(int_arg(a, 1, "indent", 0), 0, 64));
    o.item_sep = ",";
  }
  if (const Value* seps = arg(a, 2, "separators"); seps && seps->kind != Value::k_none) {
    if (seps->kind != Value::k_list || seps->l->size() != 2) fail("tojson: separators must be a pair of strings");
    o.item_sep = to_str((*seps->l)[0]);
    o.key_sep = to_str((*seps->l)[1]);
  }
  o.sort_keys = bool_arg(a, 3, "sort_keys", false);
  if (const Value* ea = arg(a, 0, "ensure_ascii"); ea && truthy(*ea)) fail("tojson: ensure_ascii=True is not supported");
  return Value::str(dumps(v, o));
}

List select_items(Interp& in, const Value& seq, Args& a, bool by_attr, bool keep) {
  List out;
  size_t first_test = by_attr ? 1 : 0;
  std::string attribute = by_attr ? str_arg(a, 0, "attr", "") : "";
  if (by_attr && a.pos.empty()) fail("selectattr/rejectattr: missing the attribute");
  std::string test;
  Args targs;
  if (a.pos.size() > first_test) {
    test = to_str(a.pos[first_test]);
    targs.pos.assign(a.pos.begin() + long(first_test) + 1, a.pos.end());
    targs.kw = a.kw;
  }
  if (!truthy(seq)) return out;  // jinja2: `if value:` before iterating
  for (auto& e : iterate(seq)) {
    Value x = by_attr ? attr_path(e, attribute) : e;
    bool r = test.empty() ? truthy(x) : apply_test(in, test, x, targs);
    if (r == keep) out.push_back(e);
  }
  return out;
}

std::vector<Value> sorted(const List& items, bool case_sensitive, const Value* attribute, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& e : items) {
    Value k = attribute && attribute->kind != Value::k_none ? attr_path(e, to_str(*attribute)) : e;
    keyed.emplace_back(sort_key(k, case_sensitive), e);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first, "<") < 0 : compare(x.first, y.first, "<") < 0;
  });
  std::vector<Value> out;
  for (auto& [k, e] : keyed) out.push_back(e);
  return out;
}

double py_round(double x, int64_t digits, const std::string& method) {
  if (method == "common" && digits >= 0 && digits <= 300 && std::isfinite(x)) {
    // Python's round: the decimal nearest the exact binary value, ties to even; glibc's printf
    // rounds the same way
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", int(digits), x);
    return std::strtod(buf, nullptr);
  }
  double scale = std::pow(10.0, double(digits));
  double y = x * scale;
  if (method == "common") return std::nearbyint(y) / scale;
  if (method == "ceil") return std::ceil(y) / scale;
  if (method == "floor") return std::floor(y) / scale;
  fail("method must be 'common', 'ceil' or 'floor'");
}

std::string indent(const std::string& s, const Value& width, bool first, bool blank) {
  std::string ind = width.is_str() ? width.str() : std::string(size_t(std::clamp<int64_t>(width.kind == Value::k_int ? width.i : 4, 0, 1024)), ' ');
  std::vector<std::u32string> lines = splitlines(decode(s + "\n"));
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + encode(lines[i]);
  } else {
    rv = lines.empty() ? "" : encode(lines[0]);
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : ind + encode(lines[i]));
  }
  if (first) rv = ind + rv;
  check_size(rv.size());
  return rv;
}

const char* const filter_names[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
    "first", "float", "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list",
    "lower", "map", "max", "min", "pprint", "reject", "rejectattr", "replace", "reverse", "round", "safe",
    "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "truncate", "unique",
    "upper", "wordcount"};
const char* const test_names[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "filter",
    "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le", "lower", "lessthan", "lt",
    "mapping", "ne", "none", "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined",
    "upper", "==", "!=", "<", "<=", ">", ">="};

}  // namespace

bool is_filter(std::string_view name) {
  for (const char* f : filter_names)
    if (name == f) return true;
  return false;
}

bool is_test(std::string_view name) {
  for (const char* t : test_names)
    if (name == t) return true;
  return false;
}

Value method(const Value& self, const std::string& name) {
  if (!name.empty() && name[0] == '_') return unsafe(self, name);
  switch (self.kind) {
    case Value::k_str: return str_method(self, name);
    case Value::k_dict: return self.d->type == Dict::plain ? dict_method(self, name) : Value{};
    case Value::k_list: return list_method(self, name);
    default: return {};
  }
}

Value apply_filter(Interp& in, const std::string& name, Value v, Args& a) {
  auto need_str = [&]() { return to_str(v); };
  if (name == "default" || name == "d") {
    bool boolean = bool_arg(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !truthy(v))) return arg_or(a, 0, "default_value", Value::str(""));
    return v;
  }
  if (name == "length" || name == "count") return Value::integer(length(v));
  if (name == "string") return Value::str(need_str());
  if (name == "safe") return v;
  if (name == "trim") return Value::str(strip_str(need_str(), arg(a, 0, "chars")));
  if (name == "upper" || name == "lower") return Value::str(map_case(need_str(), name == "upper"));
  if (name == "capitalize") return Value::str(capitalize(need_str()));
  if (name == "title") return Value::str(filter_title(need_str()));
  if (name == "tojson") return tojson(v, a);
  if (name == "join") {
    if (v.is_undefined()) return Value::str("");
    return Value::str(join(in, v, str_arg(a, 0, "d", ""), arg(a, 1, "attribute")));
  }
  if (name == "list") return Value::list(iterate(v));
  if (name == "items") {
    if (v.is_undefined()) return Value::list({});
    if (v.kind != Value::k_dict || v.d->type != Dict::plain) fail("items: can only get items from a mapping, not " + type_name(v));
    List l;
    for (auto& [k, e] : v.d->items) l.push_back(Value::list({k, e}, true));
    return Value::list(std::move(l));
  }
  if (name == "first" || name == "last") {
    List items = iterate(v);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is_str()) {
      std::u32string u = decode(v.str());
      std::reverse(u.begin(), u.end());
      return Value::str(encode(u));
    }
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "select" || name == "reject") return Value::list(select_items(in, v, a, false, name == "select"));
  if (name == "selectattr" || name == "rejectattr") return Value::list(select_items(in, v, a, true, name == "selectattr"));
  if (name == "map") {
    List out;
    if (!truthy(v)) return Value::list({});
    const Value* attribute = nullptr;
    for (auto& [k, e] : a.kw)
      if (k == "attribute") attribute = &e;
    if (attribute) {
      const Value* def = nullptr;
      for (auto& [k, e] : a.kw)
        if (k == "default") def = &e;
      for (auto& e : iterate(v)) {
        Value x = attr_path(e, to_str(*attribute));
        out.push_back(x.is_undefined() && def ? *def : x);
      }
      return Value::list(std::move(out));
    }
    if (a.pos.empty()) fail("map requires a filter argument");
    std::string f = to_str(a.pos[0]);
    Args fargs;
    fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
    fargs.kw = a.kw;
    for (auto& e : iterate(v)) {
      Args copy = fargs;
      out.push_back(apply_filter(in, f, e, copy));
    }
    return Value::list(std::move(out));
  }
  if (name == "sort")
    return Value::list(sorted(iterate(v), bool_arg(a, 1, "case_sensitive", false), arg(a, 2, "attribute"),
                              bool_arg(a, 0, "reverse", false)));
  if (name == "dictsort") {
    if (v.kind != Value::k_dict || v.d->type != Dict::plain) fail("dictsort: can only sort a mapping, not " + type_name(v));
    bool cs = bool_arg(a, 0, "case_sensitive", false);
    std::string by = str_arg(a, 1, "by", "key");
    if (by != "key" && by != "value") fail("You can only sort by either 'key' or 'value'");
    bool rev = bool_arg(a, 2, "reverse", false);
    std::vector<std::pair<Value, Value>> items(v.d->items.begin(), v.d->items.end());
    std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
      const Value& kx = by == "key" ? x.first : x.second;
      const Value& ky = by == "key" ? y.first : y.second;
      int c = compare(sort_key(kx, cs), sort_key(ky, cs), "<");
      return rev ? c > 0 : c < 0;
    });
    List out;
    for (auto& [k, e] : items) out.push_back(Value::list({k, e}, true));
    return Value::list(std::move(out));
  }
  if (name == "unique") {
    bool cs = bool_arg(a, 0, "case_sensitive", false);
    const Value* attribute = arg(a, 1, "attribute");
    List out, seen;
    for (auto& e : iterate(v)) {
      Value k = sort_key(attribute && attribute->kind != Value::k_none ? attr_path(e, to_str(*attribute)) : e, cs);
      if ((k.kind == Value::k_list && !k.is_tuple) || k.kind == Value::k_dict) fail("unhashable type: '" + type_name(k) + "'");
      bool dup = false;
      for (auto& s : seen) dup = dup || equal(s, k);
      if (!dup) {
        seen.push_back(k);
        out.push_back(e);
      }
    }
    return Value::list(std::move(out));
  }
  if (name == "min" || name == "max") {
    List items = iterate(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    std::vector<Value> s = sorted(items, bool_arg(a, 0, "case_sensitive", false), arg(a, 1, "attribute"), false);
    return name == "min" ? s.front() : s.back();
  }
  if (name == "sum") {
    const Value* attribute = arg(a, 0, "attribute");
    Value total = arg_or(a, 1, "start", Value::integer(0));
    for (auto& e : iterate(v))
      total = binary_op("+", total, attribute && attribute->kind != Value::k_none ? attr_path(e, to_str(*attribute)) : e);
    return total;
  }
  if ((name == "int" || name == "float" || name == "abs" || name == "round") && v.is_undefined()) raise_undefined(v);
  if (name == "int") {
    Value def = arg_or(a, 0, "default", Value::integer(0));
    int64_t base = int_arg(a, 1, "base", 10);
    return py_int(v, def, int(base));
  }
  if (name == "float") return py_float(v, arg_or(a, 0, "default", Value::floating(0)));
  if (name == "abs") {
    if (v.kind == Value::k_int) return Value::integer(v.i < 0 ? -v.i : v.i);
    if (v.kind == Value::k_float) return Value::floating(std::fabs(v.f));
    if (v.kind == Value::k_bool) return Value::integer(v.b);
    fail("bad operand type for abs(): '" + type_name(v) + "'");
  }
  if (name == "round") {
    if (!v.is_number()) fail("round: must be a real number, not " + type_name(v));
    std::string how = str_arg(a, 1, "method", "common");
    int64_t digits = int_arg(a, 0, "precision", 0);
    if (how == "common" && v.kind != Value::k_float && digits >= 0) return Value::integer(v.kind == Value::k_int ? v.i : v.b);
    double x = v.kind == Value::k_float ? v.f : double(v.kind == Value::k_int ? v.i : v.b);
    return Value::floating(py_round(x, digits, how));
  }
  if (name == "replace") {
    Args m;
    m.pos = {arg_or(a, 0, "old", Value::str("")), arg_or(a, 1, "new", Value::str(""))};
    if (const Value* c = arg(a, 2, "count"); c && c->kind != Value::k_none) m.pos.push_back(*c);
    return call_value(in, method(Value::str(need_str()), "replace"), m);
  }
  if (name == "indent") {
    if (v.is_undefined()) raise_undefined(v);
    if (!v.is_str()) fail("indent: the input must be a string, not " + type_name(v));
    return Value::str(indent(need_str(), arg_or(a, 0, "width", Value::integer(4)), bool_arg(a, 1, "first", false),
                             bool_arg(a, 2, "blank", false)));
  }
  if (name == "center") {
    Args m;
    m.pos = {Value::integer(int_arg(a, 0, "width", 80))};
    return call_value(in, method(Value::str(need_str()), "center"), m);
  }
  if (name == "escape" || name == "e" || name == "forceescape") return Value::str(html_escape(need_str()));
  if (name == "format") {
    if (!a.kw.empty()) {
      auto d = std::make_shared<Dict>();
      for (auto& [k, e] : a.kw) d->items.emplace_back(Value::str(k), e);
      return percent_format(need_str(), Value::dict(d));
    }
    return percent_format(need_str(), Value::list(a.pos, true));
  }
  if (name == "attr") return get_attr(v, str_arg(a, 0, "name", ""));
  if (name == "pprint") return Value::str(repr(v));
  if (name == "wordcount") {  // jinja2 counts matches of \w+
    int64_t words = 0;
    bool in_word = false;
    for (char32_t c : decode(need_str())) {
      bool w = (c < 0x80 && (std::isalnum(int(c)) || c == '_')) || (c >= 0x80 && (cased(c) || (!py_isspace(c) && c >= 0x3000)));
      if (w && !in_word) ++words;
      in_word = w;
    }
    return Value::integer(words);
  }
  if (name == "truncate") {
    std::u32string u = decode(need_str());
    int64_t len = int_arg(a, 0, "length", 255);
    bool killwords = bool_arg(a, 1, "killwords", false);
    std::string end = str_arg(a, 2, "end", "...");
    int64_t leeway = int_arg(a, 3, "leeway", 5);
    int64_t end_len = int64_t(decode(end).size());
    if (len < end_len) fail("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(len));
    if (int64_t(u.size()) <= len + leeway) return Value::str(encode(u));
    std::u32string cut = u.substr(0, size_t(len - end_len));
    if (!killwords) {
      size_t sp = cut.rfind(U' ');
      if (sp != std::u32string::npos) cut = cut.substr(0, sp);
    }
    return Value::str(encode(cut) + end);
  }
  if (name == "batch") {
    int64_t n = int_arg(a, 0, "linecount", 1);
    if (n <= 0) fail("batch: linecount must be positive");
    const Value* fill = arg(a, 1, "fill_with");
    List out, cur;
    for (auto& e : iterate(v)) {
      cur.push_back(e);
      if (int64_t(cur.size()) == n) {
        out.push_back(Value::list(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (fill && fill->kind != Value::k_none)
        while (int64_t(cur.size()) < n) cur.push_back(*fill);
      out.push_back(Value::list(std::move(cur)));
    }
    return Value::list(std::move(out));
  }
  fail("No filter named '" + name + "'.");
}

bool apply_test(Interp& in, const std::string& name, const Value& v, Args& a) {
  static const char* const unary[] = {"defined", "undefined", "none", "string", "number", "integer", "float",
                                      "boolean", "true", "false", "mapping", "iterable", "sequence", "callable",
                                      "escaped", "odd", "even", "lower", "upper", "filter", "test"};
  for (const char* u : unary)
    if (name == u && (!a.pos.empty() || !a.kw.empty()))
      fail("test_" + name + "() takes 1 positional argument but " + std::to_string(1 + a.pos.size() + a.kw.size()) +
           " were given");
  auto other = [&]() -> const Value& {
    if (a.pos.empty()) fail("the test '" + name + "' needs an argument");
    return a.pos[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.kind == Value::k_none;
  if (name == "string") return v.is_str();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Value::k_int;
  if (name == "float") return v.kind == Value::k_float;
  if (name == "boolean") return v.kind == Value::k_bool;
  if (name == "true") return v.kind == Value::k_bool && v.b;
  if (name == "false") return v.kind == Value::k_bool && !v.b;
  if (name == "mapping") return v.kind == Value::k_dict && v.d->type == Dict::plain;
  if (name == "iterable")
    return v.is_undefined() || v.is_str() || v.kind == Value::k_list || (v.kind == Value::k_dict && v.d->type == Dict::plain);
  if (name == "sequence") return v.is_str() || v.kind == Value::k_list || (v.kind == Value::k_dict && v.d->type == Dict::plain);
  if (name == "callable") return v.kind == Value::k_func;
  if (name == "escaped") return false;
  if (name == "sameas") {
    const Value& o = other();
    if (v.kind != o.kind) return false;
    switch (v.kind) {
      case Value::k_list: return v.l == o.l;
      case Value::k_dict: return v.d == o.d;
      case Value::k_func: return v.fn == o.fn;
      case Value::k_str: return v.s == o.s || (v.s->size() <= 1 && *v.s == *o.s);
      default: return equal(v, o);
    }
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, other());
  if (name == "ne" || name == "!=") return !equal(v, other());
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, other(), "<") < 0;
  if (name == "le" || name == "<=") return compare(v, other(), "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, other(), ">") > 0;
  if (name == "ge" || name == ">=") return compare(v, other(), ">=") >= 0;
  if (name == "in") return contains(other(), v);
  if (name == "odd" || name == "even" || name == "divisibleby") {  // value % n, as jinja2
    if (name == "divisibleby") return equal(binary_op("%", v, other()), Value::integer(0));
    return equal(binary_op("%", v, Value::integer(2)), Value::integer(name == "odd" ? 1 : 0));
  }
  if (name == "lower" || name == "upper") {
    Args none;
    return truthy(call_value(in, method(Value::str(to_str(v)), name == "lower" ? "islower" : "isupper"), none));
  }
  if (name == "filter") return v.is_str() && is_filter(v.str());
  if (name == "test") return v.is_str() && is_test(v.str());
  fail("No test named '" + name + "'.");
}

}  // namespace strata::jinja
