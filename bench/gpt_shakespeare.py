"""nanoGPT's CPU "baby GPT" on tiny Shakespeare, character level, through the full pipeline.

    python bench/gpt_shakespeare.py [--data PATH] [--max-steps 2000] [--seeds 1337 1338 1339]

Without --data the corpus is the registered tiny Shakespeare in data/raw/ (fetched from
$DATA_MIRROR or downloaded on first use).
                                    [--no-bare-reference] [--json FILE]

Trains `experiment=gpt_shakespeare_char` with `python -m src.train` (Lightning, progress bar,
CSV logging, checkpoints, validation on the whole val split every 250 steps) and reads its
metrics. For the pipeline's overhead the run also carries `InterleavedBareLoop`, a callback that
every 50 steps times 5 steps of a bare PyTorch loop (a copy of the same model, the same AdamW
settings and gradient clipping, batches from the same kind of loader; no Lightning). The two
are measured seconds apart all through the run, so the slow and fast spells this virtual
machine goes through (±25 %, tens of seconds long) affect both alike.
With --bare-reference (on by default) each seed is also trained once more, start to end, as a
bare PyTorch loop with nanoGPT's recipe (the same model class and AdamW groups, batches of
random windows drawn with torch.randint as nanoGPT's get_batch does, the same warm-up and cosine
schedule and clipping, no Lightning), and evaluated on the same whole val split: what the recipe
itself reaches, beside the pipeline's figure and the 20-batch reference. For the reference's
own noise the bench also draws 50 of nanoGPT's 20-batch val estimates for the first seed's final
model and prints their standard deviation.
Prints the val loss (mean and std over seeds), tokens/s of both, the time from command to first
training step, and the references; the last line is JSON.

References (measured on this kind of machine, 2 threads, nanoGPT's train.py with these settings):
val loss 1.886 at iteration 2000 (nanoGPT's estimate, 20 val batches), median 47 ms/iteration
(~16,000 tokens/s).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from src.data.text import TokenWindows
from src.models.base import adamw, warmup_cosine
from src.models.gpt import GPT, GPTConfig, GPTLitModule
from src.utils.checkpoint import class_path, load_checkpoint
from src.utils.summary import emit_summary

ROOT = Path(__file__).resolve().parents[1]
REF_VAL_LOSS, REF_TOKENS_PER_SEC = 1.886, 16_000
TARGET_VAL_LOSS, TARGET_RATIO = 1.88, 0.95


class InterleavedBareLoop(pl.Callback):
    """Times the pipeline's training steps (batch start to next batch start: Lightning's loop,
    logging, callbacks and data loading included) and, every `every` steps, `steps` bare PyTorch
    steps of a copy of the model; writes both lists to `<run dir>/step_times.json`."""

    def __init__(self, every: int = 50, steps: int = 5):
        self.every, self.steps = every, steps
        self.pipeline: list[float] = []
        self.bare: list[float] = []
        self.last: float | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.net = copy.deepcopy(pl_module.net)
        self.opt = adamw(self.net, pl_module.hparams.optim)
        self.loader = trainer.datamodule.train_dataloader()
        self.batches = iter(self.loader)
        self.clip = trainer.gradient_clip_val

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.pipeline.append(now - self.last)
        self.last = now

    def on_validation_start(self, trainer, pl_module) -> None:
        self.last = None  # an interval that spans validation is not a training step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every:
            return
        for _ in range(self.steps):
            t0 = time.perf_counter()
            x, y = next(self.batches, None) or next(iter(self.loader))
            loss = F.cross_entropy(self.net(x).flatten(0, 1), y.flatten())
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.clip)
            self.opt.step()
            self.bare.append(time.perf_counter() - t0)
        self.last = None  # the bare steps are not pipeline time

    def on_train_end(self, trainer, pl_module) -> None:
        times = {"pipeline": self.pipeline, "bare": self.bare}
        (Path(trainer.default_root_dir) / "step_times.json").write_text(json.dumps(times))


def run(data: Path | None, max_steps: int, seed: int, run_dir: Path) -> dict:
    """One training run through `python -m src.train`; returns its metrics and step times."""
    cmd = [
        sys.executable, "-m", "src.train", "experiment=gpt_shakespeare_char",
        *([f"data.path={data}"] if data else []), f"trainer.max_steps={max_steps}",
        f"seed={seed}", "logger=csv",
        f"hydra.run.dir={run_dir}", "callbacks.progress_bar.refresh_rate=50",
        "+callbacks.bare_loop._target_=bench.gpt_shakespeare.InterleavedBareLoop",
    ]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    times = json.loads((run_dir / "step_times.json").read_text())
    return {**metrics, "pipeline": times["pipeline"][10:], "bare": times["bare"][5:]}  # warm-up


def load_run(run_dir: Path):
    """A finished run's resolved config, its train/val windows and a fresh GPT of its shape."""
    cfg = OmegaConf.load(run_dir / "config.yaml")  # resolved: the run's own settings
    d = ROOT / cfg.data.processed_dir  # a relative path is the run's: it ran in ROOT
    meta = json.loads((d / "meta.json").read_text())
    train, val = (
        TokenWindows(d / f"{s}.bin", meta["dtype"], cfg.data.block_size) for s in ("train", "val")
    )
    return cfg, train, val, lambda: GPT(GPTConfig(**cfg.model.net, vocab_size=meta["vocab_size"]))


def mean_loss(net: GPT, windows: TokenWindows, offsets: list[int]) -> float:
    net.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(offsets), 256):
            x, y = windows.__getitems__(offsets[i : i + 256])
            total += F.cross_entropy(net(x).flatten(0, 1), y.flatten(), reduction="sum").item()
    return total / (len(offsets) * windows.block_size)


def bare_training(run_dir: Path, seed: int, steps: int) -> float:
    """Trains the run's model and recipe again in a bare PyTorch loop from `seed`; returns the
    loss on the whole val split (the windows the pipeline evaluates)."""
    cfg, train, val, new_model = load_run(run_dir)
    o = cfg.model.optim
    torch.manual_seed(seed)
    net = new_model()
    opt = adamw(net, o)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_cosine(o.warmup_steps, o.decay_steps, o.min_lr / o.lr)
    )
    for _ in range(steps):
        x, y = train.__getitems__(torch.randint(train.n_starts, (cfg.data.batch_size,)).tolist())
        loss = F.cross_entropy(net(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.trainer.gradient_clip_val)
        opt.step()
        sched.step()
    return mean_loss(net, val, list(range(0, val.n_starts, val.block_size)))


def estimate_spread(run_dir: Path, draws: int = 50, batches: int = 20) -> float:
    """The standard deviation of nanoGPT's val estimate (the mean loss of `batches` batches of
    random windows) over `draws` draws, for the run's final model: how far the 20-batch
    reference figure can stray from the whole-split loss by sampling alone."""
    cfg, _, val, _ = load_run(run_dir)
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.ckpt", class_path(GPTLitModule))
    model = GPTLitModule(**ckpt["hyper_parameters"])
    model.load_state_dict(ckpt["state_dict"])
    net = model.net
    g = torch.Generator().manual_seed(0)
    n = batches * cfg.data.batch_size
    estimates = [mean_loss(net, val, torch.randint(val.n_starts, (n,), generator=g).tolist())
                 for _ in range(draws)]  # fmt: skip
    return statistics.stdev(estimates)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, help="a corpus file instead of data/raw/tinyshakespeare")
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--seeds", type=int, nargs="+", default=[1337, 1338, 1339])
    p.add_argument("--out", type=Path, default=ROOT / "outputs/bench/gpt_shakespeare")
    p.add_argument("--json", type=Path, help="also write the JSON result here (DVC's metrics)")
    p.add_argument("--bare-reference", action=argparse.BooleanOptionalAction, default=True,
                   help="also train each seed in a bare loop with the same recipe")  # fmt: skip
    args = p.parse_args()
    runs = [
        run(args.data and args.data.resolve(), args.max_steps, s, args.out.resolve() / f"seed{s}")
        for s in args.seeds
    ]
    losses = [r["val/loss"] for r in runs]
    bare_losses = []
    if args.bare_reference:
        for s in args.seeds:
            bare_losses.append(bare_training(args.out.resolve() / f"seed{s}", s, args.max_steps))
            print(f"  bare loop, seed {s}: val loss {bare_losses[-1]:.4f}", flush=True)
    spread = estimate_spread(args.out.resolve() / f"seed{args.seeds[0]}")
    tokens = 12 * 64  # batch x block of the experiment
    pipe = tokens / statistics.median([t for r in runs for t in r["pipeline"]])
    bare = tokens / statistics.median([t for r in runs for t in r["bare"]])
    mean = statistics.mean(losses)
    std = statistics.stdev(losses) if len(losses) > 1 else 0.0
    result = {
        "bench": "gpt_shakespeare_char",
        "steps": args.max_steps,
        "seeds": args.seeds,
        "val_loss": round(mean, 4),
        "val_loss_std": round(std, 4),
        "val_loss_per_seed": [round(v, 4) for v in losses],
        "val_loss_bare_loop": round(statistics.mean(bare_losses), 4) if bare_losses else None,
        "val_loss_bare_loop_per_seed": [round(v, 4) for v in bare_losses],
        "val_loss_reference": REF_VAL_LOSS,
        "val_loss_20_batch_estimate_std": round(spread, 4),
        "val_loss_target": TARGET_VAL_LOSS,
        "tokens_per_sec_pipeline": round(pipe),
        "tokens_per_sec_bare_loop": round(bare),
        "pipeline_over_bare": round(pipe / bare, 3),
        "pipeline_over_bare_target": TARGET_RATIO,
        "tokens_per_sec_reference": REF_TOKENS_PER_SEC,
        "startup_sec": round(statistics.median(r["train/startup_sec"] for r in runs), 2),
        "torch_threads": torch.get_num_threads(),
    }
    print(
        f"val loss @ {args.max_steps} steps (whole val split, {len(losses)} seeds): "
        f"{mean:.4f} ± {std:.4f}   (nanoGPT {REF_VAL_LOSS}, target <= {TARGET_VAL_LOSS})"
    )
    if bare_losses:
        bare_std = statistics.stdev(bare_losses) if len(bare_losses) > 1 else 0.0
        print(
            f"val loss of the same recipe in a bare PyTorch loop: "
            f"{result['val_loss_bare_loop']:.4f} ± {bare_std:.4f}"
        )
    print(
        f"std of a 20-batch val estimate (nanoGPT's, the reference's) for seed {args.seeds[0]}'s "
        f"model: {spread:.4f}"
    )
    print(
        f"tokens/s pipeline: {result['tokens_per_sec_pipeline']:,}   "
        f"bare loop: {result['tokens_per_sec_bare_loop']:,}   "
        f"ratio {pipe / bare:.3f} (target >= {TARGET_RATIO})   nanoGPT ~{REF_TOKENS_PER_SEC:,}"
    )
    print(f"command to first training step: {result['startup_sec']} s")
    emit_summary(result, args.json)


if __name__ == "__main__":
    main()
