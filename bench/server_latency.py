#!/usr/bin/env python3
"""The server's latency figures (docs/server.md, bench/RESULTS.md), against a running model:

  prompt cache   turn 1 of a chat whose history is about --history tokens, then turn 2 (turn 1,
                 the reply, a new question): time to first token of each, and the cached tokens
                 turn 2 reports (usage.prompt_tokens_details.cached_tokens).
  chunked prefill  a stream decodes; a --long-prompt-token prompt arrives: that stream's worst
                 gap between tokens while the prompt is evaluated, against its normal gap.

Starts `strata serve` itself (STRATA, default build/src/strata) with the given model and flags:

  bench/server_latency.py -m /data/q3-12l.gguf --chat-template-file tests/data/chat/templates/Qwen-Qwen3-0.6B.jinja
  bench/server_latency.py -m ... --old /work/base/build/src/strata   # alternated with an old binary

Standard library only. Prints one line per figure and a JSON summary on the last line.
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

WORDS = ("the river runs under old stone bridges while merchants argue about the price of salt and "
         "copper in the morning market near the harbour where ships from the south unload grain").split()


def filler(n_words, seed):
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(n_words))


class Server:
    def __init__(self, binary, args, log_path):
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([binary, "serve", "--port", "0"] + args, stdout=self.log, stderr=self.log)
        self.port = None
        for _ in range(1200):
            time.sleep(0.25)
            text = open(log_path).read()
            m = re.search(r"on http://127\.0\.0\.1:(\d+)/v1", text)
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                sys.exit("strata serve exited:\n" + text)
        if self.port is None:
            sys.exit("strata serve did not start: " + log_path)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()

    def stream(self, body, on_event):
        """POSTs a streamed chat completion; on_event(t, event) for each data chunk (t: seconds
        since the request was sent). Returns the elapsed time."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        t0 = time.monotonic()
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            sys.exit("HTTP %d: %s" % (r.status, r.read()[:500]))
        buf = b""
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            if on_event(time.monotonic() - t0, json.loads(data)) is False:
                break
        c.close()
        return time.monotonic() - t0


def has_text(ev):
    """A token arrived: text, or (the requests ask for logprobs) a token's logprobs, since the
    synthetic models' tokens often decode to no text; or the end when it was end-of-generation."""
    ch = ev.get("choices") or []
    if not ch:
        return False
    d = ch[0].get("delta", {})
    lp = (ch[0].get("logprobs") or {}).get("content")
    return bool(d.get("content") or d.get("reasoning_content") or d.get("tool_calls") or lp or ch[0].get("finish_reason"))


def turn(server, messages, max_tokens):
    """One streamed turn: (time to first token, reply text, usage)."""
    out = {"ttft": None, "text": "", "usage": None}

    def on(t, ev):
        if has_text(ev) and out["ttft"] is None:
            out["ttft"] = t
        for ch in ev.get("choices") or []:
            d = ch.get("delta", {})
            out["text"] += d.get("content") or ""
        if ev.get("usage"):
            out["usage"] = ev["usage"]

    server.stream({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                   "ignore_eos": True, "logprobs": True, "stream_options": {"include_usage": True}}, on)
    return out


def prompt_cache(server, history_words, reply_tokens):
    messages = [{"role": "system", "content": "You are a careful assistant. " + filler(40, 1)}]
    per_turn = max(20, history_words // 12)
    i = 0
    while sum(len(m["content"].split()) for m in messages) < history_words:
        messages.append({"role": "user", "content": filler(per_turn, 2 * i + 2) + " ?"})
        messages.append({"role": "assistant", "content": filler(per_turn, 2 * i + 3) + "."})
        i += 1
    messages.append({"role": "user", "content": "What did the merchants argue about?"})
    t1 = turn(server, messages, reply_tokens)
    messages.append({"role": "assistant", "content": t1["text"]})
    messages.append({"role": "user", "content": "And where did the ships come from?"})
    t2 = turn(server, messages, reply_tokens)
    return t1, t2


def chunked_prefill(server, long_words, decode_tokens):
    times = []
    stop = threading.Event()

    def on(t, ev):
        if has_text(ev):
            times.append(t)
        return not stop.is_set()

    a = threading.Thread(target=lambda: server.stream(
        {"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": decode_tokens,
         "temperature": 0, "stream": True, "ignore_eos": True, "logprobs": True}, on))
    a.start()
    while len(times) < 12:
        time.sleep(0.05)
    t_start = times[-1]
    normal = sorted(times[j + 1] - times[j] for j in range(2, len(times) - 1))
    b = {"ttft": None}
    t0 = time.monotonic()
    res = turn(server, [{"role": "user", "content": filler(long_words, 9)}], 1)
    b_time = time.monotonic() - t0
    n_during = len(times)
    time.sleep(1.0)
    stop.set()
    a.join()
    # the gaps of the decoding stream while the long prompt was evaluated
    during = [times[j + 1] - times[j] for j in range(len(times) - 1) if times[j] >= t_start]
    return {"normal_gap_s": normal[len(normal) // 2], "worst_gap_s": max(during) if during else None,
            "long_prompt_tokens": res["usage"]["prompt_tokens"] if res["usage"] else None,
            "long_prompt_s": b_time, "tokens_during": n_during}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--chat-template-file", default="")
    ap.add_argument("--binary", default=os.environ.get("STRATA", "build/src/strata"))
    ap.add_argument("--history", type=int, default=1000, help="words of chat history (about 1.7 tokens each here)")
    ap.add_argument("--reply", type=int, default=16, help="tokens of each reply")
    ap.add_argument("--long-prompt", type=int, default=2400, help="words of the long prompt (0: skip)")
    ap.add_argument("--chunk", type=int, default=None, help="server.prefill_chunk (default: the server's, 512)")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--set", action="append", default=[], help="config overrides passed to strata serve")
    ap.add_argument("--skip-cache", action="store_true")
    args = ap.parse_args()
    flags = ["-m", args.model, "--ctx", str(args.ctx), "--max-sequences", "2"]
    if args.chunk is not None:
        flags += ["--set", "server.prefill_chunk=%d" % args.chunk]
    if args.chat_template_file:
        flags += ["--chat-template-file", args.chat_template_file]
    for s in args.set:
        flags += ["--set", s]
    server = Server(args.binary, flags, "/tmp/strata-server-latency.log")
    summary = {"binary": args.binary, "model": args.model, "chunk": args.chunk}
    try:
        if not args.skip_cache:
            t1, t2 = prompt_cache(server, args.history, args.reply)
            u1, u2 = t1["usage"] or {}, t2["usage"] or {}
            c2 = (u2.get("prompt_tokens_details") or {}).get("cached_tokens")
            print("prompt cache: turn 1 %d prompt tokens, first token after %.2f s; turn 2 %d prompt tokens "
                  "(%s cached), first token after %.2f s: %.1fx" %
                  (u1.get("prompt_tokens", -1), t1["ttft"], u2.get("prompt_tokens", -1), c2, t2["ttft"],
                   t1["ttft"] / t2["ttft"]))
            summary.update(turn1_ttft_s=t1["ttft"], turn2_ttft_s=t2["ttft"], turn1_prompt=u1.get("prompt_tokens"),
                           turn2_prompt=u2.get("prompt_tokens"), turn2_cached=c2)
        if args.long_prompt > 0:
            r = chunked_prefill(server, args.long_prompt, 100000)
            n = r["long_prompt_tokens"] or 1
            chunk = 512 if args.chunk is None else args.chunk
            r["chunk_s"] = r["long_prompt_s"] * min(chunk or n, n) / n
            print("chunked prefill (chunk %d): a %s-token prompt took %.1f s (%.2f s a chunk); the decoding "
                  "stream's normal gap %.3f s, worst gap meanwhile %.3f s (normal + one chunk: %.2f s)" %
                  (chunk, r["long_prompt_tokens"], r["long_prompt_s"], r["chunk_s"], r["normal_gap_s"],
                   r["worst_gap_s"] or -1, r["normal_gap_s"] + r["chunk_s"]))
            summary.update(r)
    finally:
        server.stop()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
