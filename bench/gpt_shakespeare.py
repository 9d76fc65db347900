"""nanoGPT's CPU "baby GPT" on tiny Shakespeare, character level, through the full pipeline.

    python bench/gpt_shakespeare.py [--data PATH] [--max-steps 2000] [--bare-steps 300]

1. Trains `experiment=gpt_shakespeare_char` with `python -m src.train` (Lightning, CSV logging,
   checkpoints, validation on the whole val split every 250 steps) and reads its metrics.
2. Times a bare PyTorch loop (same model, data loader, optimiser, clipping and schedule; no
   Lightning) right before and right after, for the pipeline's overhead: the ratio of medians
   of 10-step windows, so that a passing load on the machine does not favour either side.
Prints val loss, tokens/s of both, startup time and the references; the last line is JSON.

References (measured on this kind of machine, 2 threads, nanoGPT's train.py with these settings):
val loss 1.886 at iteration 2000 (nanoGPT's estimate, 20 val batches), median 47 ms/iteration
(~16,000 tokens/s).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF_VAL_LOSS, REF_TOKENS_PER_SEC = 1.886, 16_000
TARGET_VAL_LOSS, TARGET_RATIO = 1.88, 0.95


def run_pipeline(data: Path, max_steps: int, run_dir: Path) -> dict:
    cmd = [
        sys.executable, "-m", "src.train", "experiment=gpt_shakespeare_char", f"data.path={data}",
        f"trainer.max_steps={max_steps}", "logger=csv", f"hydra.run.dir={run_dir}",
        "callbacks.progress_bar.refresh_rate=50",
    ]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    with open(run_dir / "csv" / "metrics.csv") as f:
        rates = [
            float(r["train/tokens_per_sec"])
            for r in csv.DictReader(f)
            if r.get("train/tokens_per_sec")
        ]
    metrics["tokens_per_sec_median"] = statistics.median(rates[1:])  # first window holds warm-up
    return metrics


def bare_loop(data: Path, steps: int, window: int = 10) -> list[float]:
    """The same training step without Lightning; returns tokens/s of each window of steps."""
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from src.utils.config import register_resolvers

    register_resolvers()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "train",
            ["experiment=gpt_shakespeare_char", f"data.path={data}", "paths.output_dir=.",
             "logger=none", "hydra.job.num=0"],
            return_hydra_config=True,
        )  # fmt: skip
    cfg.data.name, cfg.experiment_name, cfg.tags = "shakespeare", "bench", []
    dm = instantiate(cfg.data, _convert_="all")
    dm.prepare_data()
    dm.setup("fit")
    torch.manual_seed(cfg.seed)
    module = instantiate(cfg.model, **dm.model_kwargs, _convert_="all")
    opt_cfg = module.configure_optimizers()
    opt, sched = opt_cfg["optimizer"], opt_cfg["lr_scheduler"]["scheduler"]
    model = module.net.train()
    rates, t0, step = [], time.perf_counter(), 0
    while step < steps:
        for x, y in dm.train_dataloader():
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.gradient_clip_val)
            opt.step()
            sched.step()
            step += 1
            if step % window == 0:
                now = time.perf_counter()
                rates.append(window * x.numel() / (now - t0))
                t0 = now
            if step == steps:
                break
    return rates[1:]  # the first window holds warm-up


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=ROOT / "../shared/data/tinyshakespeare/input.txt")
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--bare-steps", type=int, default=300)
    p.add_argument("--out", type=Path, default=ROOT / "outputs/bench/gpt_shakespeare")
    args = p.parse_args()
    data = args.data.resolve()
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))

    before = bare_loop(data, args.bare_steps)
    pipe = run_pipeline(data, args.max_steps, args.out.resolve())
    bare = statistics.median(before + bare_loop(data, args.bare_steps))
    ratio = pipe["tokens_per_sec_median"] / bare
    result = {
        "bench": "gpt_shakespeare_char",
        "steps": args.max_steps,
        "val_loss": round(pipe["val/loss"], 4),
        "val_loss_reference": REF_VAL_LOSS,
        "val_loss_target": TARGET_VAL_LOSS,
        "tokens_per_sec_pipeline": round(pipe["tokens_per_sec_median"]),
        "tokens_per_sec_bare_loop": round(bare),
        "pipeline_over_bare": round(ratio, 3),
        "pipeline_over_bare_target": TARGET_RATIO,
        "tokens_per_sec_reference": REF_TOKENS_PER_SEC,
        "startup_sec": round(pipe["train/startup_sec"], 2),
        "torch_threads": __import__("torch").get_num_threads(),
    }
    print(
        f"val loss @ {args.max_steps} steps: {result['val_loss']:.4f}   "
        f"(nanoGPT {REF_VAL_LOSS}, target <= {TARGET_VAL_LOSS})"
    )
    print(
        f"tokens/s pipeline: {result['tokens_per_sec_pipeline']:,}   "
        f"bare loop: {result['tokens_per_sec_bare_loop']:,}   "
        f"ratio {ratio:.3f} (target >= {TARGET_RATIO})   nanoGPT ~{REF_TOKENS_PER_SEC:,}"
    )
    print(f"command to first training step: {result['startup_sec']} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
