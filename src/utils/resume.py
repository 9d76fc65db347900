"""Stopping a run at any step and taking it up again exactly.

SIGTERM (what SLURM's preemption, Kubernetes and `timeout` send) and SIGINT (Ctrl-C) end training
after the current step: checkpoints/last.ckpt is saved at that step, the loggers are closed as
failed, no metrics.json is written, and the process exits 143 or 130, so that a scheduler, DVC or
a script sees an unfinished run. A second signal exits at once. Lightning's SLURM handling (its
requeue on SIGUSR1) is left as it is.

    python -m src.train ckpt_path=last hydra.run.dir=<run folder>

resumes that run from its last.ckpt (from scratch when it has none yet, so that a requeued job can
always pass it), in the same wandb run and the same CSV log. The random numbers of each training
batch depend only on the seed and the batch's number, so the resumed run ends where the
uninterrupted one would.
"""

from __future__ import annotations

import csv
import logging
import os
import signal
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)

LAST = "last.ckpt"


def resolve_ckpt_path(ckpt_path: str | None, run_dir: Path) -> str | None:
    """`last` -> this run folder's checkpoints/last.ckpt, or None (a fresh start) when it has
    none yet; any other value is a path, returned as it is."""
    if ckpt_path != "last":
        return ckpt_path
    last = run_dir / "checkpoints" / LAST
    if last.is_file():
        log.info("resuming from %s", last)
        return str(last)
    log.info("ckpt_path=last: no %s yet, starting from scratch", last)
    return None


def previous_wandb_id(run_dir: Path) -> str | None:
    """The id of the latest wandb run written in this run folder (<run>/wandb/*run-<time>-<id>)."""
    runs = sorted((run_dir / "wandb").glob("*run-*-*"), key=lambda p: p.name.split("-")[-2])
    return runs[-1].name.rsplit("-", 1)[-1] if runs else None


def continue_csv(logger, step: int) -> None:
    """Lightning's CSVLogger starts metrics.csv afresh; a resumed run keeps the rows of the steps
    its checkpoint holds (rows are numbered from 0: step s is the (s+1)-th batch); later ones,
    logged after the checkpoint by a killed run, are logged again."""
    path = Path(logger.log_dir) / "metrics.csv"
    if not path.is_file():
        return
    with open(path, newline="") as f:
        rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    kept = [{**row, "step": int(row["step"])} for row in rows if row.get("step", 0) < step]
    logger.experiment.metrics[:0] = kept  # the writer (created now) deletes the file ...
    logger.save()  # ... and writes them back


class Preemption(pl.Callback):
    """SIGTERM or SIGINT: stop after the current step with checkpoints/last.ckpt at that step
    (train.py then exits 128 + the signal's number); a second signal exits at once. Each
    training batch is seeded afresh, so that resuming continues exactly."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.metrics: dict[str, float] = {}  # those of the checkpoint resumed from
        self.signum: int | None = None
        self._trainer: pl.Trainer | None = None
        self._previous: dict[int, object] = {}

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGTERM)

    def setup(self, trainer: pl.Trainer, pl_module, stage: str) -> None:
        # before Lightning's own SIGTERM handler, which calls this one after setting its flag
        self._trainer = trainer
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def teardown(self, trainer: pl.Trainer, pl_module, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _on_signal(self, signum: int, frame) -> None:
        if self.signum is not None:
            os._exit(128 + signum)  # a second signal: no more waiting
        self.signum = signum
        log.warning("%s: stopping after this step (send it again to stop at once)",
                    signal.Signals(signum).name)  # fmt: skip
        if signum == signal.SIGINT:  # Lightning's loops stop after the step on its SIGTERM flag
            self._trainer._signal_connector.received_sigterm = True

    def on_exception(self, trainer: pl.Trainer, pl_module, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException) and trainer.state.fn == "fit":
            ckpt = trainer.checkpoint_callback
            folder = Path(ckpt.dirpath if ckpt else Path(trainer.default_root_dir) / "checkpoints")
            trainer.save_checkpoint(folder / LAST)
            log.warning("stopped at step %d; saved %s", trainer.global_step, folder / LAST)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module, batch, batch_idx: int) -> None:
        # a function of (seed, batch, rank), whatever drew random numbers before (data loaders,
        # text samples at validation): a resumed run draws the uninterrupted run's dropout masks
        loop = trainer.fit_loop.epoch_loop
        done = loop.batch_progress.total.ready
        torch.manual_seed((self.seed * 1_000_003 + done) * trainer.world_size + trainer.global_rank)
        # the step that loggers show equals the optimizer steps so far; resumed from an epoch's
        # end, Lightning's count comes back one ahead: realign it, so that the resumed run logs
        # the step numbers of the uninterrupted one
        loop._batches_that_stepped = trainer.global_step

    def state_dict(self) -> dict:
        # the metrics so far travel in the checkpoint: a run resumed from its final checkpoint
        # (killed while testing) has nothing left to train, and reports them
        return {"metrics": {k: float(v) for k, v in self._trainer.callback_metrics.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.metrics = state.get("metrics", {})
