#!/usr/bin/env python3
"""The demo model's quality table (bench/RESULTS.md, issue #31): perplexity on the held-out books
for each quant, KL divergence and top-1 agreement against the F32 model's exact path (a base file
written first) and against each file's own exact path (--kl-exact), then the Q8_0 file under each
KV cache type and each ISA this CPU has.

    python3 bench/demo_quality.py --dir build/demo [--strata build/src/strata] [--chunks 0]

--dir holds strata-demo-{F32,Q8_0,...}.gguf and heldout.txt (scripts/train-demo.sh writes them).
Prints a markdown table; every figure is one `strata perplexity --json` run, named in a footnote.
"""
import argparse
import json
import os
import subprocess
import sys

QUANTS = ["F32", "Q8_0", "Q6_K", "Q4_K_M", "Q4_0", "MXFP4_MOE"]


def ppl(strata, model, text, extra, env=None, chunks=0):
    cmd = [strata, "perplexity", "-m", model, "-f", text, "--json"] + extra
    if chunks:
        cmd += ["--chunks", str(chunks)]
    run_env = dict(os.environ)
    run_env.pop("STRATA_MODEL", None)
    run_env.update(env or {})
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=run_env).stdout
    return json.loads(out)


def isas():
    flags = open("/proc/cpuinfo").read()
    out = ["scalar"]
    if " avx2" in flags:
        out.append("avx2")
    if " avx512f" in flags and " avx512bw" in flags:
        out.append("avx512")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--strata", default="build/src/strata")
    ap.add_argument("--chunks", type=int, default=0, help="0: every chunk of the held-out text")
    a = ap.parse_args()
    text = os.path.join(a.dir, "heldout.txt")
    f = lambda q: os.path.join(a.dir, f"strata-demo-{q}.gguf")  # noqa: E731
    base = os.path.join(a.dir, "base-F32-exact.klb")
    if os.path.exists(base):
        os.remove(base)
    ref = ppl(a.strata, f("F32"), text, ["--exact", "--kl-base", base], chunks=a.chunks)
    print(f"reference: F32 exact path, perplexity {ref['perplexity']:.4f} over {ref['tokens_scored']} tokens "
          f"({ref['chunks']} chunks of {ref['n_ctx']})\n")
    print("| file | size | PPL (default path) | PPL (exact path) | KL vs F32 exact | top-1 vs F32 exact "
          "| KL vs own exact | top-1 vs own exact | RMS dp vs own exact |")
    print("|---|---|---|---|---|---|---|---|---|")
    for q in QUANTS:
        if not os.path.exists(f(q)):
            continue
        vs_f32 = ppl(a.strata, f(q), text, ["--kl-base", base], chunks=a.chunks)
        vs_own = ppl(a.strata, f(q), text, ["--kl-exact"], chunks=a.chunks)
        print(f"| {q} | {os.path.getsize(f(q)) / 1e6:.2f} MB | {vs_f32['perplexity']:.4f} | "
              f"{vs_own['perplexity_ref']:.4f} | {vs_f32['kl_mean']:.6f} | {vs_f32['top1_agreement']:.4f} | "
              f"{vs_own['kl_mean']:.6f} | {vs_own['top1_agreement']:.4f} | {vs_own['rms_dp']:.4f} |")
        sys.stdout.flush()
    print("\n| Q8_0, default path | PPL | KL vs own exact | top-1 vs own exact | KL vs F32 exact |")
    print("|---|---|---|---|---|")
    for kv in ["f16", "f32"]:
        own = ppl(a.strata, f("Q8_0"), text, ["--kl-exact", "--set", f"model.kv_type={kv}"], chunks=a.chunks)
        vs = ppl(a.strata, f("Q8_0"), text, ["--kl-base", base, "--set", f"model.kv_type={kv}"], chunks=a.chunks)
        print(f"| KV {kv} | {own['perplexity']:.4f} | {own['kl_mean']:.6f} | {own['top1_agreement']:.4f} | "
              f"{vs['kl_mean']:.6f} |")
    for isa in isas():
        own = ppl(a.strata, f("Q8_0"), text, ["--kl-exact"], env={"STRATA_ISA": isa}, chunks=a.chunks)
        vs = ppl(a.strata, f("Q8_0"), text, ["--kl-base", base], env={"STRATA_ISA": isa}, chunks=a.chunks)
        print(f"| ISA {isa} | {own['perplexity']:.4f} | {own['kl_mean']:.6f} | {own['top1_agreement']:.4f} | "
              f"{vs['kl_mean']:.6f} |")


if __name__ == "__main__":
    main()
