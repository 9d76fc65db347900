"""English -> Dutch translation, side by side with a peer: this project's encoder-decoder
Transformer (`model=seq2seq`, trained through `python -m src.train`) and HF transformers'
`MarianMTModel`, the architecture of the opus-mt models, configured to the same size and trained
from scratch in the same run: same split, same BPE tokenizer and batches, same steps, AdamW
with the same warm-up, cosine decay and label smoothing. Only the network and its decoding
(HF's `generate`, beam search with the same width and length penalty) differ; both are scored by
the same sacrebleu call. Both are post-norm (the original Transformer's layer; ours with
`model.net.norm_first=true` is pre-norm).

    python -m bench.translation_peer [--steps 2500] [--out DIR] [--ours RUN_DIR] [--json FILE]
                                     [--speed] [KEY=VALUE ...]

`--ours` takes our Transformer from a run already trained (Marian gets its steps), such as
`bench/translation.py`'s OUT/transformer, instead of training it again (its training seconds are
the span of its train.log); run both on the same idle machine, one after the other.

`--speed` only times training, --steps steps of each from a fresh start on the same batches:
ours through `src.train` (Lightning), then ours, ours under `torch.compile` and Marian in the same
plain loop, so that Lightning's per-step cost, the compiler and the network each show apart.

Needs the bench extra (`pip install -e ".[bench]"`, which adds transformers). Prints, per model
and decoding, test BLEU, chrF, exact match and sentences/s, then parameters, training seconds
(ours: the whole `src.train` process, with start-up, val BLEU and the test split's decoding;
Marian's: its loop with val loss) and source tokens per second of training steps, the
comparable speed; the last line printed is JSON.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.translation import ROOT, score_decodings, train
from src.utils.summary import emit_summary

IGNORE = -100  # the label of padding (src.data.translation)


def marian(net: dict, vocab_size: int, pad_id: int, eos_id: int):
    """A MarianMTModel of our net's size: L encoder and L decoder layers of width D, H heads,
    a 4D (or d_ff) MLP, sinusoidal positions, one vocabulary tied across encoder, decoder and
    output; randomly initialised."""
    from transformers import MarianConfig, MarianMTModel

    attn_dropout = net.get("attn_dropout")  # on the attention weights; None = dropout
    config = MarianConfig(
        vocab_size=vocab_size,
        d_model=net["d_model"],
        encoder_layers=net["n_layer"],
        decoder_layers=net["n_layer"],
        encoder_attention_heads=net["n_head"],
        decoder_attention_heads=net["n_head"],
        encoder_ffn_dim=net["d_ff"] or 4 * net["d_model"],
        decoder_ffn_dim=net["d_ff"] or 4 * net["d_model"],
        max_position_embeddings=net["block_size"],
        activation_function=net["activation"],
        dropout=net["dropout"],
        attention_dropout=net["dropout"] if attn_dropout is None else attn_dropout,
        scale_embedding=True,  # token embeddings times sqrt(D), as ours with sinusoidal positions
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        forced_eos_token_id=None,
        decoder_start_token_id=eos_id,  # our decoder input starts with the end token too
    )
    return MarianMTModel(config)


def train_loop(model, logits_of, data, cfg, steps: int, validate: bool = True):
    """Our recipe in a plain loop: AdamW (matrices decayed), warm-up and cosine decay,
    label-smoothed cross-entropy, gradients clipped as our trainer clips them; with `validate`,
    the weights of the best val loss, checked once per epoch as Lightning does for ours, are
    kept. logits_of(model, batch) -> (B, T, K). Returns (seconds, validation included, and
    source tokens per second of training: the median over windows of log_every_n_steps steps,
    batch loading included, as our Throughput callback logs them)."""
    from src.models.base import adamw, warmup_cosine

    o, smoothing = cfg.model.optim, cfg.model.label_smoothing
    opt = adamw(model, o)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_cosine(o.warmup_steps, o.decay_steps, o.min_lr / o.lr)
    )
    epoch, window = len(data.train_dataloader()), cfg.trainer.log_every_n_steps
    best, best_loss, rates, tokens = None, float("inf"), [], 0
    start = clock = time.perf_counter()
    batches = itertools.chain.from_iterable(data.train_dataloader() for _ in itertools.count())
    for step, batch in enumerate(itertools.islice(batches, steps), start=1):
        model.train()
        loss = loss_of(logits_of(model, batch), batch, smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.gradient_clip_val)
        opt.step()
        sched.step()
        tokens += batch["input_ids"].numel()
        if step % window == 0:
            now = time.perf_counter()
            rates.append(tokens / (now - clock))
            tokens, clock = 0, now
        if validate and (step % epoch == 0 or step == steps):
            val = validation_loss(model, logits_of, data, smoothing)
            print(f"step {step}: train loss {loss.item():.3f}, val loss {val:.3f}", flush=True)
            if val < best_loss:
                best_loss, best = val, {k: v.clone() for k, v in model.state_dict().items()}
            tokens, clock = 0, time.perf_counter()  # the window restarts after validation
    if best is not None:
        model.load_state_dict(best)
    return time.perf_counter() - start, statistics.median(rates)


def run_data(cfg):
    """The data module of a run's config (split, tokenizer, batches), set up for training."""
    from hydra.utils import instantiate

    data = instantiate(cfg.data, processed_dir=str(ROOT / cfg.data.processed_dir))
    data.setup("fit")
    return data


def speed(run_dir: Path, steps: int) -> dict[str, float]:
    """Source tokens/s of training from a fresh start on run_dir's batches and recipe, `steps`
    steps each: ours through Lightning (the run's own log), then ours, ours under torch.compile
    and Marian in the same plain loop: what Lightning's per-step cost, the compiler and the
    network itself are worth."""
    from omegaconf import OmegaConf

    from src.data.translation import EOS_ID, PAD_ID
    from src.models.seq2seq import build_net

    cfg = OmegaConf.load(run_dir / "config.yaml")
    data = run_data(cfg)
    net = OmegaConf.to_container(cfg.model.net)
    nets = {
        "ours, plain loop": (lambda: build_net(net, **data.model_kwargs), our_logits),
        "ours, plain loop, torch.compile": (
            lambda: torch.compile(build_net(net, **data.model_kwargs)), our_logits),
        "marian, plain loop": (
            lambda: marian(net, data.model_kwargs["vocab_size"], PAD_ID, EOS_ID), marian_logits),
    }  # fmt: skip
    rates = {"ours, Lightning (src.train)": logged_rate(run_dir)}
    for name, (make, logits_of) in nets.items():
        torch.manual_seed(cfg.seed)
        rates[name] = train_loop(make(), logits_of, data, cfg, steps, validate=False)[1]
        print(f"{name}: {rates[name]:,.0f} source tokens/s", flush=True)
    return rates


def logged_rate(run_dir: Path) -> float:
    """Our run's training tokens/s: the median of the Throughput callback's windows (CSV log)."""
    rows = csv.DictReader(next(run_dir.rglob("metrics.csv")).open())
    return statistics.median(float(r["train/tokens_per_sec"]) for r in rows
                             if r.get("train/tokens_per_sec"))  # fmt: skip


def marian_logits(model, batch: dict) -> torch.Tensor:
    ids, tgt_in = batch["input_ids"], batch["decoder_input_ids"]  # (B, S), (B, T)
    mask = ids != model.config.pad_token_id
    return model(input_ids=ids, attention_mask=mask, decoder_input_ids=tgt_in).logits  # (B, T, K)


def our_logits(net, batch: dict) -> torch.Tensor:
    return net(batch["input_ids"], batch["decoder_input_ids"])  # (B, T, K)


def loss_of(logits: torch.Tensor, batch: dict, label_smoothing: float) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                           ignore_index=IGNORE, label_smoothing=label_smoothing)  # fmt: skip


@torch.no_grad()
def validation_loss(model, logits_of, data, label_smoothing: float) -> float:
    model.eval()
    total = count = 0
    for batch in data.val_dataloader():
        n = int((batch["labels"] != IGNORE).sum())
        total += loss_of(logits_of(model, batch), batch, label_smoothing).item() * n
        count += n
    return total / count


def log_span(path: Path) -> float:
    """Seconds between the first and the last timestamped line of a run's Hydra log."""
    from datetime import datetime

    stamps = [datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")
              for line in path.read_text().splitlines() if line.startswith("[20")]  # fmt: skip
    return (stamps[-1] - stamps[0]).total_seconds()


def translator(model, data, generation: dict):
    """translate(sources, strategy) through HF's generate, for score_decodings."""
    from src.data.translation import pad
    from src.models.seq2seq import until_eos

    src_tok, tgt_tok = data.tokenizer, data.target_tokenizer
    window, pad_id = model.config.max_position_embeddings, model.config.pad_token_id

    @torch.no_grad()
    def translate(sources: list[str], strategy: str) -> list[str]:
        model.eval()
        beam = (
            {"num_beams": generation["beam_width"], "length_penalty": generation["length_penalty"]}
            if strategy == "beam"
            else {}
        )
        out = []
        for i in range(0, len(sources), 64):
            ids = [e.ids[:window] for e in src_tok.encode_batch(sources[i : i + 64])]
            src = pad(ids, pad_id)  # (B, S)
            hyp = model.generate(input_ids=src, attention_mask=src != pad_id, do_sample=False,
                                 max_new_tokens=window - 1, **beam)  # fmt: skip
            # drop the start token; stop at the end token
            out += tgt_tok.decode_batch([until_eos(row[1:]) for row in hyp.tolist()])
        return out

    return translate


def main() -> None:
    from omegaconf import OmegaConf

    from src.data.translation import EOS_ID, PAD_ID, references

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=2500, help="training steps of both models")
    p.add_argument("--out", type=Path, default=ROOT / "outputs/bench/translation_peer")
    p.add_argument("--ours", type=Path, help="our Transformer's run folder, already trained")
    p.add_argument("--json", type=Path, help="also write the JSON result here (DVC's metrics)")
    p.add_argument("--speed", action="store_true", help="only time training (see speed())")
    p.add_argument("overrides", nargs="*", help="more key=value for our run (and its data)")
    args = p.parse_args()

    from bench.translation import evaluate

    if args.speed:
        out = args.out.resolve()
        run_dir = args.ours or train("transformer", args.steps, out, args.overrides)[0]
        rates = speed(run_dir, args.steps)
        print(f"\n{f'{args.steps} steps from a fresh start':<40} {'tokens/s':>9}")
        for name, rate in rates.items():
            print(f"{name:<40} {rate:>9,.0f}")
        emit_summary({"bench": "translation_speed", "steps": args.steps, "rates": rates}, args.json)
        return
    if args.ours:
        run_dir, ours_seconds = args.ours.resolve(), log_span(args.ours / "train.log")
    else:
        run_dir, ours_seconds = train("transformer", args.steps, args.out.resolve(), args.overrides)
    results = {"ours": {**evaluate(run_dir), "train_seconds": round(ours_seconds, 1),
                        "tokens_per_sec": logged_rate(run_dir)}}  # fmt: skip

    # the peer: the same data module (split, tokenizer, batches) and recipe, from our run's config
    cfg = OmegaConf.load(run_dir / "config.yaml")
    torch.manual_seed(cfg.seed)
    data = run_data(cfg)
    model = marian(OmegaConf.to_container(cfg.model.net), data.model_kwargs["vocab_size"],
                   PAD_ID, EOS_ID)  # fmt: skip
    seconds, tokens_per_sec = train_loop(model, marian_logits, data, cfg, cfg.trainer.max_steps)
    sources, refs = references(ROOT / cfg.data.processed_dir / "test.tsv")
    translate = translator(model, data, cfg.model.generation)
    results["marian"] = {
        "parameters": sum(p.numel() for p in model.parameters()),
        **score_decodings(translate, sources, refs),
        "train_seconds": round(seconds, 1),
        "tokens_per_sec": tokens_per_sec,
    }

    print(f"\n{'model':<8} {'decoding':<8} {'BLEU':>6} {'chrF':>6} {'exact':>6}  sent/s")
    for name, r in results.items():
        for strategy in ("greedy", "beam"):
            s = r[strategy]
            print(f"{name:<8} {strategy:<8} {s['bleu']:6.1f} {s['chrf']:6.1f} "
                  f"{s['exact']:6.3f}  {s['sentences_per_sec']:6.1f}")  # fmt: skip
    print(f"\n{'model':<8} {'parameters':>11} {'train s':>8} {'tokens/s':>9}")
    for name, r in results.items():
        print(f"{name:<8} {r['parameters']:>11,} {r['train_seconds']:>8.0f} "
              f"{r['tokens_per_sec'] or 0:>9.0f}")  # fmt: skip
    summary = {"bench": "translation_peer", "steps": cfg.trainer.max_steps, "models": results}
    emit_summary(summary, args.json)


if __name__ == "__main__":
    main()
