#!/usr/bin/env python3
"""Python's jinja2 as transformers' apply_chat_template configures it: the oracle of strata's
Jinja engine (src/jinja).

    oracle.py update CASES.json      fill each case's "expected" (or "error") from jinja2
    oracle.py render TEMPLATE CONTEXT.json

A case is {"name", "template", "context"?}; update adds "expected": TEXT, or "error": MSG where
jinja2 raises (MSG is str(exception), what strata's Template::render puts in its Error)."""
import copy
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime(2026, 12, 2, 9, 30, 0)


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, template, context):
    """("expected", text) or ("error", message)."""
    try:
        # a copy: some jinja2 filters change their input (indent appends "\n" to a list)
        return "expected", env.from_string(template).render(**copy.deepcopy(context))
    except Exception as e:  # every jinja2 failure: syntax, undefined, type, sandbox, raise_exception
        return "error", str(e) or type(e).__name__


def main():
    env = environment()
    if len(sys.argv) == 3 and sys.argv[1] == "update":
        with open(sys.argv[2]) as f:
            cases = json.load(f)
        for c in cases:
            c.pop("expected", None)
            c.pop("error", None)
            kind, text = render(env, c["template"], c.get("context", {}))
            c[kind] = text
        with open(sys.argv[2], "w") as f:
            json.dump(cases, f, indent=1, ensure_ascii=False)
            f.write("\n")
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "render":
        with open(sys.argv[2]) as f:
            template = f.read()
        with open(sys.argv[3]) as f:
            context = json.load(f)
        kind, text = render(env, template, context)
        if kind == "error":
            print(text, file=sys.stderr)
            return 1
        sys.stdout.write(text)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
