"""The chapter's claim where it should show (Bishop, sec. 12.2 -> 12.3): the 5-gram, the LSTM and
GPT at matched parameters on text8's characters, at a ladder of budgets; test bits per character.

    python bench/ladder.py [--max-chars 12549837] [--steps 500 2000 8000] [--out DIR]
                           [--json FILE] [KEY=VALUE ...]

Data: `data=text8` (its first --max-chars characters: the data mirror's head of text8, 2.1 M
words), character level, split 90/5/5 as text8 is (first 90 % train, then 5 % val, 5 % test),
windows of 64 and batches of 12: tiny Shakespeare's table's settings (bench/language_models.py).
A budget is a number of steps, i.e. of training characters seen, steps x 12 x 64:
- the 5-gram (interpolated Kneser-Ney, `model=ngram model.order=5`) counts that many of the train
  split's first characters (its compute is one counting pass);
- the LSTM (`model=rnn_lm`, 2 layers of D = 224, ~0.8 M parameters) and GPT (nanoGPT's baby GPT,
  `experiment=gpt_shakespeare_char`'s model, 0.8 M) train for that many steps, the learning rate
  warmed up and decayed over the budget.
Each is scored on the whole test split (bits per character: the loss / ln 2); validation reads
the first 100,000 val characters. Prints the table (with each run's seconds), plots
`ladder.png` (bits per character against characters seen), and the last line is JSON.

Published figures on the whole of text8 (90 M training characters), as context, not as targets:
a batch-normalised LSTM of 16 M parameters 1.36 bits per character (Cooijmans et al. 2016), the
character Transformers of Al-Rfou et al. (2019) 1.18 (12 layers, 44 M) and 1.13 (64 layers,
235 M).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from src.utils.summary import emit_summary, train_run

ROOT = Path(__file__).resolve().parents[1]
HEAD = 12_549_837  # characters of the data mirror's text8_head.txt.gz
BLOCK, BATCH = 64, 12  # tiny Shakespeare's table's windows and batches
DATA = ["data=text8", "data.tokenizer=char", f"data.block_size={BLOCK}", f"data.batch_size={BATCH}",
        "data.splits=[0.9,0.05,0.05]", "data.steps_per_epoch=250", "data.val_tokens=100000",
        "test=true", "trainer.gradient_clip_val=1.0", "trainer.max_epochs=-1"]  # fmt: skip
MODELS = {
    "5-gram": ["model=ngram", "model.order=5"],
    "lstm": ["model=rnn_lm", "model.net.cell=lstm", "model.net.d_model=224"],
    "gpt": ["experiment=gpt_shakespeare_char"],  # its model; data=text8 below wins over its data
}
PUBLISHED = {"bn_lstm_16m": 1.36, "transformer_t12_44m": 1.18, "transformer_t64_235m": 1.13}


def run(name: str, steps: int, out: Path, overrides: list[str]) -> dict:
    """One rung: the model at `steps` steps' worth of characters; its test bits per character."""
    chars = steps * BATCH * BLOCK
    budget = [f"model.max_tokens={chars}", "trainer.max_steps=1"] if name == "5-gram" else [
        f"trainer.max_steps={steps}"]  # fmt: skip
    run_dir = out / name / str(steps)
    m, seconds = train_run([*MODELS[name], *DATA, *budget, *overrides], run_dir)
    return {"steps": steps, "chars": chars, "bits_per_char": m["test/loss"] / math.log(2),
            "parameters": int(m["params/total"]), "seconds": round(seconds, 1)}  # fmt: skip


def plot(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, rungs in results.items():
        ax.plot([r["chars"] for r in rungs], [r["bits_per_char"] for r in rungs], "o-",
                label=name, lw=1.2)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("training characters seen (budget)")
    ax.set_ylabel("test bits per character")
    ax.set_title("text8 characters: n-gram, LSTM and GPT at ~0.8 M parameters", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--max-chars", type=int, default=HEAD, help="text8's first this many characters")
    p.add_argument("--steps", type=int, nargs="+", default=[500, 2000, 8000])
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--out", type=Path, default=ROOT / "outputs/bench/ladder")
    p.add_argument("--plot", type=Path, default=ROOT / "docs/ladder_text8.png")
    p.add_argument("--json", type=Path, help="also write the JSON result here (DVC's metrics)")
    p.add_argument("overrides", nargs="*", help="more key=value for every run")
    args = p.parse_args()
    out = args.out.resolve()
    overrides = [f"data.max_chars={args.max_chars}", *args.overrides]
    results = {}
    for name in args.models:
        results[name] = []
        for steps in sorted(args.steps):
            r = run(name, steps, out, overrides)
            results[name].append(r)
            print(f"{name:<7} {steps:>6} steps  {r['chars']:>10,} chars  "
                  f"{r['bits_per_char']:.3f} bits/char  {r['parameters']:>9,} params  "
                  f"{r['seconds']:>6.0f} s", flush=True)  # fmt: skip
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    plot(results, args.plot)
    emit_summary({"bench": "ladder_text8", "max_chars": args.max_chars, "models": results,
                  "published_whole_text8": PUBLISHED}, args.json)  # fmt: skip


if __name__ == "__main__":
    main()
