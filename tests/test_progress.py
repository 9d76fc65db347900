"""What a run prints when its output is a file, not a terminal (`> train.log`, nohup, SLURM, DVC):
a log line every callbacks.progress_bar.every_n_steps steps and after each validation, and a
model summary without Lightning's `Total FLOPs: 0` (src/utils/progress.py)."""

from __future__ import annotations

import re
import sys

import pytorch_lightning as pl
from pytorch_lightning.callbacks import RichProgressBar
from pytorch_lightning.utilities.model_summary import summarize
from torch import nn

from src.utils.progress import ModelSummary, PlainProgressBar, progress_bar
from tests.conftest import FAST, assert_ok, run_module

STEP = re.compile(
    r"step (\d+)/10 \(\d+%\) \| epoch \d \| train/loss [\d.]+ \| [\d,.]+ tokens/s \| "
    r"\d+:\d\d:\d\d elapsed \| \d+:\d\d:\d\d left$"
)


def test_a_run_into_a_pipe_logs_plain_progress_lines(tmp_path, shakespeare):
    """Captured output is a pipe: FAST's 10 steps (validation after 5 and 10) give lines at
    steps 4, 8 and the last, each with the loss, tokens/s and the time left, in stdout and the
    run's train.log, though FAST silences the live bar (refresh_rate=0); GPT's summary shows
    its FLOPs per token, not `Total FLOPs: 0`."""
    run = tmp_path / "run"
    proc = run_module("src.train", *FAST, f"data.path={shakespeare}", f"hydra.run.dir={run}",
                      f"paths.data_dir={tmp_path}/data", "logger=none",
                      "callbacks.progress_bar.every_n_steps=4")  # fmt: skip
    assert_ok(proc)
    for out in (proc.stdout, (run / "train.log").read_text()):
        lines = [ln.split(" - ", 1)[1] for ln in out.splitlines() if "[src.utils.progress]" in ln]
        steps = [int(m[1]) for ln in lines if (m := STEP.match(ln))]
        assert steps == [4, 8, 10], lines
        validations = [ln for ln in lines if ln.startswith("validation at step")]
        assert [ln.split(" | ")[0] for ln in validations] == [
            "validation at step 5", "validation at step 10"]  # fmt: skip
        assert all(re.search(r"\| val/loss [\d.]+", ln) for ln in validations), validations
    assert "Total FLOPs" not in proc.stdout
    assert re.search(r"Training FLOPs per token \(6N \+ 12LDT\): [\d.]+ [KMGT]?\n", proc.stdout)


def test_the_live_bar_on_a_terminal_plain_lines_elsewhere(monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    bar = progress_bar(refresh_rate=10)
    assert isinstance(bar, RichProgressBar) and bar.refresh_rate == 10
    assert not progress_bar(refresh_rate=0).is_enabled  # the tests' and benches' override
    assert isinstance(progress_bar(plain=True), PlainProgressBar)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert isinstance(progress_bar(refresh_rate=0), PlainProgressBar)
    assert isinstance(progress_bar(plain=False), RichProgressBar)
    assert not progress_bar(every_n_steps=0).is_enabled


def test_summary_of_a_model_without_a_flops_count_shows_none(capsys):
    """Lightning counts no FLOPs without an example input: no FLOPs column, no `Total FLOPs: 0`,
    and for a model other than GPT no per-token figure either."""

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 3)

    model = Tiny()
    summary, callback = summarize(model, max_depth=1), ModelSummary()
    callback.per_token = None
    callback.summarize(summary._get_summary_data(), summary.total_parameters,
                       summary.trainable_parameters, summary.model_size,
                       summary.total_training_modes, summary.total_flops)  # fmt: skip
    out = capsys.readouterr().out
    assert "Linear" in out and "Total params: 15" in out
    assert "FLOPs" not in out
