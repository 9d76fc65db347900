"""GIN on MUTAG with 10-fold cross-validation, through the full pipeline, against the paper.

    python bench/gin_mutag.py [--seeds 0 1 2] [--data-root DIR]
                              [--folds 0 1 ... 9] [OVERRIDE ...]

Each run is `python -m src.train experiment=gin_mutag data.fold=K seed=S logger=csv` (see the
preset for the paper's settings), one process per fold, so that nothing carries over from one
fold to the next; extra `key=value` arguments go to every run (e.g. model.net.hidden=16). The
folds are drawn once with split seed 0 (data.split_seed, fixed); --seeds varies the model's seed
(initialisation, dropout, batch order). Each run logs the accuracy on its held-out fold after
every epoch to `<run dir>/csv/metrics.csv`; the bench reads those curves and reports:

(a) the GIN paper's protocol (Xu et al. 2019, sec. 7): the mean over the 10 folds of the
    held-out accuracy after every epoch, the epoch where that mean is highest, and mean ± std
    over the folds at that epoch. The epoch is chosen on the test folds themselves, as the
    paper does, so this figure is optimistic (Errica et al. 2020): it is the one to compare
    with the paper, not an unbiased estimate;
(b) the accuracy after the last epoch, mean ± std over the folds: no choice made on the test
    folds.

std is over the folds, numpy's default (divisor 10, not 9). With several seeds each seed gets
its own protocol-(a) epoch and the figures are also averaged over the seeds.

PyTorch runs with one thread per process (OMP_NUM_THREADS=1 unless set): MUTAG's graphs are
tiny (~18 nodes), and on a shared 2-core machine two threads per process ran ~5x slower than
one. References: GIN-0 89.4 ± 5.6 % (paper, Table 1); target: (a) >= 89 %. The last line
printed is JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAPER, PAPER_STD, TARGET = 89.4, 5.6, 89.0  # GIN-0 on MUTAG, % (Xu et al. 2019, Table 1)


def curve(metrics_csv: Path) -> tuple[list[int], list[float]]:
    """The epochs (1-based) after which the held-out fold was evaluated and its accuracy (%)
    there, from a CSVLogger metrics.csv."""
    acc: dict[int, float] = {}
    with metrics_csv.open() as f:
        for row in csv.DictReader(f):
            if row.get("val/acc"):
                acc[int(row["epoch"]) + 1] = 100 * float(row["val/acc"])
    if not acc:
        raise RuntimeError(f"{metrics_csv}: no val/acc")
    epochs = sorted(acc)
    return epochs, [acc[e] for e in epochs]


def run(fold: int, seed: int, run_dir: Path, args, overrides: list[str]) -> dict:
    """One fold through `python -m src.train`; returns its accuracy curve and timings."""
    cmd = [
        sys.executable, "-m", "src.train", "experiment=gin_mutag", f"data.fold={fold}",
        f"seed={seed}", "logger=csv",
        "callbacks.progress_bar.refresh_rate=0", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    if args.data_root:
        cmd.append(f"data.root={args.data_root}")
    cmd += overrides
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a fresh csv/metrics.csv, not one appended to
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(args.threads))}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        print("$", " ".join(cmd), file=sys.stderr)
        print(proc.stdout[-2000:] + proc.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"fold {fold}, seed {seed} failed (exit code {proc.returncode})")
    epochs, acc = curve(run_dir / "csv" / "metrics.csv")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    print(
        f"  seed {seed} fold {fold}: {seconds:5.1f} s for {epochs[-1]} epochs "
        f"({metrics['train/startup_sec']:.1f} s start-up); held-out acc last epoch "
        f"{acc[-1]:.1f} %, best {max(acc):.1f} % (epoch {epochs[acc.index(max(acc))]})",
        flush=True,
    )
    return {"epochs": epochs, "acc": acc, "seconds": seconds}


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.pstdev(values)


def summarise(seed: int, runs: list[dict]) -> dict:
    """Protocol (a) and (b) over the folds of one seed."""
    epochs = runs[0]["epochs"]
    if any(r["epochs"] != epochs for r in runs):
        raise RuntimeError(f"seed {seed}: the folds were evaluated after different epochs")
    n = len(epochs)
    mean_curve = [statistics.mean(r["acc"][i] for r in runs) for i in range(n)]
    best = max(range(n), key=lambda i: mean_curve[i])  # the first of ties
    a_mean, a_std = mean_std([r["acc"][best] for r in runs])
    b_mean, b_std = mean_std([r["acc"][-1] for r in runs])
    print(
        f"seed {seed}, {len(runs)} folds:\n"
        f"  (a) paper protocol, epoch {epochs[best]} of {epochs[-1]} (best mean over the held-out "
        f"folds; chosen on the test folds, optimistic): {a_mean:.1f} ± {a_std:.1f} %\n"
        f"  (b) last epoch ({epochs[-1]}): {b_mean:.1f} ± {b_std:.1f} %"
    )
    return {
        "seed": seed,
        "paper_protocol_acc": round(a_mean, 2),
        "paper_protocol_std": round(a_std, 2),
        "paper_protocol_epoch": epochs[best],
        "paper_protocol_per_fold": [round(r["acc"][best], 1) for r in runs],
        "last_epoch_acc": round(b_mean, 2),
        "last_epoch_std": round(b_std, 2),
        "last_epoch_per_fold": [round(r["acc"][-1], 1) for r in runs],
        "epochs": epochs[-1],
        "evaluated_after_epochs": epochs,
        "mean_curve": [round(a, 2) for a in mean_curve],
        "sec_per_fold": [round(r["seconds"], 1) for r in runs],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-root", type=Path, default=None, help="data.root (default: preset's)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="model seeds")
    p.add_argument("--folds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS, unless already set")
    p.add_argument("--jobs", type=int, default=1, help="folds run at once (times per fold grow)")
    p.add_argument("--out", type=Path, default=ROOT / "outputs/bench/gin_mutag")
    p.add_argument("overrides", nargs="*", help="key=value for every run")
    args = p.parse_args()
    out = args.out.resolve()
    print(
        f"GIN on MUTAG, folds {args.folds}, model seeds {args.seeds}, split seed 0, "
        f"overrides {args.overrides or 'none'}; runs in {out}",
        flush=True,
    )
    t0 = time.perf_counter()
    summaries = []
    for seed in args.seeds:
        dirs = [out / f"seed{seed}" / f"fold{k}" for k in args.folds]
        with ThreadPoolExecutor(args.jobs) as pool:
            jobs = [pool.submit(run, k, seed, d, args, args.overrides)
                    for k, d in zip(args.folds, dirs, strict=True)]  # fmt: skip
            runs = [job.result() for job in jobs]
        summaries.append(summarise(seed, runs))
    a = [s["paper_protocol_acc"] for s in summaries]
    b = [s["last_epoch_acc"] for s in summaries]
    secs = [t for s in summaries for t in s["sec_per_fold"]]
    print(
        f"GIN-0 on MUTAG, 10-fold CV, {len(args.seeds)} seed(s):\n"
        f"  (a) paper protocol (epoch chosen on the test folds, optimistic): "
        f"{statistics.mean(a):.1f} % (per seed {a}; std over folds "
        f"{statistics.mean(s['paper_protocol_std'] for s in summaries):.1f})   "
        f"paper {PAPER} ± {PAPER_STD}, target >= {TARGET}: "
        f"{'met' if statistics.mean(a) >= TARGET else 'NOT met'}\n"
        f"  (b) last epoch: {statistics.mean(b):.1f} % (per seed {b}; std over folds "
        f"{statistics.mean(s['last_epoch_std'] for s in summaries):.1f})\n"
        f"  time per fold: median {statistics.median(secs):.1f} s, min {min(secs):.1f}, "
        f"max {max(secs):.1f} (whole process: start-up, {summaries[0]['epochs']} epochs, "
        f"validation every epoch, checkpoints, test)"
    )
    result = {
        "bench": "gin_mutag",
        "folds": args.folds,
        "seeds": args.seeds,
        "split_seed": 0,
        "overrides": args.overrides,
        "paper_protocol_acc": round(statistics.mean(a), 2),
        "last_epoch_acc": round(statistics.mean(b), 2),
        "paper_acc": PAPER,
        "paper_std": PAPER_STD,
        "target": TARGET,
        "target_met": statistics.mean(a) >= TARGET,
        "sec_per_fold_median": round(statistics.median(secs), 1),
        "total_sec": round(time.perf_counter() - t0, 1),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", str(args.threads)),
        "jobs": args.jobs,
        "per_seed": summaries,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
