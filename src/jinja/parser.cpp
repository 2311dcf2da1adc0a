// The Jinja parser: jinja2's grammar (parser.py) for expressions and the statements chat templates
// use: if/elif/else, for (with else, a filter condition and recursive), set (names, tuples,
// namespace attributes, blocks), macro, call, filter, with, break/continue, and transformers'
// generation block.
#include "jinja/internal.h"

namespace strata::jinja {
namespace {

constexpr int max_depth = 200;  // nesting of expressions and blocks: deeper is a syntax error

struct Parser {
  std::vector<Token> toks;
  size_t i = 0;
  int depth = 0;

  struct Guard {
    Parser& p;
    explicit Guard(Parser& q) : p(q) {
      if (++p.depth > max_depth) p.error("the template nests deeper than " + std::to_string(max_depth) + " levels");
    }
    ~Guard() { --p.depth; }
  };

  const Token& cur() const { return toks[i]; }
  const Token& peek(size_t k = 1) const { return toks[std::min(i + k, toks.size() - 1)]; }
  [[noreturn]] void error(const std::string& what) const { fail("line " + std::to_string(cur().line) + ": " + what); }

  bool is_op(const char* op) const { return cur().type == Token::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Token::name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++i;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++i;
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Token::data: return "template data";
      case Token::var_begin: return "'{{'";
      case Token::var_end: return "end of print statement";
      case Token::block_begin: return "'{%'";
      case Token::block_end: return "end of statement block";
      case Token::eof: return "end of template";
      case Token::string: return "string";
      case Token::integer: return "integer";
      case Token::floating: return "float";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) error(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Token::name) error("expected a name, got " + describe(cur()));
    return toks[i++].text;
  }
  void expect_block_end() {
    if (cur().type != Token::block_end) error("expected end of statement block, got " + describe(cur()));
    ++i;
  }

  ExprP make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---- expressions

  ExprP expression(bool with_cond = true) {
    Guard g(*this);
    int line = cur().line;
    ExprP e = or_expr();
    if (!with_cond) return e;
    while (skip_name("if")) {
      ExprP test = or_expr();
      ExprP other;
      if (skip_name("else")) other = expression();
      ExprP c = make(Expr::cond, line);
      c->kids.push_back(std::move(test));
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(other));  // may be null: Undefined
      e = std::move(c);
    }
    return e;
  }

  ExprP or_expr() {
    ExprP e = and_expr();
    while (is_name("or")) {
      int line = cur().line;
      ++i;
      ExprP o = make(Expr::or_, line);
      o->kids.push_back(std::move(e));
      o->kids.push_back(and_expr());
      e = std::move(o);
    }
    return e;
  }

  ExprP and_expr() {
    ExprP e = not_expr();
    while (is_name("and")) {
      int line = cur().line;
      ++i;
      ExprP o = make(Expr::and_, line);
      o->kids.push_back(std::move(e));
      o->kids.push_back(not_expr());
      e = std::move(o);
    }
    return e;
  }

  ExprP not_expr() {
    Guard g(*this);
    if (is_name("not")) {
      int line = cur().line;
      ++i;
      ExprP o = make(Expr::not_, line);
      o->kids.push_back(not_expr());
      return o;
    }
    return compare();
  }

  ExprP compare() {
    int line = cur().line;
    ExprP e = math1();
    ExprP c;
    for (;;) {
      std::string op;
      if (cur().type == Token::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                      cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = toks[i++].text;
      } else if (is_name("in")) {
        ++i;
        op = "in";
      } else if (is_name("not") && peek().type == Token::name && peek().text == "in") {
        i += 2;
        op = "notin";
      } else {
        break;
      }
      if (!c) {
        c = make(Expr::compare, line);
        c->kids.push_back(std::move(e));
      }
      c->ops.push_back(op);
      c->kids.push_back(math1());
    }
    return c ? std::move(c) : std::move(e);
  }

  ExprP binary(ExprP l, std::string op, ExprP r, int line) {
    ExprP b = make(op == "~" ? Expr::concat : Expr::binary, line);
    b->name = std::move(op);
    b->kids.push_back(std::move(l));
    b->kids.push_back(std::move(r));
    return b;
  }

  ExprP math1() {
    ExprP e = concat();
    while (is_op("+") || is_op("-")) {
      int line = cur().line;
      std::string op = toks[i++].text;
      e = binary(std::move(e), op, concat(), line);
    }
    return e;
  }

  ExprP concat() {
    ExprP e = math2();
    while (is_op("~")) {
      int line = cur().line;
      ++i;
      e = binary(std::move(e), "~", math2(), line);
    }
    return e;
  }

  ExprP math2() {
    ExprP e = pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      int line = cur().line;
      std::string op = toks[i++].text;
      e = binary(std::move(e), op, pow(), line);
    }
    return e;
  }

  ExprP pow() {
    ExprP e = unary();
    while (is_op("**")) {
      int line = cur().line;
      ++i;
      e = binary(std::move(e), "**", unary(), line);
    }
    return e;
  }

  ExprP unary(bool with_filter = true) {
    Guard g(*this);
    int line = cur().line;
    ExprP e;
    if (is_op("-") || is_op("+")) {
      Expr::Kind k = is_op("-") ? Expr::neg : Expr::pos;
      ++i;
      e = make(k, line);
      e->kids.push_back(unary(false));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filter_expr(std::move(e));
    return e;
  }

  ExprP primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == Token::name) {
      ++i;
      ExprP e = make(Expr::literal, line);
      if (t.text == "true" || t.text == "True") e->value = Value::boolean(true);
      else if (t.text == "false" || t.text == "False") e->value = Value::boolean(false);
      else if (t.text == "none" || t.text == "None") e->value = Value::none();
      else {
        e->kind = Expr::variable;
        e->name = t.text;
      }
      return e;
    }
    if (t.type == Token::string) {
      std::string s;
      while (cur().type == Token::string) s += toks[i++].text;  // adjacent literals join
      ExprP e = make(Expr::literal, line);
      e->value = Value::str(std::move(s));
      return e;
    }
    if (t.type == Token::integer || t.type == Token::floating) {
      ++i;
      ExprP e = make(Expr::literal, line);
      e->value = t.type == Token::integer ? Value::integer(t.ival) : Value::floating(t.fval);
      return e;
    }
    if (skip_op("(")) {
      ExprP e = tuple(true, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      ExprP e = make(Expr::list, line);
      while (!is_op("]")) {
        if (!e->kids.empty()) expect_op(",");
        if (is_op("]")) break;
        e->kids.push_back(expression());
      }
      expect_op("]");
      return e;
    }
    if (skip_op("{")) {
      ExprP e = make(Expr::dict, line);
      while (!is_op("}")) {
        if (!e->kids.empty()) expect_op(",");
        if (is_op("}")) break;
        e->kids.push_back(expression());
        expect_op(":");
        e->kids.push_back(expression());
      }
      expect_op("}");
      return e;
    }
    error("unexpected " + describe(t));
  }

  // A tuple where commas make one (jinja2's parse_tuple); `explicit_parens`: inside ( ), where ()
  // is the empty tuple.
  ExprP tuple(bool with_cond = true, bool explicit_parens = false, bool simplified = false) {
    int line = cur().line;
    std::vector<ExprP> items;
    bool comma = false;
    for (;;) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        comma = true;
      }
      if (tuple_end(explicit_parens)) break;
      items.push_back(simplified ? primary() : expression(with_cond));
    }
    if (!comma) {
      if (items.size() == 1) return std::move(items[0]);
      if (!explicit_parens) error("expected an expression, got " + describe(cur()));
    }
    ExprP e = make(Expr::tuple, line);
    e->kids = std::move(items);
    return e;
  }

  bool tuple_end(bool parens) const {
    if (cur().type == Token::var_end || cur().type == Token::block_end || cur().type == Token::eof) return true;
    if (parens && is_op(")")) return true;
    return is_name("in");
  }

  ExprP postfix(ExprP e) {
    for (;;) {
      int line = cur().line;
      if (skip_op(".")) {
        ExprP a = make(Expr::attr, line);
        if (cur().type == Token::name) {
          a->name = toks[i++].text;
        } else if (cur().type == Token::integer) {  // foo.0 is foo[0]
          a->kind = Expr::item;
          ExprP k = make(Expr::literal, line);
          k->value = Value::integer(toks[i++].ival);
          a->kids.push_back(std::move(e));
          a->kids.push_back(std::move(k));
          e = std::move(a);
          continue;
        } else {
          error("expected a name after '.', got " + describe(cur()));
        }
        a->kids.push_back(std::move(e));
        e = std::move(a);
      } else if (skip_op("[")) {
        std::vector<ExprP> subs;
        while (!is_op("]")) {
          if (!subs.empty()) expect_op(",");
          subs.push_back(subscript());
        }
        expect_op("]");
        if (subs.empty()) error("expected a subscript");
        ExprP idx;
        if (subs.size() == 1) {
          idx = std::move(subs[0]);
        } else {
          idx = make(Expr::tuple, line);
          idx->kids = std::move(subs);
        }
        if (idx->kind == Expr::slice) {
          idx->kids.insert(idx->kids.begin(), std::move(e));
          e = std::move(idx);
        } else {
          ExprP it = make(Expr::item, line);
          it->kids.push_back(std::move(e));
          it->kids.push_back(std::move(idx));
          e = std::move(it);
        }
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // obj[a], obj[a:b:c]: a slice node holds start, stop, step (each may be null)
  ExprP subscript() {
    int line = cur().line;
    ExprP start;
    if (!is_op(":")) {
      start = expression();
      if (!is_op(":")) return start;
    }
    ++i;  // ':'
    ExprP s = make(Expr::slice, line);
    ExprP stop, step;
    if (!is_op("]") && !is_op(",") && !is_op(":")) stop = expression();
    if (skip_op(":"))
      if (!is_op("]") && !is_op(",")) step = expression();
    s->kids.push_back(std::move(start));
    s->kids.push_back(std::move(stop));
    s->kids.push_back(std::move(step));
    return s;
  }

  // Call arguments into `e` (kids after the first, kwargs); *args and **kwargs as "*" and "**".
  void call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (skip_op("**")) {
        e.kwargs.emplace_back("**", expression());
      } else if (skip_op("*")) {
        e.kwargs.emplace_back("*", expression());
      } else if (cur().type == Token::name && peek().type == Token::op && peek().text == "=") {
        std::string k = toks[i].text;
        i += 2;
        e.kwargs.emplace_back(std::move(k), expression());
      } else {
        if (!e.kwargs.empty() && e.kwargs.back().first != "*")
          error("a positional argument after a keyword argument");
        e.kids.push_back(expression());
      }
    }
    expect_op(")");
  }

  ExprP call(ExprP callee) {
    ExprP c = make(Expr::call, cur().line);
    c->kids.push_back(std::move(callee));
    call_args(*c);
    return c;
  }

  ExprP filter_expr(ExprP e) {
    for (;;) {
      if (is_op("|")) {
        e = filter(std::move(e));
      } else if (is_name("is")) {
        e = test(std::move(e));
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // `| name(args)`, chained; `input` null in a filter block or set block
  ExprP filter(ExprP input) {
    while (skip_op("|")) {
      int line = cur().line;
      std::string name = expect_name();
      while (skip_op(".")) name += "." + expect_name();
      ExprP f = make(Expr::filter, line);
      f->name = name;
      f->kids.push_back(std::move(input));
      if (is_op("(")) call_args(*f);
      input = std::move(f);
    }
    return input;
  }

  ExprP test(ExprP input) {
    int line = cur().line;
    ++i;  // is
    bool negated = skip_name("not");
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    ExprP t = make(Expr::test, line);
    t->name = name;
    t->kids.push_back(std::move(input));
    const Token& c = cur();
    if (is_op("(")) {
      call_args(*t);
    } else if ((c.type == Token::name || c.type == Token::string || c.type == Token::integer ||
                c.type == Token::floating || is_op("[") || is_op("{")) &&
               !(c.type == Token::name && (c.text == "else" || c.text == "or" || c.text == "and"))) {
      if (is_name("is")) error("you cannot chain multiple tests with is");
      t->kids.push_back(postfix(primary()));
    }
    if (!negated) return t;
    ExprP n = make(Expr::not_, line);
    n->kids.push_back(std::move(t));
    return n;
  }

  // ---- statements

  Target target(bool with_tuple, bool allow_attr) {
    Target t;
    std::string n = expect_name();
    if (allow_attr && is_op(".")) {
      ++i;
      t.names.push_back(n);
      t.attr = expect_name();
      return t;
    }
    t.names.push_back(n);
    if (with_tuple) {
      while (skip_op(",")) {
        t.tuple = true;
        if (cur().type != Token::name) break;
        t.names.push_back(expect_name());
      }
    }
    if (is_op("(")) error("can't assign to a call");
    return t;
  }

  // Parses nodes until one of `ends` (names of block tags) and returns which one ended it; the
  // tag's name is consumed, its block end is not.
  std::string body(std::vector<Node>& out, std::initializer_list<const char*> ends) {
    Guard g(*this);
    for (;;) {
      const Token& t = cur();
      if (t.type == Token::eof) {
        if (ends.size() == 0) return {};
        std::string want;
        for (const char* e : ends) want += std::string(want.empty() ? "" : " or ") + "'" + e + "'";
        error("unexpected end of template, expected " + want);
      }
      if (t.type == Token::data) {
        Node n;
        n.kind = Node::data;
        n.line = t.line;
        n.text = t.text;
        out.push_back(std::move(n));
        ++i;
        continue;
      }
      if (t.type == Token::var_begin) {
        Node n;
        n.kind = Node::output;
        n.line = t.line;
        ++i;
        n.expr = tuple();
        if (cur().type != Token::var_end) error("expected end of print statement, got " + describe(cur()));
        ++i;
        out.push_back(std::move(n));
        continue;
      }
      if (t.type != Token::block_begin) error("unexpected " + describe(t));
      ++i;
      if (cur().type != Token::name) error("expected a statement name, got " + describe(cur()));
      std::string name = cur().text;
      for (const char* e : ends)
        if (name == e) {
          ++i;
          return name;
        }
      ++i;
      out.push_back(statement(name));
    }
  }

  Node statement(const std::string& name) {
    Node n;
    n.line = toks[i - 1].line;
    if (name == "if") {
      n.kind = Node::if_;
      n.expr = tuple();
      expect_block_end();
      Node* at = &n;
      for (;;) {
        std::string end = body(at->body, {"elif", "else", "endif"});
        if (end == "elif") {
          Node e;
          e.kind = Node::if_;
          e.line = toks[i - 1].line;
          e.expr = tuple();
          expect_block_end();
          at->else_body.push_back(std::move(e));
          at = &at->else_body.back();
          continue;
        }
        if (end == "else") {
          expect_block_end();
          body(at->else_body, {"endif"});
        }
        expect_block_end();
        return n;
      }
    }
    if (name == "for") {
      n.kind = Node::for_;
      n.target = target(true, false);
      if (!skip_name("in")) error("expected 'in', got " + describe(cur()));
      n.expr = tuple(false);
      if (skip_name("if")) n.cond = expression();
      n.recursive = skip_name("recursive");
      expect_block_end();
      std::string end = body(n.body, {"endfor", "else"});
      if (end == "else") {
        expect_block_end();
        body(n.else_body, {"endfor"});
      }
      expect_block_end();
      return n;
    }
    if (name == "set") {
      n.target = target(true, true);
      if (skip_op("=")) {
        n.kind = Node::set;
        n.expr = tuple();
        expect_block_end();
        return n;
      }
      n.kind = Node::set_block;
      if (n.target.tuple || !n.target.attr.empty()) error("a set block assigns one name");
      if (is_op("|")) n.filters.push_back(filter(nullptr));
      expect_block_end();
      body(n.body, {"endset"});
      expect_block_end();
      return n;
    }
    if (name == "macro" || name == "call") {
      n.kind = name == "macro" ? Node::macro : Node::call_block;
      if (n.kind == Node::macro) n.text = expect_name();
      if (n.kind == Node::macro || is_op("(")) {
        expect_op("(");
        while (!is_op(")")) {
          if (!n.params.empty()) expect_op(",");
          std::string p = expect_name();
          ExprP def;
          if (skip_op("=")) def = expression();
          n.params.emplace_back(std::move(p), std::move(def));
        }
        expect_op(")");
      }
      if (n.kind == Node::call_block) {
        n.expr = expression();
        if (n.expr->kind != Expr::call) error("expected a call after {% call %}");
      }
      expect_block_end();
      body(n.body, {n.kind == Node::macro ? "endmacro" : "endcall"});
      expect_block_end();
      return n;
    }
    if (name == "filter") {
      n.kind = Node::filter_block;
      // the first filter without a leading '|'
      int line = cur().line;
      std::string fname = expect_name();
      ExprP f = make(Expr::filter, line);
      f->name = fname;
      f->kids.push_back(nullptr);
      if (is_op("(")) call_args(*f);
      n.filters.push_back(filter(std::move(f)));
      expect_block_end();
      body(n.body, {"endfilter"});
      expect_block_end();
      return n;
    }
    if (name == "with") {
      n.kind = Node::with;
      while (cur().type != Token::block_end) {
        if (!n.assigns.empty()) expect_op(",");
        Target t = target(false, false);
        expect_op("=");
        n.assigns.emplace_back(std::move(t), expression());
      }
      expect_block_end();
      body(n.body, {"endwith"});
      expect_block_end();
      return n;
    }
    if (name == "generation") {  // transformers' AssistantTracker: renders its body
      n.kind = Node::with;
      expect_block_end();
      body(n.body, {"endgeneration"});
      expect_block_end();
      return n;
    }
    if (name == "break" || name == "continue") {
      n.kind = name == "break" ? Node::break_ : Node::continue_;
      expect_block_end();
      return n;
    }
    error("unknown tag '" + name + "'");
  }
};

// break/continue outside a loop is a syntax error, as in jinja2.
void check_loops(const std::vector<Node>& nodes, bool in_loop) {
  for (const Node& n : nodes) {
    if ((n.kind == Node::break_ || n.kind == Node::continue_) && !in_loop)
      fail("line " + std::to_string(n.line) + ": '" + (n.kind == Node::break_ ? "break" : "continue") +
           "' outside a loop");
    bool body_in_loop = n.kind == Node::for_ || (in_loop && n.kind != Node::macro && n.kind != Node::call_block);
    check_loops(n.body, body_in_loop);
    check_loops(n.else_body, n.kind == Node::for_ ? in_loop : body_in_loop);
  }
}

}  // namespace

std::vector<Node> parse_template(std::string_view source) {
  Parser p;
  p.toks = tokenize(source);
  std::vector<Node> nodes;
  p.body(nodes, {});
  check_loops(nodes, false);
  return nodes;
}

}  // namespace strata::jinja
