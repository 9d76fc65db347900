"""What the benchmarks in bench/ share: training runs through the entry point, and the end of
every benchmark, its summary printed as the last line, in JSON, and written to --json's file
(the metrics a DVC stage declares) when one is given."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def train_run(
    overrides: list[str], run_dir: Path, threads: int | None = None
) -> tuple[dict, float]:
    """`python -m src.train *overrides` into run_dir (emptied first: an earlier run's checkpoints
    are not this one's), logged to CSV without a progress bar: (its metrics.json, wall seconds).
    threads: its OMP_NUM_THREADS (runs side by side). A failed run stops the benchmark with its
    last error line."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "src.train", "logger=csv", "callbacks.progress_bar.refresh_rate=0",
           *overrides, f"hydra.run.dir={run_dir}"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["(no output)"]
        sys.exit(f"error: {run_dir.name} did not train: {lines[-1]}")
    return json.loads((run_dir / "metrics.json").read_text()), time.perf_counter() - t0


def emit_summary(summary: dict, path: Path | None) -> None:
    print(json.dumps(summary))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1) + "\n")
