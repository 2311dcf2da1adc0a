// The Jinja evaluator: renders the syntax tree with jinja2's scoping (a for loop, a macro and a
// with block are scopes of their own; if is not), its loop object, macros with caller(), and
// the globals transformers gives a chat template. Bounded: macro recursion, loop steps, range
// sizes and the output size all have limits, past which the render is an error.
#include <chrono>

#include "jinja/internal.h"

namespace strata::jinja {

struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> vars;

  Value* find(const std::string& n) {
    for (Frame* f = this; f; f = f->parent.get())
      for (auto& [k, v] : f->vars)
        if (k == n) return &v;
    return nullptr;
  }
  void set(const std::string& n, Value v) {
    for (auto& [k, e] : vars)
      if (k == n) {
        e = std::move(v);
        return;
      }
    vars.emplace_back(n, std::move(v));
  }
};

struct Template::Impl {
  std::vector<Node> nodes;
};

namespace {

constexpr int max_call_depth = 64;
constexpr uint64_t max_steps = 5'000'000;
constexpr int64_t max_range = 100'000;  // jinja2's sandbox MAX_RANGE

enum class Flow { normal, break_, continue_ };

}  // namespace

struct Interp {
  std::shared_ptr<Frame> frame;
  int call_depth = 0;
  uint64_t steps = 0;
  // What can close a reference cycle: a macro holds the frame it was defined in (which holds the
  // macro), and a namespace can be given itself or a macro. Emptied when the render ends, so the
  // cycles come apart (Python's collector does this for jinja2).
  std::vector<std::shared_ptr<Frame>> macro_frames;
  std::vector<std::shared_ptr<Dict>> assigned_namespaces;

  ~Interp() {
    for (auto& d : assigned_namespaces) d->items.clear();
    for (auto& f : macro_frames) f->vars.clear();
  }

  void step() {
    if (++steps > max_steps) fail("the template ran more than " + std::to_string(max_steps) + " steps");
  }

  // ---- expressions

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::literal: return e.value;
      case Expr::variable: {
        if (Value* v = frame->find(e.name)) return *v;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::list:
      case Expr::tuple: {
        List l;
        for (auto& k : e.kids) l.push_back(eval(*k));
        return Value::list(std::move(l), e.kind == Expr::tuple);
      }
      case Expr::dict: {
        auto d = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
          Value k = eval(*e.kids[i]);
          if (k.kind == Value::k_list && !k.is_tuple) fail("unhashable type: 'list'");
          if (k.kind == Value::k_dict) fail("unhashable type: 'dict'");
          d->set(k, eval(*e.kids[i + 1]));
        }
        return Value::dict(std::move(d));
      }
      case Expr::attr: return get_attr(eval(*e.kids[0]), e.name);
      case Expr::item: return get_item(eval(*e.kids[0]), eval(*e.kids[1]));
      case Expr::slice: {
        Value obj = eval(*e.kids[0]);
        auto part = [&](size_t i) { return e.kids[i] ? eval(*e.kids[i]) : Value::none(); };
        return slice(obj, part(1), part(2), part(3));
      }
      case Expr::call: {
        Value callee = eval(*e.kids[0]);
        Args a = eval_args(e, 1);
        return call_value(*this, callee, a);
      }
      case Expr::filter: return eval_filter(e, nullptr);
      case Expr::test: {
        Value v = eval(*e.kids[0]);
        Args a = eval_args(e, 1);
        if (!is_test(e.name)) fail("No test named '" + e.name + "'.");
        return Value::boolean(apply_test(*this, e.name, v, a));
      }
      case Expr::neg:
      case Expr::pos: {
        Value v = eval(*e.kids[0]);
        if (v.is_undefined()) raise_undefined(v);
        if (!v.is_number()) fail(std::string("bad operand type for unary ") + (e.kind == Expr::neg ? "-" : "+") + ": '" + type_name(v) + "'");
        if (e.kind == Expr::pos) return v.kind == Value::k_bool ? Value::integer(v.b) : v;
        if (v.kind == Value::k_float) return Value::floating(-v.f);
        const int64_t x = v.kind == Value::k_int ? v.i : int64_t(v.b);
        if (x == INT64_MIN) fail("integer overflow: the result does not fit in 64 bits");
        return Value::integer(-x);
      }
      case Expr::not_: return Value::boolean(!truthy(eval(*e.kids[0])));
      case Expr::and_: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? eval(*e.kids[1]) : a;
      }
      case Expr::or_: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? a : eval(*e.kids[1]);
      }
      case Expr::binary: {
        Value a = eval(*e.kids[0]);
        return binary_op(e.name, a, eval(*e.kids[1]));
      }
      case Expr::concat: {
        std::string s = to_str(eval(*e.kids[0]));
        s += to_str(eval(*e.kids[1]));
        check_size(s.size());
        return Value::str(std::move(s));
      }
      case Expr::compare: {
        Value left = eval(*e.kids[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.kids[i + 1]);
          const std::string& op = e.ops[i];
          bool r;
          if (op == "==") r = equal(left, right);
          else if (op == "!=") r = !equal(left, right);
          else if (op == "in") r = contains(right, left);
          else if (op == "notin") r = !contains(right, left);
          else {
            int c = compare(left, right, op.c_str());
            r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!r) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::cond: {
        if (truthy(eval(*e.kids[0]))) return eval(*e.kids[1]);
        if (e.kids[2]) return eval(*e.kids[2]);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
      }
    }
    fail("unknown expression");
  }

  // A filter chain; `body` is the input of its innermost filter where that has none (filter and
  // set blocks).
  Value eval_filter(const Expr& e, const Value* body) {
    Value input;
    if (!e.kids[0]) {
      if (!body) fail("a filter without input");
      input = *body;
    } else if (e.kids[0]->kind == Expr::filter) {
      input = eval_filter(*e.kids[0], body);
    } else {
      input = eval(*e.kids[0]);
    }
    Args a = eval_args(e, 1);
    return apply_filter(*this, e.name, std::move(input), a);
  }

  Args eval_args(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.kids.size(); ++i) a.pos.push_back(eval(*e.kids[i]));
    for (auto& [k, x] : e.kwargs) {
      Value v = eval(*x);
      if (k == "*") {
        for (auto& item : iterate(v)) a.pos.push_back(item);
      } else if (k == "**") {
        if (v.kind != Value::k_dict || v.d->type != Dict::plain) fail("argument after ** must be a mapping, not " + type_name(v));
        for (auto& [dk, dv] : v.d->items) a.kw.emplace_back(to_str(dk), dv);
      } else {
        a.kw.emplace_back(k, std::move(v));
      }
    }
    return a;
  }

  // ---- statements

  void assign(const Target& t, Value v) {
    if (!t.attr.empty()) {
      Value* ns = frame->find(t.names[0]);
      if (!ns || ns->kind != Value::k_dict || ns->d->type != Dict::name_space)
        fail("cannot assign attribute on non-namespace object");
      ns->d->set(Value::str(t.attr), std::move(v));
      assigned_namespaces.push_back(ns->d);
      return;
    }
    if (!t.tuple) {
      frame->set(t.names[0], std::move(v));
      return;
    }
    List items = iterate(v);
    if (items.size() != t.names.size())
      fail(items.size() < t.names.size()
               ? "not enough values to unpack (expected " + std::to_string(t.names.size()) + ", got " + std::to_string(items.size()) + ")"
               : "too many values to unpack (expected " + std::to_string(t.names.size()) + ")");
    for (size_t i = 0; i < items.size(); ++i) frame->set(t.names[i], items[i]);
  }

  struct Scope {  // a child frame for the lifetime of a block
    Interp& in;
    std::shared_ptr<Frame> saved;
    Scope(Interp& i, std::shared_ptr<Frame> parent) : in(i), saved(i.frame) {
      auto f = std::make_shared<Frame>();
      f->parent = std::move(parent);
      in.frame = std::move(f);
    }
    ~Scope() { in.frame = saved; }
  };

  std::string render_body(const std::vector<Node>& body) {
    std::string out;
    exec(body, out);
    return out;
  }

  Flow exec(const std::vector<Node>& nodes, std::string& out) {
    for (const Node& n : nodes) {
      step();
      Flow f = exec(n, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  void append(std::string& out, std::string_view s) {
    out += s;
    check_size(out.size());
  }

  Flow exec(const Node& n, std::string& out) {
    switch (n.kind) {
      case Node::data: append(out, n.text); return Flow::normal;
      case Node::output: append(out, to_str(eval(*n.expr))); return Flow::normal;
      case Node::if_:
        return exec(truthy(eval(*n.expr)) ? n.body : n.else_body, out);
      case Node::for_: return exec_for(n, eval(*n.expr), 0, out);
      case Node::set: assign(n.target, eval(*n.expr)); return Flow::normal;
      case Node::set_block: {
        Value body;
        {
          Scope s(*this, frame);
          body = Value::str(render_body(n.body));
        }
        if (!n.filters.empty()) body = eval_filter(*n.filters[0], &body);
        assign(n.target, std::move(body));
        return Flow::normal;
      }
      case Node::macro: frame->set(n.text, make_macro(n, n.text)); return Flow::normal;
      case Node::call_block: {
        Value caller = make_macro(n, "caller");
        const Expr& call = *n.expr;
        Value callee = eval(*call.kids[0]);
        Args a = eval_args(call, 1);
        a.kw.emplace_back("caller", caller);
        append(out, to_str(call_value(*this, callee, a)));
        return Flow::normal;
      }
      case Node::filter_block: {
        Value body;
        {
          Scope s(*this, frame);
          body = Value::str(render_body(n.body));
        }
        append(out, to_str(eval_filter(*n.filters[0], &body)));
        return Flow::normal;
      }
      case Node::with: {
        Scope s(*this, frame);
        for (auto& [t, e] : n.assigns) assign(t, eval(*e));
        return exec(n.body, out);
      }
      case Node::break_: return Flow::break_;
      case Node::continue_: return Flow::continue_;
    }
    return Flow::normal;
  }

  Flow exec_for(const Node& n, const Value& iterable, int depth, std::string& out) {
    if (iterable.kind == Value::k_none || iterable.kind == Value::k_int || iterable.kind == Value::k_float ||
        iterable.kind == Value::k_bool || iterable.kind == Value::k_func)
      fail("'" + type_name(iterable) + "' object is not iterable");
    List items = iterate(iterable);
    std::shared_ptr<Frame> outer = frame;
    if (n.cond) {
      List kept;
      for (auto& item : items) {
        step();
        Scope s(*this, outer);
        assign(n.target, item);
        if (truthy(eval(*n.cond))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body, out);  // in the enclosing scope
    int64_t len = int64_t(items.size());
    // One loop object for the whole loop, advanced in place, as jinja2's LoopContext is.
    auto d = std::make_shared<Dict>();
    d->type = Dict::loop;
    static const char* const keys[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                                       "depth", "depth0", "previtem", "nextitem", "cycle"};
    for (const char* k : keys) d->items.emplace_back(Value::str(k), Value::none());
    auto at = std::make_shared<int64_t>(0);
    d->items[6].second = Value::integer(len);
    d->items[7].second = Value::integer(depth + 1);
    d->items[8].second = Value::integer(depth);
    d->items[11].second = Value::func("cycle", [at](Interp&, Args& a) -> Value {
      if (a.pos.empty()) fail("no items for cycling given");
      return a.pos[size_t(*at) % a.pos.size()];
    });
    if (n.recursive) {
      const Node* node = &n;
      d->items.emplace_back(Value::str("__call__"), Value::func("loop", [node, depth](Interp& in, Args& a) -> Value {
        if (a.pos.size() != 1) fail("the recursive loop takes one argument");
        if (++in.call_depth > max_call_depth)
          fail("the recursive loop nests deeper than " + std::to_string(max_call_depth) + " levels");
        std::string s;
        in.exec_for(*node, a.pos[0], depth + 1, s);
        --in.call_depth;
        return Value::str(std::move(s));
      }));
    }
    const Value loop = Value::dict(d);
    bool body_completed = false;
    for (int64_t i = 0; i < len; ++i) {
      step();
      // each iteration is a scope of its own: what the body sets is gone at the next one
      Scope scope(*this, outer);
      *at = i;
      d->items[0].second = Value::integer(i + 1);
      d->items[1].second = Value::integer(i);
      d->items[2].second = Value::integer(len - i);
      d->items[3].second = Value::integer(len - i - 1);
      d->items[4].second = Value::boolean(i == 0);
      d->items[5].second = Value::boolean(i == len - 1);
      d->items[9].second = i > 0 ? items[size_t(i - 1)] : Value::undefined("there is no previous item");
      d->items[10].second = i + 1 < len ? items[size_t(i + 1)] : Value::undefined("there is no next item");
      frame->set("loop", loop);
      assign(n.target, items[size_t(i)]);
      Flow f = exec(n.body, out);
      if (f == Flow::break_) break;
      if (f == Flow::normal) body_completed = true;
    }
    // jinja2 runs the else block when no iteration reached the end of the body: an empty loop,
    // but also one whose every pass ended in continue, or that broke out in its first pass
    if (!body_completed) {
      frame = outer;
      return exec(n.else_body, out);
    }
    return Flow::normal;
  }

  Value make_macro(const Node& n, const std::string& name) {
    const Node* node = &n;
    std::shared_ptr<Frame> defined_in = frame;
    macro_frames.push_back(frame);
    return Value::func(
        name,
        [node, defined_in, name](Interp& in, Args& a) -> Value {
          if (++in.call_depth > max_call_depth)
            fail("the macro '" + name + "' recursed deeper than " + std::to_string(max_call_depth) + " levels");
          std::shared_ptr<Frame> saved = in.frame;
          auto f = std::make_shared<Frame>();
          f->parent = defined_in;
          in.frame = f;
          struct Restore {
            Interp& in;
            std::shared_ptr<Frame> saved;
            ~Restore() {
              in.frame = saved;
              --in.call_depth;
            }
          } restore{in, saved};
          std::vector<bool> used_kw(a.kw.size(), false);
          for (size_t i = 0; i < node->params.size(); ++i) {
            const auto& [pname, def] = node->params[i];
            Value v;
            bool found = false;
            if (i < a.pos.size()) {
              v = a.pos[i];
              found = true;
            } else {
              for (size_t k = 0; k < a.kw.size(); ++k)
                if (a.kw[k].first == pname) {
                  v = a.kw[k].second;
                  used_kw[k] = true;
                  found = true;
                }
            }
            if (!found) v = def ? in.eval(*def) : Value::undefined("parameter '" + pname + "' was not provided");
            f->set(pname, std::move(v));
          }
          List extra;
          for (size_t i = node->params.size(); i < a.pos.size(); ++i) extra.push_back(a.pos[i]);
          f->set("varargs", Value::list(std::move(extra), true));
          auto kwargs = std::make_shared<Dict>();
          for (size_t k = 0; k < a.kw.size(); ++k) {
            if (used_kw[k]) continue;
            if (a.kw[k].first == "caller") {
              f->set("caller", a.kw[k].second);
              continue;
            }
            kwargs->items.emplace_back(Value::str(a.kw[k].first), a.kw[k].second);
          }
          f->set("kwargs", Value::dict(kwargs));
          std::string out;
          in.exec(node->body, out);
          return Value::str(std::move(out));
        },
        true);
  }
};

Value call_value(Interp& in, const Value& fn, Args& args) {
  if (fn.is_undefined()) raise_undefined(fn);
  if (fn.kind == Value::k_dict && fn.d->type == Dict::loop) {
    if (const Value* c = fn.d->find(std::string_view("__call__"))) return c->fn->call(in, args);
    fail("the loop is not recursive: add 'recursive' to the for tag to call loop()");
  }
  if (fn.kind != Value::k_func) fail("'" + type_name(fn) + "' object is not callable");
  in.step();
  return fn.fn->call(in, args);
}

namespace {

void add_globals(Frame& g, const RenderOptions& o) {
  g.set("range", Value::func("range", [](Interp&, Args& a) -> Value {
          auto num = [&](size_t i) {
            const Value& v = a.pos[i];
            if (v.kind != Value::k_int && v.kind != Value::k_bool)
              fail("'" + type_name(v) + "' object cannot be interpreted as an integer");
            return v.kind == Value::k_int ? v.i : int64_t(v.b);
          };
          if (a.pos.empty() || a.pos.size() > 3) fail("range expected 1 to 3 arguments, got " + std::to_string(a.pos.size()));
          int64_t start = 0, stop, stepv = 1;
          if (a.pos.size() == 1) {
            stop = num(0);
          } else {
            start = num(0);
            stop = num(1);
            if (a.pos.size() == 3) stepv = num(2);
          }
          if (stepv == 0) fail("range() arg 3 must not be zero");
          using wide = __int128;  // no overflow at the ends of the 64-bit range
          const wide span = stepv > 0 ? wide(stop) - wide(start) : wide(start) - wide(stop);
          const wide st = stepv > 0 ? wide(stepv) : -wide(stepv);
          const wide count = span > 0 ? (span + st - 1) / st : 0;
          if (count > max_range) fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
          const int64_t n = int64_t(count);
          List l;
          for (int64_t k = 0; k < n; ++k) l.push_back(Value::integer(start + k * stepv));
          return Value::list(std::move(l));
        }));
  auto make_dict = [](Args& a, Dict::Type type) {
    auto d = std::make_shared<Dict>();
    d->type = type;
    for (auto& p : a.pos) {
      if (p.kind != Value::k_dict) fail("the positional argument must be a mapping, not " + type_name(p));
      for (auto& [k, v] : p.d->items) d->set(k, v);
    }
    for (auto& [k, v] : a.kw) d->set(Value::str(k), v);
    return Value::dict(d);
  };
  g.set("dict", Value::func("dict", [make_dict](Interp&, Args& a) { return make_dict(a, Dict::plain); }));
  g.set("namespace", Value::func("namespace", [make_dict](Interp&, Args& a) { return make_dict(a, Dict::name_space); }));
  g.set("raise_exception", Value::func("raise_exception", [](Interp&, Args& a) -> Value {
          fail(a.pos.empty() ? std::string("raise_exception() called") : to_str(a.pos[0]));
        }));
  std::optional<std::tm> now = o.now;
  g.set("strftime_now", Value::func("strftime_now", [now](Interp&, Args& a) -> Value {
          if (a.pos.empty() || !a.pos[0].is_str()) fail("strftime_now expects a format string");
          std::tm t{};
          if (now) {
            t = *now;
          } else {
            std::time_t s = std::time(nullptr);
            localtime_r(&s, &t);
          }
          const std::string& fmt = a.pos[0].str();
          if (fmt.empty()) return Value::str("");
          std::string buf(fmt.size() * 8 + 64, '\0');
          size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &t);
          buf.resize(n);
          return Value::str(buf);
        }));
  g.set("joiner", Value::func("joiner", [](Interp&, Args& a) -> Value {
          std::string sep = a.pos.empty() ? ", " : to_str(a.pos[0]);
          auto used = std::make_shared<bool>(false);
          return Value::func("joiner", [sep, used](Interp&, Args&) {
            if (!*used) {
              *used = true;
              return Value::str("");
            }
            return Value::str(sep);
          });
        }));
}

}  // namespace

Result<Template> Template::parse(std::string_view source) {
  try {
    auto impl = std::make_shared<Impl>();
    impl->nodes = parse_template(source);
    Template t;
    t.impl_ = std::move(impl);
    return t;
  } catch (const TemplateError& e) {
    return Error{e.message};
  }
}

Result<std::string> Template::render(const Json& context, const RenderOptions& o) const {
  if (!impl_) return Error{"render of an unparsed template"};
  if (!context.is_object()) return Error{"the template context must be a JSON object"};
  try {
    Interp in;
    auto globals = std::make_shared<Frame>();
    add_globals(*globals, o);
    for (auto& [k, v] : context.items()) globals->set(k, from_json(v));
    in.frame = std::make_shared<Frame>();
    in.frame->parent = globals;
    std::string out;
    in.exec(impl_->nodes, out);
    return out;
  } catch (const TemplateError& e) {
    return Error{e.message};
  }
}

}  // namespace strata::jinja
