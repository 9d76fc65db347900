"""The fault-injection suite in full: every fault of tests/test_faults.py (the kill -9 trials ten
seeded times each) and the bad-input table of tests/test_bad_input.py, counted by kind.

    python bench/faults.py [--out DIR] [--json FILE]

Runs pytest on both files with the slow trials included, reads its JUnit report and prints one
row per kind of fault: trials run, trials survived (the run ended as the test demands: the same
metrics as a clean run, one error line, nothing written earlier lost). The last line printed is
JSON. About 15 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from src.utils.summary import emit_summary

ROOT = Path(__file__).resolve().parents[1]
KINDS = {  # test name (without parameters) -> the fault it injects
    "test_kill_during_preparation": "kill -9 during data preparation",
    "test_kill_during_preparation_trials": "kill -9 during data preparation",
    "test_kill_during_training": "kill -9 during training, then resume",
    "test_kill_during_training_trials": "kill -9 during training, then resume",
    "test_signal_mid_epoch_then_resume": "SIGTERM / SIGINT mid-epoch, then resume",
    "test_second_signal_exits_without_waiting": "a second SIGTERM during the shutdown",
    "test_resume_without_checkpoint_starts_afresh": "ckpt_path=last before any checkpoint",
    "test_resume_after_training_finished": "killed after the last checkpoint, then resume",
    "test_disk_full_while_saving_a_checkpoint": "disk full while saving a checkpoint",
    "test_disk_full_while_writing_a_dataset": "disk full while writing a dataset",
    "test_ddp_worker_lost": "a DDP worker killed or hung",
    "test_checkpoint_of_another_shape_is_one_line": "a checkpoint of another shape",
    "test_same_seed_same_metrics": "determinism: the same seed twice",
}


def run_suite(out: Path) -> Path:
    report = out / "faults.xml"
    cmd = [sys.executable, "-m", "pytest", "tests/test_faults.py", "tests/test_bad_input.py",
           "-m", "slow or not slow", "-n", "0", "-q", f"--junitxml={report}"]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=False)
    return report


def tally(report: Path) -> dict[str, dict[str, int]]:
    """kind -> {"run": n, "survived": n} from the JUnit report."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"run": 0, "survived": 0})
    for case in ET.parse(report).getroot().iter("testcase"):
        name = re.sub(r"\[.*\]$", "", case.get("name"))
        kind = KINDS.get(name, "bad input (one error line, exit 1, nothing lost)"
                         if "bad_input" in case.get("classname", "") else name)  # fmt: skip
        if case.find("skipped") is not None:
            continue
        counts[kind]["run"] += 1
        counts[kind]["survived"] += case.find("failure") is None and case.find("error") is None
    return dict(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench" / "faults")
    parser.add_argument("--json", type=Path, default=None, help="write the summary here too")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    start = time.time()
    counts = tally(run_suite(args.out))
    table = Table(title=f"fault injection ({(time.time() - start) / 60:.1f} min)")
    for column in ("fault", "trials", "survived"):
        table.add_column(column, justify="left" if column == "fault" else "right")
    for kind, c in counts.items():
        table.add_row(kind, str(c["run"]), str(c["survived"]))
    total = {k: sum(c[k] for c in counts.values()) for k in ("run", "survived")}
    table.add_row("all", str(total["run"]), str(total["survived"]), style="bold")
    Console(width=100).print(table)
    emit_summary({"faults": counts, **total, "minutes": round((time.time() - start) / 60, 1)},
                 args.json)  # fmt: skip
    sys.exit(0 if total["run"] == total["survived"] else 1)


if __name__ == "__main__":
    main()
