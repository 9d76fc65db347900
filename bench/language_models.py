"""Language before Transformers, measured (Bishop, sec. 12.2 -> 12.3): n-gram models, RNN
language models and GPT on tiny Shakespeare, the GPT bench's split, one table.

    python bench/language_models.py [--data PATH] [--steps 2000] [--tokenizers char bpe]
                                    [--out DIR] [--json FILE]

Every model is fitted by `python -m src.train` on the first 90 % of the text and scored on the
whole last 10 % (val/loss, nats per token, as bench/gpt_shakespeare.py scores GPT):
- n-grams of order L = 1..5 with interpolated Kneser-Ney (`model=ngram`): one counting pass;
- a vanilla (tanh) RNN, a GRU and an LSTM (`model=rnn_lm`, 2 layers, widths chosen for
  ~0.8 M parameters, truncated BPTT of 32 tokens with the state carried across the block);
- GPT as nanoGPT's CPU "baby GPT" (`experiment=gpt_shakespeare_char`, 0.8 M parameters);
each neural model first with the GPT bench's budget, `--steps` steps of batch 12 x 64 tokens,
then with equal wall-clock: as many steps as its measured training speed (the Throughput
callback's median tokens/s) fits into the time GPT's run took (rerun, at most twice, with the
steps rescaled to the new run's speed while its time is over 10 % off). The same again on BPE
tokens (byte-level, 512 tokens, trained on the corpus), where bits per character (the loss times
the val split's tokens per character, / ln 2) makes the two tokenisations comparable.

Two figures in --out: `context.png`, the val loss at each position of the 64-token windows,
i.e. against the number of tokens of context (an n-gram of order L stops improving at L - 1;
the RNNs and GPT keep using what they see), and `gradient_norms.png`, ||dL_T / dz_n|| against
the distance T - n for the vanilla RNN and the LSTM at initialisation and after training
(sec. 12.2.6's vanishing gradient). The last line is JSON.

Anchors: nanoGPT's own train.py with the baby-GPT settings reaches val 1.886 on its 20-batch
estimate, 1.898 on the whole val split (both measured on this kind of machine, see
bench/gpt_shakespeare.py); char-rnn (Karpathy, 2015) is the recurrent recipe the RNN rows
follow, at a 0.8 M-parameter scale instead of its 3.3 M-parameter 2 x 512 LSTM.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra.utils import get_class
from omegaconf import OmegaConf

from src.data.text import TokenWindows, load_tokenizer
from src.nn.rnn import gradient_norms
from src.utils.checkpoint import load_checkpoint
from src.utils.summary import emit_summary, train_run

ROOT = Path(__file__).resolve().parents[1]
NANOGPT_VAL = 1.898  # nanoGPT's baby GPT, 2000 iterations, whole val split (measured here)
DATA = ["data=shakespeare", "data.block_size=64", "data.batch_size=12", "data.splits=[0.9,0.1,0.0]",
        "data.steps_per_epoch=250", "test=false", "trainer.gradient_clip_val=1.0"]  # fmt: skip
TOKENIZERS = {"char": ["data.tokenizer=char"], "bpe": ["data.tokenizer=bpe", "data.vocab_size=512"]}
ORDERS = (1, 2, 3, 4, 5)
# RNN widths D for ~0.8 M parameters in 2 layers, as many as the baby GPT's 0.80 M at K = 65
RNNS = {"rnn": 448, "gru": 256, "lstm": 224}
NAMES = {1: "unigram", 2: "bigram", 3: "trigram"}


def models() -> dict[str, list[str]]:
    """Each row's overrides, on top of DATA and the tokenizer's."""
    rows = {NAMES.get(n, f"{n}-gram"): ["model=ngram", f"model.order={n}"] for n in ORDERS}
    for cell, width in RNNS.items():
        rows[f"{cell} (RNN LM)" if cell == "rnn" else cell] = [
            "model=rnn_lm", f"model.net.cell={cell}", f"model.net.d_model={width}"]  # fmt: skip
    rows["gpt"] = ["experiment=gpt_shakespeare_char"]
    return rows


def train(overrides: list[str], run_dir: Path) -> dict:
    """One `python -m src.train` run; its val loss, size and speed."""
    print("$ src.train", " ".join(overrides), flush=True)
    m, wall = train_run(overrides, run_dir)
    cfg = OmegaConf.load(run_dir / "config.yaml")
    steps = cfg.trainer.max_steps
    row = {"val_loss": m["val/loss"], "parameters": int(m["params/total"]), "wall_s": wall}
    fitted = re.search(r"train tokens in ([\d.]+) s", (run_dir / "train.log").read_text())
    if fitted:  # an n-gram: one counting pass over the train split
        row.update(steps=0, train_s=float(fitted[1]))
        return row
    with open(run_dir / "csv" / "metrics.csv") as f:
        speeds = [float(r["train/tokens_per_sec"]) for r in csv.DictReader(f)
                  if r.get("train/tokens_per_sec")]  # fmt: skip
    speed = statistics.median(speeds[1:] or speeds)  # the first: warm-up
    tokens = steps * cfg.data.batch_size * cfg.data.block_size
    row.update(steps=steps, tokens_per_s=speed, train_s=tokens / speed)
    return row


def load_model(run_dir: Path) -> torch.nn.Module:
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    model = get_class(ckpt["model_class"])(**ckpt["hyper_parameters"])
    model.load_state_dict(ckpt["state_dict"])
    return model.eval()


def val_windows(run_dir: Path) -> TokenWindows:
    cfg = OmegaConf.load(run_dir / "config.yaml").data
    folder = ROOT / cfg.processed_dir
    meta = json.loads((folder / "meta.json").read_text())
    return TokenWindows(folder / "val.bin", meta["dtype"], cfg.block_size)


@torch.no_grad()
def position_losses(run_dir: Path, batch: int = 64) -> list[float]:
    """The mean val loss at each position t of the non-overlapping windows (as validation reads
    them): the prediction of token t + 1 from t + 1 tokens of context."""
    model, windows = load_model(run_dir), val_windows(run_dir)
    starts = list(range(0, len(windows), windows.block_size))
    total = torch.zeros(windows.block_size, dtype=torch.float64)
    for i in range(0, len(starts), batch):
        x, y = windows.__getitems__(starts[i : i + batch])
        logits = model(x)  # (B, T, K); an n-gram's normalised log-probabilities
        total += F.cross_entropy(logits.transpose(1, 2), y, reduction="none").sum(0).double()
    return [round(v, 4) for v in (total / len(starts)).tolist()]


def chars_per_token(run_dir: Path) -> float:
    """Characters of the val split's text over its tokens."""
    folder = ROOT / OmegaConf.load(run_dir / "config.yaml").data.processed_dir
    tokens = val_windows(run_dir).data
    tokenizer = load_tokenizer((folder / "tokenizer.json").read_text())
    return len(tokenizer.decode(tokens.tolist())) / len(tokens)


def gradient_curves(run_dirs: dict[str, Path]) -> dict[str, list[float]]:
    """||dL_T / dz_n|| over the first val batch, at initialisation (a fresh model of the same
    settings) and after training (the last checkpoint)."""
    curves = {}
    for name, run_dir in run_dirs.items():
        trained = load_model(run_dir)
        torch.manual_seed(0)
        fresh = type(trained)(**trained.hparams).eval()
        windows = val_windows(run_dir)
        x, y = windows.__getitems__(list(range(0, 32 * windows.block_size, windows.block_size)))
        for when, model in (("init", fresh), ("trained", trained)):
            curves[f"{name}, {when}"] = [float(f"{v:.4g}") for v in gradient_norms(model.net, x, y)]
    return curves


def plot(curves: dict[str, list[float]], path: Path, xlabel: str, ylabel: str, title: str,
         log_y: bool = False, flip: bool = False) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, ys in curves.items():
        ys = ys[::-1] if flip else ys  # gradient norms: distance 0 first
        xs = range(len(ys)) if flip else range(1, len(ys) + 1)
        style = "--" if "gram" in name else "-"
        ax.plot(xs, ys, style, label=name, lw=1.2)
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(rows: dict[str, dict], bits_per_nat: float) -> None:
    print(f"{'model':<15}{'params':>10}{'steps':>7}{'val loss':>10}{'bits/char':>11}"
          f"{'tokens/s':>10}{'train s':>9}")  # fmt: skip
    for name, r in rows.items():
        speed = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else "-"
        print(f"{name:<15}{r['parameters']:>10,}{r['steps'] or '-':>7}{r['val_loss']:>10.3f}"
              f"{r['val_loss'] * bits_per_nat:>11.3f}{speed:>10}{r['train_s']:>9.1f}",
              flush=True)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, help="the corpus (default: tiny Shakespeare, fetched)")
    p.add_argument("--steps", type=int, default=2000, help="the equal-steps budget")
    p.add_argument("--tokenizers", nargs="+", choices=list(TOKENIZERS), default=list(TOKENIZERS))
    p.add_argument("--out", type=Path, default=ROOT / "outputs/bench/language_models")
    p.add_argument("--json", type=Path, help="also write the JSON result here (DVC's metrics)")
    p.add_argument("overrides", nargs="*", help="more key=value for every run")
    args = p.parse_args()
    out = args.out.resolve()
    data = [*DATA, *([f"data.path={args.data.resolve()}"] if args.data else []), *args.overrides]
    summary = {"bench": "language_models", "steps": args.steps, "reference_val": NANOGPT_VAL}
    for tok in args.tokenizers:
        base = [*TOKENIZERS[tok], *data, f"trainer.max_steps={args.steps}"]
        rows, dirs = {}, {}
        for name, overrides in models().items():
            dirs[name] = out / tok / name.split()[0]
            rows[name] = train([*base, *overrides], dirs[name])
        cpt = chars_per_token(dirs["gpt"])
        bits_per_nat = 1 / (cpt * math.log(2))  # nats per token -> bits per character
        print(f"\n{tok}: equal steps ({args.steps} of 12 x 64 tokens), "
              f"{cpt:.2f} characters per token", flush=True)  # fmt: skip
        table(rows, bits_per_nat)

        # equal wall-clock: GPT's training time, spent at each model's own speed
        budget = rows["gpt"]["train_s"]
        timed = {"gpt": rows["gpt"]}
        for name, r in rows.items():
            if name == "gpt" or "tokens_per_s" not in r:
                continue
            steps = round(budget * r["tokens_per_s"] / (12 * 64))
            if abs(steps - args.steps) <= 0.05 * args.steps:  # within the timer's noise
                timed[name] = r
                continue
            for _ in range(3):  # the speed of a longer run can differ: rescale the steps to it
                over = [*base, *models()[name], f"trainer.max_steps={steps}"]
                timed[name] = train(over, out / tok / f"{name.split()[0]}-{steps}")
                if abs(timed[name]["train_s"] - budget) <= 0.1 * budget:
                    break
                steps = round(steps * budget / timed[name]["train_s"])
        print(f"\n{tok}: equal wall-clock ({budget:.0f} s of training, GPT's)", flush=True)
        table(timed, bits_per_nat)

        curves = {name: position_losses(d) for name, d in dirs.items()}
        plot(curves, out / tok / "context.png", "tokens of context (position in the window)",
             "val loss (nats per token)", f"{tok}: the loss against the context, {args.steps} "
             "steps")  # fmt: skip
        summary[tok] = {"chars_per_token": cpt, "equal_steps": rows, "equal_time": timed,
                        "by_context": curves}  # fmt: skip
        if tok == "char":
            grads = gradient_curves({"vanilla RNN": dirs["rnn (RNN LM)"], "LSTM": dirs["lstm"]})
            plot(grads, out / "gradient_norms.png", "distance T - n", "||dL_T / dz_n||",
                 "the last position's gradient reaching earlier states", log_y=True,
                 flip=True)  # fmt: skip
            summary["gradient_norms"] = grads
            gpt = rows["gpt"]["val_loss"]
            print(f"\nGPT {gpt:.3f} against nanoGPT's {NANOGPT_VAL} (same model, recipe and "
                  f"split, whole val split)", flush=True)  # fmt: skip
    print(f"figures in {out}")
    emit_summary(summary, args.json)


if __name__ == "__main__":
    main()
