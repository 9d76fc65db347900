"""Faults injected into real runs: signals, kill -9, a full disk, a dead or hung DDP worker.

Each fault is a real process event (a signal sent from outside, OSError(ENOSPC) raised by the
writer) on a few-seconds GPT run of tiny Shakespeare. The kill -9 trials, a hung DDP worker and
two same-seed runs are marked slow: `python bench/faults.py` runs them all, the kill -9 trials
eleven seeded times each.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.conftest import FAST, ROOT, assert_ok, run_module

STEPS, EPOCH = 24, 10  # an epoch boundary at 10 and 20: faults land mid-epoch as well
RUN = [
    *(o for o in FAST if not o.startswith(("trainer.max_steps", "data.steps_per_epoch"))),
    f"trainer.max_steps={STEPS}",
    f"data.steps_per_epoch={EPOCH}",
    "model.optim.decay_steps=24",
    "model.net.dropout=0.1",  # random numbers in every step: resuming must draw the same ones
    "logger=many",
]
SLOW_TRIALS = 10


def _args(run_dir: Path, data: Path, *overrides: str) -> list[str]:
    return [*RUN, f"data.path={data}", f"hydra.run.dir={run_dir}",
            f"paths.data_dir={run_dir.parent}/data", *overrides]  # fmt: skip


def _start(module: str, args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=env,
        stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _logged_step(run_dir: Path) -> int:
    """The last training step in the run's metrics.csv (written live), -1 before the first."""
    table = run_dir / "csv" / "metrics.csv"
    try:
        rows = list(csv.DictReader(table.read_text().splitlines()))
    except FileNotFoundError:
        return -1
    return max((int(r["step"]) for r in rows if r.get("train/loss")), default=-1)


def _wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int) -> None:
    deadline = time.time() + 300
    while _logged_step(run_dir) < step:
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before step {step}"
        assert time.time() < deadline, f"no step {step} within 5 minutes"
        time.sleep(0.02)


def _metrics(run_dir: Path) -> dict:
    """metrics.json without the timings (tokens/s, start-up seconds)."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {k: v for k, v in metrics.items() if not k.endswith("_sec")}


def _train_losses(run_dir: Path) -> dict[int, float]:
    rows = csv.DictReader((run_dir / "csv" / "metrics.csv").read_text().splitlines())
    losses = [(int(r["step"]), float(r["train/loss"])) for r in rows if r.get("train/loss")]
    assert len(losses) == len(dict(losses)), "a step logged twice"
    return dict(losses)


def _assert_same_run(run_dir: Path, clean: Path) -> None:
    """The same final metrics and the same training curve, step by step, as the clean run."""
    assert _metrics(run_dir) == pytest.approx(_metrics(clean), rel=1e-6)
    assert _train_losses(run_dir) == pytest.approx(_train_losses(clean), rel=1e-6)


def _ckpt_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["global_step"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory, shakespeare) -> Path:
    """The uninterrupted run that every faulty run must end up equal to."""
    run_dir = tmp_path_factory.mktemp("faults") / "clean"
    assert_ok(run_module("src.train", *_args(run_dir, shakespeare)))
    return run_dir


@pytest.mark.slow  # test_resume_without_checkpoint_starts_afresh compares two fresh runs too
def test_same_seed_same_metrics(clean, shakespeare):
    again = clean.parent / "again"
    assert_ok(run_module("src.train", *_args(again, shakespeare)))
    assert _metrics(again) == _metrics(clean)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGINT"])  # fmt: skip
def test_signal_mid_epoch_then_resume(clean, shakespeare, sig, code):
    """A signal at a random step inside an epoch: last.ckpt at that step, exit 128 + signal, no
    metrics.json, wandb run failed; `ckpt_path=last` ends exactly as the uninterrupted run, in
    the same wandb run and CSV log."""
    from src.utils.wandb_files import offline_runs, read_offline_run

    run_dir = clean.parent / f"cut-{sig.name}"
    at = random.Random(sig).choice([s for s in range(11, 19) if s % EPOCH])
    proc = _start("src.train", _args(run_dir, shakespeare), run_dir.with_suffix(".log"))
    _wait_for_step(proc, run_dir, at)
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == code, run_dir.with_suffix(".log").read_text()[-3000:]
    assert not (run_dir / "metrics.json").exists()
    stopped = _ckpt_step(run_dir / "checkpoints" / "last.ckpt")
    assert at < stopped < STEPS and stopped % EPOCH, "saved at the step the signal arrived in"
    (first,) = offline_runs(run_dir)
    assert (read_offline_run(first).state, read_offline_run(first).exit_code) == ("failed", code)

    assert_ok(run_module("src.train", *_args(run_dir, shakespeare, "ckpt_path=last")))
    _assert_same_run(run_dir, clean)
    parts = offline_runs(run_dir)
    assert len(parts) == 2 and len({p.name.rsplit("-", 1)[1] for p in parts}) == 1  # one id


def test_second_signal_exits_without_waiting(clean, shakespeare):
    run_dir = clean.parent / "twice"
    proc = _start("src.train", _args(run_dir, shakespeare), run_dir.with_suffix(".log"))
    _wait_for_step(proc, run_dir, 3)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert not (run_dir / "metrics.json").exists()


def test_resume_without_checkpoint_starts_afresh(clean, shakespeare):
    """ckpt_path=last in a new folder (a requeued job's first start) trains from scratch."""
    run_dir = clean.parent / "first-start"
    assert_ok(run_module("src.train", *_args(run_dir, shakespeare, "ckpt_path=last")))
    assert _metrics(run_dir) == _metrics(clean)


def test_resume_after_training_finished(clean, shakespeare):
    """Killed after the last step's checkpoint (while testing): resuming has nothing left to
    train and still reports the run's metrics, from the checkpoint."""
    run_dir = clean.parent / "finished"
    shutil.copytree(clean, run_dir, ignore=shutil.ignore_patterns("metrics.json", "wandb"))
    assert_ok(run_module("src.train", *_args(run_dir, shakespeare, "ckpt_path=last")))
    _assert_same_run(run_dir, clean)


def test_checkpoint_of_another_shape_is_one_line(clean, shakespeare):
    last = clean / "checkpoints" / "last.ckpt"
    wide = _args(clean.parent / "wide", shakespeare, "model.net.d_model=64", f"ckpt_path={last}")
    proc = run_module("src.train", *wide)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "does not fit this model" in line and "net.d_model=64 (checkpoint: 32)" in line
    assert "64) here, (71, 32) in the checkpoint" in line  # the first tensor that differs


# --------------------------------------------------------------------------- a full disk

_FULL_DISK = """
import errno, fnmatch, pathlib, runpy, sys, torch
what, pattern, after = sys.argv[1], sys.argv[2], int(sys.argv[3])
seen = []
def failing(real, name_of):  # a writer that finds the disk full after `after` matching writes
    def write(*args, **kwargs):
        name = name_of(*args)
        if fnmatch.fnmatch(name, pattern):
            seen.append(name)
            if len(seen) > after:
                raise OSError(errno.ENOSPC, "No space left on device", name)
        return real(*args, **kwargs)
    return write
if what == "torch.save":
    torch.save = failing(torch.save, lambda obj, f, *rest: str(f))
else:
    pathlib.Path.write_text = failing(pathlib.Path.write_text, lambda path, *rest: str(path))
sys.argv = ["src.train", *sys.argv[4:]]
runpy.run_module("src.train", run_name="__main__", alter_sys=True)  # python -m src.train
"""


def _with_full_disk(what: str, pattern: str, after: int, args: list[str]):
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, "-c", _FULL_DISK, what, pattern, str(after), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_disk_full_while_saving_a_checkpoint(clean, shakespeare):
    """The epoch-2 checkpoint cannot be written: one error line, epoch 1's last.ckpt intact."""
    run_dir = clean.parent / "full-disk"
    proc = _with_full_disk("torch.save", "*.ckpt*", 2, _args(run_dir, shakespeare, "logger=csv"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "No space left on device" in line and "already there is unchanged" in line
    assert _ckpt_step(run_dir / "checkpoints" / "last.ckpt") == EPOCH
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]


def test_disk_full_while_writing_a_dataset(clean, shakespeare):
    """Re-tokenising (new splits) fails at its last file: the old processed data stays whole."""
    processed = next((clean.parent / "data" / "processed").iterdir())
    before = _digest(processed)
    run_dir = clean.parent / "full-disk-data"
    args = _args(run_dir, shakespeare, "data.splits=[0.8,0.1,0.1]", "logger=csv")
    proc = _with_full_disk("write_text", "*/meta.json", 0, args)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "No space left on device" in proc.stderr
    assert _digest(processed) == before
    assert [p.name for p in processed.parent.iterdir()] == [processed.name]  # no temporary left


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}  # fmt: skip


# --------------------------------------------------------------------------- a DDP worker lost


@pytest.mark.parametrize("fault", ["killed", pytest.param("hung", marks=pytest.mark.slow)])
def test_ddp_worker_lost(tmp_path, shakespeare, fault):
    """2 gloo processes; the second is killed, or stopped (SIGSTOP): the first ends with one
    error line within the collective timeout, never the 30-minute default, and no process is
    left behind."""
    run_dir = tmp_path / "ddp"
    args = _args(run_dir, shakespeare, "trainer=ddp_cpu", "logger=csv", "trainer.max_steps=10000",
                 "trainer.strategy.timeout.seconds=15")  # fmt: skip
    proc = _start("src.train", args, tmp_path / "ddp.log")
    _wait_for_step(proc, run_dir, 2)
    (worker,) = psutil.Process(proc.pid).children()
    worker.send_signal(signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
    start = time.time()
    assert proc.wait(timeout=120) == 1
    assert time.time() - start < 15 + 30
    errors = [
        ln for ln in (tmp_path / "ddp.log").read_text().splitlines() if ln.startswith("error:")
    ]
    assert errors and "another process of this run died or stopped answering" in errors[-1]
    assert not psutil.pid_exists(worker.pid) or worker.status() == psutil.STATUS_ZOMBIE


def test_lightnings_watch_over_a_dead_child_ends_the_run_with_one_line_and_exit_1():
    """When Lightning's observer of the processes it started notices a dead one before this
    process's collective fails, it used to SIGKILL the run (exit -9, no message)."""
    code = (
        "import os, subprocess, sys\n"
        "from lightning_fabric.strategies.launchers.subprocess_script import "
        "_ChildProcessObserver\n"
        "from src.utils.errors import exit_1_when_a_child_dies\n"
        "exit_1_when_a_child_dies()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import os; os._exit(3)'])\n"
        "child.wait()\n"
        "_ChildProcessObserver(os.getpid(), [child])._run()\n"
        "print('not reached')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "not reached" not in r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: process 0 of 2: another process of this run died or stopped")
    assert "(exit code 3)" in last


# --------------------------------------------------------------------------- kill -9


def _kill_during_preparation(root: Path, shakespeare: Path, seed: int) -> None:
    """kill -9 at a random moment of BPE tokenisation; the folder is then either absent or whole,
    and a rerun ends with the clean preparation's files."""
    args = [f"data.path={shakespeare}", "data.tokenizer=bpe", "data.vocab_size=512"]
    clean, faulty = root / "clean-data", root / f"data-{seed}"
    if not clean.exists():
        assert_ok(run_module("src.prepare", *args, f"paths.data_dir={clean}"))
    (reference,) = (clean / "processed").iterdir()
    proc = _start("src.prepare", [*args, f"paths.data_dir={faulty}"], root / f"prep-{seed}.log")
    time.sleep(random.Random(seed).uniform(1.0, 8.0))
    proc.kill()
    proc.wait()
    for folder in (faulty / "processed").glob("*"):
        if not folder.name.startswith("."):  # a hidden one is a temporary, never read
            assert _digest(folder) == _digest(reference), "a half-written dataset"
    assert_ok(run_module("src.prepare", *args, f"paths.data_dir={faulty}"))
    assert [p.name for p in (faulty / "processed").iterdir()] == [reference.name]
    assert _digest(faulty / "processed" / reference.name) == _digest(reference)


def _kill_during_training(clean: Path, shakespeare: Path, seed: int) -> None:
    """kill -9 at a random step; resuming from whatever last.ckpt survived (none: from scratch)
    ends as the uninterrupted run."""
    run_dir = clean.parent / f"killed-{seed}"
    proc = _start("src.train", _args(run_dir, shakespeare), run_dir.with_suffix(".log"))
    _wait_for_step(proc, run_dir, random.Random(seed).randrange(1, STEPS - 1))
    proc.kill()
    proc.wait()
    last = run_dir / "checkpoints" / "last.ckpt"
    if last.exists():
        assert _ckpt_step(last) % EPOCH == 0  # a whole checkpoint of an epoch's end
    assert_ok(run_module("src.train", *_args(run_dir, shakespeare, "ckpt_path=last")))
    _assert_same_run(run_dir, clean)


@pytest.mark.slow
def test_kill_during_preparation(tmp_path, shakespeare):
    _kill_during_preparation(tmp_path, shakespeare, seed=0)


@pytest.mark.slow
def test_kill_during_training(clean, shakespeare):
    _kill_during_training(clean, shakespeare, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, SLOW_TRIALS + 1))
def test_kill_during_preparation_trials(tmp_path_factory, shakespeare, seed):
    _kill_during_preparation(tmp_path_factory.getbasetemp() / "prep-trials", shakespeare, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, SLOW_TRIALS + 1))
def test_kill_during_training_trials(clean, shakespeare, seed):
    _kill_during_training(clean, shakespeare, seed)
