#!/usr/bin/env python3
"""Differential test of strata's Jinja engine against Python's jinja2: random programs built from
the constructs chat templates use (whitespace control, loops, conditions, set, namespace, macros,
filters, tests, methods, operators over str/int/float/list/dict/None/Undefined), rendered by
jinja2 (oracle.py's environment) and by strata (the Jinja.CasesRenderAsJinja2Does test, pointed
at the generated cases by $STRATA_JINJA_CASES). Both must render the same bytes, or both fail.

    differential.py STRATA_TESTS [--n N] [--seed S] [--keep FILE]

Exit 0: all agree; 1: a disagreement (gtest prints each); 77: python3-jinja2 missing (skip)."""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import oracle
except ImportError:
    print("differential: python3-jinja2 is not installed; skipping", file=sys.stderr)
    sys.exit(77)

STRINGS = ["", "a", "Hello", " pad ", "x,y,,z", "é✓ü", "line1\nline2", "<tag>", "it's", 'q"d', "  \n\t ",
           "UPPER", "MiXeD case", "3", "4.5", "a-b(c[d"]
KEYS = ["role", "content", "name", "type", "items", "x", "tool_calls", "arguments"]


class Gen:
    def __init__(self, rng):
        self.r = rng
        self.depth = 0

    def pick(self, xs):
        return self.r.choice(xs)

    def lit(self):
        k = self.r.randrange(9)
        if k == 0:
            return str(self.r.randrange(-5, 20))
        if k == 1:
            return self.pick(["0.5", "1.0", "2.25", "-3.5", "1e3", "0.1"])
        if k == 2:
            return json.dumps(self.pick(STRINGS), ensure_ascii=False)
        if k == 3:
            return self.pick(["none", "true", "false", "True", "None"])
        if k == 4 and self.depth < 3:
            return "[" + ", ".join(self.expr() for _ in range(self.r.randrange(4))) + "]"
        if k == 5 and self.depth < 3:
            return "{" + ", ".join("%s: %s" % (json.dumps(self.pick(KEYS)), self.expr()) for _ in range(self.r.randrange(3))) + "}"
        if k == 6:
            return "(" + self.expr() + ",)" if self.depth < 3 else "1"
        return self.pick(["s", "n", "f", "l", "d", "m", "missing", "u", "e"])

    def expr(self):
        self.depth += 1
        try:
            if self.depth > 4:
                return self.lit()
            k = self.r.randrange(14)
            if k < 4:
                return self.lit()
            if k == 4:
                return "%s %s %s" % (self.expr(), self.pick(["+", "-", "*", "/", "//", "%", "~", "**"]), self.expr())
            if k == 5:
                return "%s %s %s" % (self.expr(), self.pick(["==", "!=", "<", ">", "<=", ">=", "in", "not in"]), self.expr())
            if k == 6:
                return "(%s %s %s)" % (self.expr(), self.pick(["and", "or"]), self.expr())
            if k == 7:
                return "(%s if %s else %s)" % (self.expr(), self.expr(), self.expr())
            if k == 8:
                return "%s is %s%s" % (self.lit(), self.pick(["", "not "]), self.pick(
                    ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable",
                     "sequence", "boolean", "odd", "even", "true", "false", "callable", "lower", "upper",
                     "divisibleby 2", "eq 3", "in [1, 'a']", "sameas none"]))
            if k == 9:
                return "%s | %s" % (self.lit(), self.pick(
                    ["length", "string", "trim", "upper", "lower", "title", "capitalize", "list", "first", "last",
                     "reverse | list", "sort | list", "unique | list", "join(',')", "default('D')", "default('D', true)",
                     "int", "float", "abs", "round(1)", "tojson", "tojson(indent=2)", "items | list", "dictsort",
                     "sum", "min", "max", "count", "wordcount", "replace('a', 'b')", "indent(2)",
                     "center(7)", "batch(2) | list", "select | list", "reject('none') | list",
                     "map('string') | list", "selectattr('x') | list", "map(attribute='role') | list",
                     "format(1)"]))
            if k == 10:  # on a variable: jinja2 folds a literal's subscript at compile time, to Undefined
                return "%s[%s]" % (self.pick(["s", "n", "f", "l", "d", "m", "u", "e"]), self.pick(["0", "-1", "1:", ":-1", "::-1", "'role'", "'x'", "1:3", "::2"]))
            if k == 11:
                return "%s.%s" % (self.lit(), self.pick(
                    ["role", "x", "strip()", "split(',')", "split()", "upper()", "startswith('a')", "endswith('')",
                     "replace('a', 'A')", "lstrip('H')", "rstrip()", "find('l')", "count('l')", "items() | list",
                     "keys() | list", "values() | list", "get('role')", "get('zz', 0)", "title()", "splitlines()",
                     "index(1)", "isdigit()", "format(1, 2)", "rsplit(',', 1)"]))
            if k == 12:
                return "(%s)" % self.expr()
            return "%s %% %s" % (json.dumps(self.pick(["%s", "%d", "%s-%s", "%r", "%5.1f", "%x"])), self.lit())
        finally:
            self.depth -= 1

    def ws(self, open_):
        return self.pick(["", "", "-", "+"]) if open_ else self.pick(["", "", "-"])

    def text(self):
        return self.pick(["", "t", " ", "\n", "  \n", "\n    ", "x\n  ", " y ", "\n\n"])

    def block(self, level=0):
        out = []
        for _ in range(self.r.randrange(1, 4)):
            out.append(self.text())
            k = self.r.randrange(9 if level < 3 else 4)
            if k <= 1:
                out.append("{{%s %s %s}}" % (self.pick(["", "-"]), self.expr(), self.pick(["", "-"])))
            elif k == 2:
                # names of its own: jinja2 lets a macro see a name its scope assigns later as Undefined,
                # not as the context's value (a corner strata does not copy)
                out.append("{%%%s set %s = %s %s%%}" % (self.ws(1), self.pick(["v", "w", "z"]), self.expr(), self.ws(0)))
            elif k == 3:
                out.append("{#%s comment %s#}" % (self.pick(["", "-"]), self.pick(["", "-"])))
            elif k == 4:
                out.append("{%%%s if %s %s%%}%s{%%%s elif %s %s%%}%s{%%%s else %s%%}%s{%%%s endif %s%%}" % (
                    self.ws(1), self.expr(), self.ws(0), self.block(level + 1), self.ws(1), self.expr(), self.ws(0),
                    self.block(level + 1), self.ws(1), self.ws(0), self.block(level + 1), self.ws(1), self.ws(0)))
            elif k == 5:
                out.append("{%%%s for %s in %s%s %s%%}%s{%%%s else %s%%}%s{%%%s endfor %s%%}" % (
                    self.ws(1), self.pick(["i", "v", "k"]), self.pick(["l", "s", "d", "m", "range(3)", "[1, 'a', none]", "missing", "'ab'"]),
                    self.pick(["", " if i", " if v is string"]) if False else "",
                    self.ws(0), self.block(level + 1) + self.pick(["", "{{ loop.index }}{{ loop.last }}", "{{ loop.previtem }}", "{% if loop.first %}F{% endif %}", "{% if loop.index > 1 %}{% break %}{% endif %}", "{% continue %}"]),
                    self.ws(1), self.ws(0), self.block(level + 1), self.ws(1), self.ws(0)))
            elif k == 6:
                out.append("{%% set ns = namespace(c=0) %%}{%% for i in %s %%}{%% set ns.c = ns.c + 1 %%}{%% endfor %%}{{ ns.c }}" % self.pick(["l", "s", "d", "range(4)", "missing"]))
            elif k == 7:
                out.append("{%% macro mac(a, b=%s) %%}%s[{{ a }}|{{ b }}]{%% endmacro %%}{{ mac(%s) }}{{ mac(%s, b=%s) }}" % (
                    self.lit(), self.block(level + 1), self.expr(), self.lit(), self.lit()))
            else:
                out.append("{%% filter %s %%}%s{%% endfilter %%}" % (self.pick(["upper", "trim", "lower", "title"]), self.block(level + 1)))
        out.append(self.text())
        return "".join(out)


CONTEXT = {
    "s": "Hello, World", "n": 7, "f": 2.5, "u": None, "e": "",
    "l": [3, "b", None, 1.5, True],
    "d": {"role": "user", "content": "hi", "x": [1, 2], "items": "shadow"},
    "m": [{"role": "system", "content": " be brief "}, {"role": "user", "content": "é?", "x": 1},
          {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {"a": 1}}]}],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("strata_tests")
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--keep", help="write the generated cases here")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    env = oracle.environment()
    g = Gen(rng)
    cases = []
    for i in range(a.n):
        template = g.block()
        kind, text = oracle.render(env, template, CONTEXT)
        c = {"name": "random_%d" % i, "template": template, "context": CONTEXT, kind: text}
        if kind == "error":
            c["any_message"] = True
        cases.append(c)
    errors = sum(1 for c in cases if "error" in c)
    print("differential: %d random programs (seed %d), %d of them raise in jinja2" % (a.n, a.seed, errors))
    path = a.keep or tempfile.mkstemp(suffix=".json")[1]
    with open(path, "w") as f:
        json.dump(cases, f, ensure_ascii=False)
    env_vars = dict(os.environ, STRATA_JINJA_CASES=path)
    r = subprocess.run([a.strata_tests, "--gtest_filter=Jinja.CasesRenderAsJinja2Does"], env=env_vars,
                       capture_output=True, text=True)
    if not a.keep:
        os.unlink(path)
    if r.returncode != 0:
        print(r.stdout[-20000:])
        print("differential: strata and jinja2 disagree (rerun with --keep FILE to see the cases)")
        return 1
    print("differential: strata and jinja2 agree on all %d" % a.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
