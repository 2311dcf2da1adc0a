"""Byte-level BPE in GPT-2's form: the same pre-tokenizer, byte-to-unicode map and merge rule that
llama.cpp applies for tokenizer.ggml.pre = "gpt-2", so strata and llama.cpp tokenize the text the way
training did.

The corpus is ASCII (the King James text as Debian packages it), where GPT-2's \\p{L} and \\p{N}
classes are [A-Za-z] and [0-9]; train() refuses other text rather than pre-tokenize it differently.
"""
import collections
import re

# GPT-2's pattern with its Unicode classes written for ASCII.
PRETOKENIZE = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable code points."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_CHARS = bytes_to_unicode()


def words_of(text):
    """The pre-tokenized pieces of text, each as its byte-level string."""
    return ["".join(BYTE_CHARS[b] for b in piece.encode("utf-8")) for piece in PRETOKENIZE.findall(text)]


def train(text, n_merges, progress=None):
    """Learns n_merges merges from text: repeatedly the most frequent adjacent pair (ties: the
    lexicographically largest pair, so the result depends on the text alone)."""
    if not text.isascii():
        raise ValueError("bpe.train: the corpus must be ASCII (see the module's docstring)")
    counts = collections.Counter(words_of(text))
    words = [list(w) for w in counts]
    freq = list(counts.values())
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            pairs[p] += freq[i]
            where[p].add(i)
    merges = []
    for step in range(n_merges):
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        joined = a + b
        touched = set()
        for i in where.pop((a, b)):
            w, c = words[i], freq[i]
            for p in zip(w, w[1:]):
                pairs[p] -= c
                touched.add(p)
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(joined)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for p in zip(out, out[1:]):
                pairs[p] += c
                where[p].add(i)
        for p in touched:
            if pairs.get(p, 1) <= 0:
                del pairs[p]
        if progress and (step + 1) % 250 == 0:
            progress(step + 1, n_merges)
    return merges


class Encoder:
    """Text -> token ids with the learned merges (lowest-ranked pair first, as GPT-2 does)."""

    def __init__(self, vocab, merges):
        self.ids = {tok: i for i, tok in enumerate(vocab)}
        self.rank = {pair: r for r, pair in enumerate(merges)}
        self.cache = {}

    def encode_word(self, w):
        hit = self.cache.get(w)
        if hit is not None:
            return hit
        syms = list(w)
        while len(syms) > 1:
            best = min(range(len(syms) - 1), key=lambda j: self.rank.get((syms[j], syms[j + 1]), 1 << 30))
            if (syms[best], syms[best + 1]) not in self.rank:
                break
            syms[best:best + 2] = [syms[best] + syms[best + 1]]
        ids = [self.ids[s] for s in syms]
        self.cache[w] = ids
        return ids

    def encode(self, text):
        out = []
        for w in words_of(text):
            out.extend(self.encode_word(w))
        return out
