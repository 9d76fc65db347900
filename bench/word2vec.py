"""Word vectors, ours beside gensim's on the same words: skip-gram or CBOW on tiny Shakespeare
(`experiment=word2vec_shakespeare`) or on text8 (`experiment=word2vec_text8`).

    python bench/word2vec.py [--experiment word2vec_text8] [--max-chars N] [--max-steps 600]
                             [--mode skipgram|cbow] [--json FILE] [KEY=VALUE ...]

Trains the experiment with `python -m src.train` (word-level tokenizer, words seen 5 times,
R = 5, S = 5, t = 1e-3, D = 100: word2vec's usual settings), then gensim's `Word2Vec` on the
same training split's token stream (special tokens dropped, as ours drops them) with the same
window, dimension, noise words, subsampling and as many passes over the corpus as our random
windows amount to, on as many worker threads as torch uses. Both sets of vectors are scored by
the same code (src.models.word2vec.evaluate): analogy accuracy on the Google set and Spearman's
ρ on WordSim-353, each on the questions whose words are in the vocabulary (coverage printed).
Words/s: ours is the Throughput callback's median train/tokens_per_sec (the pipeline's training
steps), gensim's the words of all its passes over the wall time of `train()`; minutes are each
one's training time. --max-chars reads a corpus's head (text8: 12549837, the data mirror's copy).
--repeats N trains both N times, alternately, and reports the medians of words/s and minutes
(the scores are the last repeat's; ours are the same each time): on a shared machine the speed
of either drifts by a third over minutes.
Needs gensim (pip install -e '.[bench]'). The last line is JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from src.data.text import load_tokenizer
from src.models.word2vec import (
    N_SPECIAL,
    WordVectors,
    evaluate,
    gensim_test_file,
    load_word_vectors,
    read_analogies,
    read_wordsim,
)
from src.utils.summary import emit_summary

ROOT = Path(__file__).resolve().parents[1]
SENTENCE = 10_000  # gensim's longest sentence (MAX_WORDS_IN_BATCH)


def run_ours(experiment: str, max_steps: int, mode: str, seed: int, run_dir: Path,
             overrides: list[str]) -> dict:  # fmt: skip
    cmd = [
        sys.executable, "-m", "src.train", f"experiment={experiment}",
        f"trainer.max_steps={max_steps}", f"model.net.mode={mode}", f"seed={seed}", "logger=csv",
        f"hydra.run.dir={run_dir}", "callbacks.progress_bar.refresh_rate=50", *overrides,
    ]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    seconds = time.perf_counter() - t0
    with open(run_dir / "csv" / "metrics.csv") as f:
        speeds = [float(r["train/tokens_per_sec"]) for r in csv.DictReader(f)
                  if r.get("train/tokens_per_sec")]  # fmt: skip
    # the first: warm-up
    return {"words_per_sec": statistics.median(speeds[1:] or speeds), "seconds": seconds}


def run_gensim(run_dir: Path, epochs: int, seed: int) -> tuple[WordVectors, float, float]:
    """gensim's Word2Vec on the run's training stream; returns its vectors, words/s and the
    seconds of its training."""
    from gensim.models import Word2Vec

    cfg = OmegaConf.load(run_dir / "config.yaml")
    d = ROOT / cfg.data.processed_dir
    meta = json.loads((d / "meta.json").read_text())
    ids = np.fromfile(d / "train.bin", dtype=meta["dtype"])
    ids = ids[ids >= N_SPECIAL]  # <unk> and <|endoftext|> are no words (ours drops them too)
    vocab = load_tokenizer((d / "tokenizer.json").read_text()).get_vocab()
    words = np.array(sorted(vocab, key=vocab.get), dtype=object)[ids]
    sentences = [list(words[i : i + SENTENCE]) for i in range(0, len(words), SENTENCE)]
    net = cfg.model.net
    model = Word2Vec(
        vector_size=net.dim, window=net.window, negative=net.negative, sample=net.sample,
        ns_exponent=net.ns_exponent, sg=int(net.mode == "skipgram"), min_count=1,
        workers=torch.get_num_threads(), seed=seed,
    )  # fmt: skip
    model.build_vocab(sentences)
    t0 = time.perf_counter()
    model.train(sentences, total_examples=len(sentences), epochs=epochs)
    seconds = time.perf_counter() - t0
    kv = model.wv
    keep = [w for w in kv.index_to_key if not any(c.isspace() for c in w)]  # as ours is saved
    return WordVectors(keep, kv[keep]), epochs * len(words) / seconds, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--experiment", default="word2vec_shakespeare",
                   choices=["word2vec_shakespeare", "word2vec_text8"])  # fmt: skip
    p.add_argument("--data", type=Path, help="a corpus file instead of the experiment's dataset")
    p.add_argument("--max-chars", type=int, help="the corpus's first this many characters")
    p.add_argument("--max-steps", type=int, default=600)
    p.add_argument("--mode", choices=["skipgram", "cbow"], default="skipgram")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--out", type=Path, default=ROOT / "outputs/bench/word2vec")
    p.add_argument("--json", type=Path, help="also write the JSON result here (DVC's metrics)")
    p.add_argument("--repeats", type=int, default=1, help="train both this many times, alternately")
    p.add_argument("overrides", nargs="*", help="more key=value for our run")
    args = p.parse_args()
    if gensim_test_file("questions-words.txt") is None:
        sys.exit("bench/word2vec.py needs gensim: pip install -e '.[bench]'")
    run_dir = args.out.resolve() / args.experiment / args.mode
    overrides = [*([f"data.path={args.data.resolve()}"] if args.data else []),
                 *([f"data.max_chars={args.max_chars}"] if args.max_chars else []),
                 *args.overrides]  # fmt: skip
    speeds = {"ours": [], "gensim": []}
    for _ in range(args.repeats):
        ours = run_ours(args.experiment, args.max_steps, args.mode, args.seed, run_dir, overrides)
        cfg = OmegaConf.load(run_dir / "config.yaml")
        meta = json.loads((ROOT / cfg.data.processed_dir / "meta.json").read_text())
        window_words = args.max_steps * cfg.data.batch_size * (cfg.data.block_size + 1)
        epochs = max(1, round(window_words / meta["tokens"]["train"]))
        gensim_vectors, gensim_speed, gensim_seconds = run_gensim(run_dir, epochs, args.seed)
        speeds["ours"].append((ours["words_per_sec"], ours["seconds"] / 60))
        speeds["gensim"].append((gensim_speed, gensim_seconds / 60))
    our_vectors = WordVectors(*load_word_vectors(run_dir / "word_vectors.txt"))

    analogies = read_analogies(gensim_test_file("questions-words.txt"))
    wordsim = read_wordsim(gensim_test_file("wordsim353.tsv"))
    scores = {name: {**evaluate(vectors, analogies, wordsim),
                     "words_per_sec": statistics.median(w for w, _ in speeds[name]),
                     "minutes": statistics.median(m for _, m in speeds[name])}
              for name, vectors in (("ours", our_vectors), ("gensim", gensim_vectors))}  # fmt: skip
    print(f"\n{args.experiment}, {args.mode}, {epochs} passes over "
          f"{meta['tokens']['train']:,} training words")  # fmt: skip
    print(f"{'':28}{'ours':>12}{'gensim':>12}")
    for key in ("analogy_acc", "analogy_coverage", "analogy_questions", "wordsim_spearman",
                "wordsim_coverage", "wordsim_pairs", "words_per_sec", "minutes"):  # fmt: skip
        a, b = scores["ours"][key], scores["gensim"][key]
        print(f"{key:28}{a:>12.4g}{b:>12.4g}")
    ratios = [a / b for (a, _), (b, _) in zip(speeds["ours"], speeds["gensim"], strict=True)]
    print(
        f"words/s: ours {scores['ours']['words_per_sec'] / scores['gensim']['words_per_sec']:.2f}"
        f" x gensim's (repeat by repeat: {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    for word in cfg.model.eval.neighbours:
        for name, vectors in (("ours", our_vectors), ("gensim", gensim_vectors)):
            if word in vectors.index:
                near = ", ".join(w for w, _ in vectors.nearest(word, 5))
                print(f"  {word:>8} ({name:>6}): {near}")
    result = {
        "bench": args.experiment,
        "mode": args.mode,
        "steps": args.max_steps,
        "epochs": epochs,
        "train_words": meta["tokens"]["train"],
        "repeats": args.repeats,
        **{f"{k}_{name}": round(v, 4) for name, s in scores.items() for k, v in s.items()},
        "torch_threads": torch.get_num_threads(),
    }
    emit_summary(result, args.json)


if __name__ == "__main__":
    main()
