"""English -> Dutch translation (Tatoeba): the encoder-decoder Transformer against the RNN
encoder-decoder it replaced, with the one fixed vector z* and with attention (Bishop 12.3.5,
12.2.5). Every model trains for the same steps on the same split and BPE vocabulary, through
`python -m src.train`, and its best checkpoint (val loss) translates the test split greedily
and with beam search.

    python bench/translation.py [--steps 2500] [--models transformer rnn rnn-attention]
                                [--out DIR] [--json FILE] [KEY=VALUE ...]

Prints, per model and decoding, test BLEU, chrF and exact match (sacrebleu, corpus level, against
every reference of a source), parameters and training time, then BLEU by the source's length in
words (1-4, 5-8, 9-12, 13+), where a fixed-size z* should fall behind as sentences grow.
References: this project's target, Transformer BLEU >= 30 with beam search; the ladder
bentrevett/pytorch-seq2seq publishes on Multi30k de-en, GRU 20.6 -> attention 28.3 ->
Transformer 36.5; opus-mt-en-nl (Helsinki-NLP, all of OPUS) 57.1 on Tatoeba en-nl. Raw data comes
from data/raw (or $DATA_MIRROR); the last line printed is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from src.utils.summary import emit_summary, train_run

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "transformer": ["model=seq2seq"],
    "rnn": ["model=rnn_seq2seq"],
    "rnn-attention": ["model=rnn_seq2seq", "model.net.attention=true"],
}
BUCKETS = ((1, 4), (5, 8), (9, 12), (13, None))  # source length in words
REFERENCE = {"target_bleu_transformer_beam": 30.0, "multi30k_gru": 20.6,
             "multi30k_attention": 28.3, "multi30k_transformer": 36.5,
             "opus_mt_en_nl_tatoeba": 57.1}  # fmt: skip


def train(name: str, steps: int, out: Path, overrides: list[str]) -> tuple[Path, float]:
    run_dir = out / name
    _, seconds = train_run([*MODELS[name], "data=translation", "data.dataset=eng-nld",
                            f"trainer.max_steps={steps}", "trainer.max_epochs=-1", *overrides],
                           run_dir)  # fmt: skip
    return run_dir, seconds


def bucket(source: str) -> str:
    n = len(source.split())
    lo, hi = next((lo, hi) for lo, hi in BUCKETS if hi is None or n <= hi)
    return f"{lo}-{hi}" if hi else f"{lo}+"


def evaluate(run_dir: Path) -> dict:
    """The best checkpoint's test translations, greedy and beam: scores overall and by bucket."""
    from omegaconf import OmegaConf

    from src.data.translation import references
    from src.models.seq2seq import load_translator, translate_texts

    best = sorted((run_dir / "checkpoints").glob("best-*.ckpt")) or [
        run_dir / "checkpoints/last.ckpt"
    ]
    model, src_tok, tgt_tok = load_translator(best[-1])
    data = OmegaConf.load(run_dir / "config.yaml").data
    sources, refs = references(ROOT / data.processed_dir / "test.tsv")

    def translate(batch: list[str], strategy: str) -> list[str]:
        cfg = dataclasses.replace(model.generation, strategy=strategy)
        return translate_texts(model, src_tok, tgt_tok, batch, cfg, batch_size=64)

    return {"parameters": sum(p.numel() for p in model.parameters()),
            **score_decodings(translate, sources, refs)}  # fmt: skip


def score_decodings(translate, sources: list[str], refs: list[list[str]]) -> dict:
    """translate(sources, "greedy" | "beam") -> hypotheses; per strategy, corpus BLEU, chrF and
    exact match, BLEU by source-length bucket, and sentences per second."""
    from src.models.seq2seq import corpus_scores

    result = {}
    for strategy in ("greedy", "beam"):
        t0 = time.perf_counter()
        hyps = translate(sources, strategy)
        seconds = time.perf_counter() - t0
        by_bucket = {}
        for b in {bucket(s) for s in sources}:
            rows = [i for i, s in enumerate(sources) if bucket(s) == b]
            scores = corpus_scores([hyps[i] for i in rows], [refs[i] for i in rows])
            by_bucket[b] = {"bleu": scores["bleu"], "sentences": len(rows)}
        result[strategy] = {**corpus_scores(hyps, refs), "by_length": by_bucket,
                            "sentences_per_sec": len(sources) / seconds}  # fmt: skip
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=2500, help="training steps of every model")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--out", type=Path, default=ROOT / "outputs/bench/translation")
    p.add_argument("--json", type=Path, help="also write the JSON result here (DVC's metrics)")
    p.add_argument("overrides", nargs="*", help="more key=value for every run")
    args = p.parse_args()
    results = {}
    for name in args.models:
        run_dir, seconds = train(name, args.steps, args.out.resolve(), args.overrides)
        metrics = json.loads((run_dir / "metrics.json").read_text())
        results[name] = {**evaluate(run_dir), "train_seconds": round(seconds, 1),
                         "tokens_per_sec": metrics.get("train/tokens_per_sec")}  # fmt: skip
        r = results[name]
        print(f"{name}: {r['parameters']:,} parameters, {seconds:.0f} s", flush=True)

    print(f"\n{'model':<15} {'decoding':<8} {'BLEU':>6} {'chrF':>6} {'exact':>6}  sent/s")
    for name, r in results.items():
        for strategy in ("greedy", "beam"):
            s = r[strategy]
            print(f"{name:<15} {strategy:<8} {s['bleu']:6.1f} {s['chrf']:6.1f} "
                  f"{s['exact']:6.3f}  {s['sentences_per_sec']:6.1f}")  # fmt: skip
    buckets = [f"{lo}-{hi}" if hi else f"{lo}+" for lo, hi in BUCKETS]
    print("\nbeam BLEU by source words  " + "  ".join(f"{b:>6}" for b in buckets))
    for name, r in results.items():
        row = r["beam"]["by_length"]
        cells = [f"{row[b]['bleu']:6.1f}" if b in row else "     -" for b in buckets]
        print(f"{name:<26} " + "  ".join(cells))
    counts = next(iter(results.values()))["beam"]["by_length"]
    print(f"{'sentences':<26} " + "  ".join(f"{counts.get(b, {}).get('sentences', 0):6d}"
                                            for b in buckets))  # fmt: skip
    if "transformer" in results:
        bleu = results["transformer"]["beam"]["bleu"]
        target = REFERENCE["target_bleu_transformer_beam"]
        print(f"\nTransformer beam BLEU {bleu:.1f} against the target {target:.0f}: "
              f"{'met' if bleu >= target else 'not met'}; Multi30k ladder GRU 20.6, attention "
              "28.3, Transformer 36.5; opus-mt-en-nl 57.1")  # fmt: skip
    summary = {"bench": "translation", "steps": args.steps, "models": results,
               "reference": REFERENCE}  # fmt: skip
    emit_summary(summary, args.json)


if __name__ == "__main__":
    main()
