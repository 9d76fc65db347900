"""Compare runs side by side: their final metrics, the config keys in which they differ, and their
curves overlaid in one PNG. Reads only the run folders (config.yaml, metrics.json, and the curves
from csv/metrics.csv or else the offline wandb log), so it works offline and with no account.

    python -m src.compare outputs/runs/A outputs/runs/B     # runs by folder
    python -m src.compare --group gpt_text                   # every run of a wandb group
    python -m src.compare --sweep outputs/multiruns/<sweep>  # a sweep's trials and its best
    options: --metrics val/loss train/loss   the curves to draw (and columns to show)
             --md                            the table as Markdown instead of a rich table
             --plot FILE                     where the curves go (default: compare.png beside
                                             the sweep, else outputs/compare.png)
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

IGNORED = ("paths.", "logger.")  # where a run wrote, not what it was
DEFAULT_CURVES = ("val/loss", "train/loss")


@dataclass
class Run:
    path: Path
    config: dict[str, Any]  # flattened: "model.optim.lr" -> 0.001
    metrics: dict[str, float]  # metrics.json; empty when the run did not finish
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # key -> (step, v)

    @property
    def name(self) -> str:  # a sweep's trial is "<sweep>/<job number>"
        trial = self.path.name.isdigit()
        return f"{self.path.parent.name}/{self.path.name}" if trial else self.path.name


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_run(path: Path, metric_keys: list[str]) -> Run:
    import json

    config = flatten(yaml.safe_load((path / "config.yaml").read_text()) or {})
    home = str(config.get("paths.output_dir", path))  # keys naming the run's own folder differ
    config = {k: v for k, v in config.items() if not (isinstance(v, str) and v.startswith(home))}
    metrics_file = path / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
    return Run(path, config, metrics, read_curves(path, metric_keys))


def read_curves(path: Path, keys: list[str]) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of each key: from the CSV logger's file, else from the offline wandb log."""
    curves: dict[str, list[tuple[int, float]]] = {k: [] for k in keys}
    table = path / "csv" / "metrics.csv"
    if table.exists():
        for row in csv.DictReader(table.read_text().splitlines()):
            for k in keys:
                if row.get(k):
                    curves[k].append((int(row["step"]), float(row[k])))
        return curves
    from src.utils.wandb_files import offline_runs, read_offline_run

    folders = offline_runs(path)
    latest = folders[-1].name.rsplit("-", 1)[-1] if folders else None
    for folder in (f for f in folders if f.name.endswith(f"-{latest}")):  # a resumed run's parts
        part: dict[str, list[tuple[int, float]]] = {k: [] for k in keys}
        for row in read_offline_run(folder).history:
            for k in keys:
                if isinstance(row.get(k), int | float):
                    part[k].append((int(row.get("trainer/global_step", row["_step"])), row[k]))
        for k, points in part.items():  # a later part replaces what an earlier one logged after
            if points:  # the checkpoint it resumed from
                curves[k] = [p for p in curves[k] if p[0] < points[0][0]] + points
    return curves


def find_runs(args: argparse.Namespace) -> tuple[list[Path], dict | None]:
    """The run folders to compare, and a sweep's optimization_results.yaml (Optuna's), if any."""
    if args.sweep:
        sweep = Path(args.sweep)
        trials = [p for p in sweep.iterdir() if (p / "config.yaml").exists()]
        runs = sorted(trials, key=lambda p: (len(p.name), p.name))  # 0, 1, ..., 10, ...
        best = sweep / "optimization_results.yaml"
        return runs, yaml.safe_load(best.read_text()) if best.exists() else None
    if args.group:
        root = Path(args.root)
        candidates = sorted(
            [*root.glob("runs/*/config.yaml"), *root.glob("multiruns/*/*/config.yaml")]
        )
        return [c.parent for c in candidates if args.group in groups_of(c)], None
    return [Path(p) for p in args.runs], None


def groups_of(config_file: Path) -> set[str]:
    """The experiment a run belongs to and its wandb group (a sweep's: <experiment>-<sweep>)."""
    config = flatten(yaml.safe_load(config_file.read_text()) or {})
    return {str(config.get("experiment_name")), str(config.get("logger.wandb.group"))}


def differing_keys(runs: list[Run]) -> list[str]:
    keys = sorted({k for r in runs for k in r.config if not k.startswith(IGNORED)})
    return [k for k in keys if len({repr(r.config.get(k)) for r in runs}) > 1]


def metric_columns(runs: list[Run], chosen: list[str]) -> list[str]:
    """The chosen metrics, then every val/ and test/ metric any run reports."""
    rest = sorted({k for r in runs for k in r.metrics if k.startswith(("val/", "test/"))})
    return [*chosen, *(k for k in rest if k not in chosen)]


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def table_rows(
    runs: list[Run], keys: list[str], metrics: list[str]
) -> tuple[list[str], list[list[str]]]:
    """One row per run, or, when there are fewer runs than columns, one row per key and metric
    and a column per run (a few runs with many differences stay readable at 80 columns)."""
    header = ["run", *keys, *metrics]
    rows = []
    for r in runs:
        values = [fmt(r.metrics.get(m)) if r.metrics else "unfinished" for m in metrics]
        rows.append([r.name, *(fmt(r.config.get(k)) for k in keys), *values])
    if len(runs) >= len(header) - 1:
        return header, rows
    columns = zip(header[1:], *(row[1:] for row in rows), strict=True)
    return ["", *(row[0] for row in rows)], [list(col) for col in columns]


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def best_line(runs: list[Run], best: dict) -> str:
    """The trial Optuna found best: its folder, metric and values."""
    value = best.get("best_value")
    trial = next((r for r in runs if r.metrics.get(r.config.get("optimized_metric")) == value),
                 None)  # fmt: skip
    metric = trial.config["optimized_metric"] if trial else "value"
    params = " ".join(f"{k}={fmt(v)}" for k, v in (best.get("best_params") or {}).items())
    return f"best trial: {trial.name if trial else '?'}, {metric} {fmt(value)}, with {params}"


def plot(runs: list[Run], metrics: list[str], out: Path) -> bool:
    """One panel per metric, one line per run; False when no run logged any of them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [m for m in metrics if any(r.curves.get(m) for r in runs)]
    if not drawn:
        return False
    fig, axes = plt.subplots(1, len(drawn), figsize=(5 * len(drawn), 3.6), squeeze=False)
    for ax, m in zip(axes[0], drawn, strict=True):
        for r in runs:
            if points := r.curves.get(m):
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, label=r.name, marker="." if len(points) < 30 else None)
        ax.set(title=m, xlabel="step")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m src.compare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])  # fmt: skip
    p.add_argument("runs", nargs="*", help="run folders (each with config.yaml)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--group", help="every run of this experiment or wandb group")
    which.add_argument("--sweep", help="a multirun folder: its trials, and Optuna's best")
    p.add_argument("--root", default="outputs", help="where --group looks (default: outputs)")
    p.add_argument("--metrics", nargs="+", default=list(DEFAULT_CURVES))
    p.add_argument("--md", action="store_true", help="print the table as Markdown")
    p.add_argument("--plot", type=Path, help="the PNG of the curves")
    args = p.parse_args(argv)
    if bool(args.runs) == bool(args.group or args.sweep):
        p.error("give run folders, or --group NAME, or --sweep DIR")

    paths, best = find_runs(args)
    if missing := [str(x) for x in paths if not (x / "config.yaml").exists()]:
        sys.exit(f"error: not a run folder (no config.yaml): {missing[0]}")
    if not paths:
        sys.exit(f"error: no runs found ({'--group ' + args.group if args.group else args.sweep})")
    runs = [load_run(x, args.metrics) for x in paths]
    header, rows = table_rows(runs, differing_keys(runs), metric_columns(runs, args.metrics))
    if args.md:
        print(markdown(header, rows))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{len(runs)} runs")
        table.add_column(header[0], no_wrap=True, min_width=max(len(row[0]) for row in rows))
        for h in header[1:]:
            table.add_column(h)
        for row in rows:
            table.add_row(*row)
        console = Console()
        if not console.is_terminal:  # a file or a pipe: as wide as the table, never cut
            widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
            console = Console(width=max(80, sum(widths) + 3 * len(widths) + 1))
        console.print(table)
    if best:
        print(best_line(runs, best))
    out = args.plot or (Path(args.sweep) if args.sweep else Path(args.root)) / "compare.png"
    if plot(runs, args.metrics, out):
        print(f"curves: {out}")


if __name__ == "__main__":
    main()
