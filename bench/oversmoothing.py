"""Over-smoothing of deep GCNs on Cora, and what residual connections and jumping knowledge do.

    python bench/oversmoothing.py [--seeds 0 1 2] [--data-root DIR]

Runs the sweep of `conf/experiment/oversmoothing.yaml` (GCN at depths 2, 4, 8, 16, 32; plain,
residual, jumping knowledge, both) once per seed as one Hydra multirun, reads each job's
metrics.json, and plots test accuracy, the mean pairwise cosine similarity of the last hidden
embeddings, and their Dirichlet energy against depth: `docs/oversmoothing.png`, also logged to
wandb (offline without a key) as an image with the table beside it. The last line printed is
JSON. Reference point: Kipf & Welling (2017, appendix B) report that plain GCNs on Cora lose
accuracy beyond 2-3 layers and that residual connections keep deeper models trainable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

from src.utils.summary import emit_summary

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {  # (residual, jk) -> label
    (False, "none"): "plain",
    (True, "none"): "residual",
    (False, "cat"): "jumping knowledge",
    (True, "cat"): "residual + JK",
}
MEASURES = {
    "test/acc": "test accuracy",
    "test/cosine_similarity": "mean cosine similarity",
    "test/dirichlet_energy": "Dirichlet energy",
}


def sweep(data: list[str], seeds: list[int], out: Path) -> list[dict]:
    """One multirun over depths x variants x seeds; -> one record per job."""
    cmd = [
        sys.executable, "-m", "src.train", "experiment=oversmoothing", *data,
        "logger=csv", "callbacks.progress_bar.refresh_rate=0",
        f"seed={','.join(map(str, seeds))}", f"hydra.sweep.dir={out}",
    ]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    records = []
    for job in sorted(out.iterdir()):
        if not (job / "metrics.json").is_file():
            continue
        net = yaml.safe_load((job / "config.yaml").read_text())["model"]["net"]
        metrics = json.loads((job / "metrics.json").read_text())
        records.append(
            {
                "depth": net["num_layers"],
                "variant": VARIANTS[(net["residual"], net["jk"])],
                **{k: metrics[k] for k in MEASURES},
            }
        )
    return records


def summarise(records: list[dict]) -> dict:
    """{variant: {depth: {measure: mean over seeds}}}."""
    table: dict = {}
    for r in records:
        table.setdefault(r["variant"], {}).setdefault(r["depth"], []).append(r)
    return {
        variant: {
            depth: {k: statistics.mean(r[k] for r in rs) for k in MEASURES}
            for depth, rs in sorted(by_depth.items())
        }
        for variant, by_depth in table.items()
    }


def plot(summary: dict, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(MEASURES), figsize=(4.2 * len(MEASURES), 3.4))
    for ax, (key, label) in zip(axes, MEASURES.items(), strict=True):
        for variant in VARIANTS.values():
            if variant in summary:
                depths = sorted(summary[variant])
                ax.plot(depths, [summary[variant][d][key] for d in depths], "o-", label=variant)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GCN layers")
        ax.set_title(label)
        if key == "test/dirichlet_energy":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Over-smoothing on Cora (last hidden embeddings)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return fig


def log_to_wandb(path: Path, summary: dict, out: Path) -> None:
    import wandb

    mode = os.environ.get("WANDB_MODE") or (
        "online" if os.environ.get("WANDB_API_KEY") else "offline"
    )
    run = wandb.init(project="bishop-pipeline", group="oversmoothing", job_type="bench",
                     dir=str(out), mode=mode)  # fmt: skip
    rows = [[v, d, *m.values()] for v, by_depth in summary.items() for d, m in by_depth.items()]
    table = wandb.Table(columns=["variant", "depth", *MEASURES], data=rows)
    run.log({"oversmoothing/plot": wandb.Image(str(path)), "oversmoothing/table": table})
    run.finish()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--out", type=Path, default=ROOT / "outputs/bench/oversmoothing")
    p.add_argument("--plot", type=Path, default=ROOT / "docs/oversmoothing.png")
    p.add_argument("--data-root", type=Path, help="data.root (default: the preset's)")
    p.add_argument("--json", type=Path, help="also write the JSON result here (DVC's metrics)")
    p.add_argument("--no-wandb", action="store_true")
    args = p.parse_args()
    data = [f"data.root={args.data_root.resolve()}"] if args.data_root else []
    summary = summarise(sweep(data, args.seeds, args.out.resolve()))
    print(f"{'variant':<18} {'depth':>5} {'acc %':>6} {'cos sim':>8} {'Dirichlet':>10}")
    for variant, by_depth in summary.items():
        for depth, m in by_depth.items():
            acc, cos, energy = (m[k] for k in MEASURES)
            print(f"{variant:<18} {depth:>5} {100 * acc:>6.1f} {cos:>8.3f} {energy:>10.3g}")
    plot(summary, args.plot)
    print(f"plot: {args.plot}")
    if not args.no_wandb:
        log_to_wandb(args.plot, summary, args.out.resolve())
    result = {"bench": "oversmoothing", "seeds": args.seeds, "summary": summary}
    emit_summary(result, args.json)


if __name__ == "__main__":
    main()
