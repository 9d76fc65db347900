"""Generation speed: GPT greedy decoding and beam-4 translation with the key/value cache and
without it.

    python bench/generation.py [--tokens 1000] [--prefixes 16 256 1024] [--sentences 64]
                               [--json FILE]

Without the cache every new token re-runs the whole prefix through the model, as nanoGPT's
sampler does: a step costs O(T) positions through the MLPs and O(T^2) attention scores. With it
(src.models.generation.TokenDecoder) a step runs one position and attends over the T cached
keys. The model is the main job's GPT (4 layers, D = 128, H = 4, K = 4096) with a window of
prefix + tokens positions and random weights: speed does not depend on what the weights learnt.
For each prompt length the bench generates --tokens tokens both ways, prints tokens/s, the
speed-up, the cached path's time per token over the first and the last 100 tokens (how it grows
with the cache), and whether the two paths chose the same tokens.

Translation: the encoder-decoder of `model=seq2seq` (3 + 3 layers, D = 256, H = 4, K = 4000,
random weights) translates --sentences sources of 12 tokens with beam search of width 4, in one
batch, for 24 target tokens each (no end token, so both paths decode the same length). With the
cache each step runs one position per beam, with the encoder output's K, V for cross-attention
computed once and reordered with the beams; without it, every step re-runs the decoder over the
whole target prefix. Prints sentences/s both ways. The last line is JSON.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from statistics import fmean

import torch

from src.models.generation import GenerationConfig, TokenDecoder, generate
from src.models.gpt import GPT, GPTConfig
from src.models.seq2seq import Seq2Seq, Seq2SeqConfig
from src.utils.summary import emit_summary


class Timed:
    """A next-token function that records when each step ends."""

    def __init__(self, fn):
        self.fn, self.ends = fn, []

    def __call__(self, ids):
        out = self.fn(ids)
        self.ends.append(time.perf_counter())
        return out


def decode(gpt: GPT, prompt: torch.Tensor, tokens: int, cached: bool) -> tuple[torch.Tensor, dict]:
    step = Timed(TokenDecoder(gpt, cache=cached))
    cfg = GenerationConfig(strategy="greedy", max_new_tokens=tokens)
    t0 = time.perf_counter()
    out = generate(step, prompt, cfg)
    seconds = time.perf_counter() - t0
    ms = [1e3 * (b - a) for a, b in zip([t0, *step.ends], step.ends, strict=False)]
    first, last = ms[1:101], ms[-100:]  # ms[0] is the prompt's own pass
    return out, {"tokens_per_sec": tokens / seconds, "seconds": seconds,
                 "ms_first_100": fmean(first), "ms_last_100": fmean(last)}  # fmt: skip


def translate(
    net: Seq2Seq, src: torch.Tensor, tokens: int, cached: bool
) -> tuple[torch.Tensor, float]:
    """Beam-4 decoding of the sources src (B, S) for `tokens` tokens -> (outputs, seconds)."""
    cfg = GenerationConfig(strategy="beam", beam_width=4, max_new_tokens=tokens)
    t0 = time.perf_counter()
    z, pad = net.encode(src)
    out = generate(net.next_token_logits(z, pad, cache=cached), src[:, :1], cfg)
    return out, time.perf_counter() - t0


def translation_speed(sentences: int, tokens: int = 24) -> dict:
    net = Seq2Seq(Seq2SeqConfig(n_layer=3, n_head=4, d_model=256, vocab_size=4000,
                                src_vocab_size=4000, block_size=64, dropout=0.0,
                                activation="relu", pos_encoding="sinusoidal")).eval()  # fmt: skip
    src = torch.randint(10, 4000, (sentences, 12))
    out_c, sec_c = translate(net, src, tokens, cached=True)
    out_u, sec_u = translate(net, src, tokens, cached=False)
    return {"cached_sentences_per_sec": sentences / sec_c,
            "uncached_sentences_per_sec": sentences / sec_u, "speedup": sec_u / sec_c,
            "same_tokens": bool(torch.equal(out_c, out_u)), "sentences": sentences,
            "tokens": tokens}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--prefixes", type=int, nargs="+", default=[16, 256, 1024])
    p.add_argument("--sentences", type=int, default=64, help="sources translated (beam 4)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    window = max(args.prefixes) + args.tokens
    gpt = GPT(GPTConfig(n_layer=4, n_head=4, d_model=128, vocab_size=4096, block_size=window))
    gpt.eval()
    rows = {}
    print(f"GPT greedy, {args.tokens} new tokens, window {window}, {args.threads} threads")
    print(f"{'prompt':>6} {'cached tok/s':>12} {'uncached tok/s':>14} {'speed-up':>8} "
          f"{'ms/token first 100':>18} {'last 100':>8}  same tokens")  # fmt: skip
    for t0 in args.prefixes:
        prompt = torch.randint(0, 4096, (1, t0))
        out_c, c = decode(gpt, prompt, args.tokens, cached=True)
        out_u, u = decode(gpt, prompt, args.tokens, cached=False)
        same = bool(torch.equal(out_c, out_u))
        speedup = c["tokens_per_sec"] / u["tokens_per_sec"]
        rows[t0] = {"cached": c, "uncached": u, "speedup": speedup, "same_tokens": same}
        print(f"{t0:>6} {c['tokens_per_sec']:>12.0f} {u['tokens_per_sec']:>14.0f} "
              f"{speedup:>7.1f}x {c['ms_first_100']:>18.2f} {c['ms_last_100']:>8.2f}  "
              f"{'yes' if same else 'no'}", flush=True)  # fmt: skip
    tr = translation_speed(args.sentences)
    print(f"\nseq2seq beam-4, {tr['sentences']} sentences x {tr['tokens']} tokens: cached "
          f"{tr['cached_sentences_per_sec']:.1f} sentences/s, uncached "
          f"{tr['uncached_sentences_per_sec']:.1f}, speed-up {tr['speedup']:.1f}x, same tokens "
          f"{'yes' if tr['same_tokens'] else 'no'}")  # fmt: skip
    summary = {"bench": "generation", "tokens": args.tokens, "window": window, "prompts": rows,
               "translation": tr}  # fmt: skip
    emit_summary(summary, args.json)


if __name__ == "__main__":
    main()
