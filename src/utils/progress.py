"""What a run prints while it trains (conf/callbacks/default.yaml): the progress, as rich's live
bar on a terminal and as plain log lines in a file, and the model summary."""

from __future__ import annotations

import logging
import math
import sys
import time
from datetime import timedelta

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ProgressBar, RichModelSummary, RichProgressBar
from pytorch_lightning.utilities.model_summary import (
    get_formatted_model_size,
    get_human_readable_count,
)

log = logging.getLogger(__name__)


def progress_bar(refresh_rate: int = 10, every_n_steps: int = 50, plain: bool | None = None):
    """Rich's live bar (redrawn every `refresh_rate` steps, 0: hidden) when stdout is a terminal;
    otherwise (a file, a pipe: `> train.log`, nohup, SLURM, DVC), where the live bar draws
    nothing until a stage ends, a `PlainProgressBar` line every `every_n_steps` steps. `plain`
    true or false chooses the plain lines or the rich bar whatever stdout is."""
    if plain is None:
        plain = not sys.stdout.isatty()
    return PlainProgressBar(every_n_steps) if plain else RichProgressBar(refresh_rate)


def _number(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"


def _count(n: float) -> str:
    return get_human_readable_count(int(n)).strip()  # 370 K, 5.1 M


def _duration(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


class PlainProgressBar(ProgressBar):
    """A progress bar for logs that a person reads in a file: every `every_n_steps` optimizer
    steps and at the last, one log line (Python logging: the console and the run's train.log)
    such as

        step 1200/5000 (24%) | epoch 3 | train/loss 1.843 | 12,400 tokens/s | 0:01:32 elapsed |
        0:04:51 left

    with train/loss and the other training metrics the model shows in its progress bar, the
    rate that `Throughput` logs (tokens, images or nodes per second; steps per second without
    it), and the time left at this process's mean pace, validation included (no total, no time
    left when the run's length is unknown); and after a validation, a line with its val/
    metrics (one in every_n_steps steps at most, and the last). Rank 0 only; every_n_steps=0
    prints nothing."""

    def __init__(self, every_n_steps: int = 50):
        super().__init__()
        self.every_n_steps, self._enabled = every_n_steps, True

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self.every_n_steps > 0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        total = trainer.estimated_stepping_batches  # max_steps, or epochs x batches; inf: unknown
        self.total = int(total) if 0 < total < math.inf else None
        self.t0 = time.perf_counter()
        self.first = None  # (time, step) at the end of this process's first step: the pace's origin
        # the steps of the last step and validation lines (or where a resumed run starts)
        self.printed = self.validated = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.first is None:
            self.first = (time.perf_counter(), step)
        due = self.every_n_steps and (step % self.every_n_steps == 0 or step == self.total)
        if self.is_enabled and due and step != self.printed:  # accumulating: batches of one step
            self.printed = step
            log.info(" | ".join(self.step_line(trainer, pl_module)))

    def step_line(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[str]:
        step, now = trainer.global_step, time.perf_counter()
        total = self.total
        parts = [f"step {step}" if total is None else f"step {step}/{total} ({step / total:.0%})",
                 f"epoch {trainer.current_epoch}"]  # fmt: skip
        metrics = self.get_metrics(trainer, pl_module)
        if "train/loss" not in metrics and "train/loss" in trainer.callback_metrics:
            metrics = {"train/loss": trainer.callback_metrics["train/loss"], **metrics}
        parts += [f"{k} {_number(float(v))}" for k, v in metrics.items()
                  if k != "v_num" and not k.startswith("val/")]  # fmt: skip
        t1, step1 = self.first
        pace = (now - t1) / (step - step1) if step > step1 else None  # seconds per step
        rates = [k for k in trainer.callback_metrics if k.startswith("train/")
                 and k.endswith("_per_sec")]  # fmt: skip
        if rates:  # Throughput's
            unit = rates[0].removeprefix("train/").removesuffix("_per_sec")
            parts.append(f"{_number(float(trainer.callback_metrics[rates[0]]))} {unit}/s")
        elif pace:
            parts.append(f"{_number(1 / pace)} steps/s")
        parts.append(f"{_duration(now - self.t0)} elapsed")
        if pace and total is not None:
            parts.append(f"{_duration(pace * (total - step))} left")
        return parts

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.is_enabled or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        step, n = trainer.global_step, self.every_n_steps
        if step // n == self.validated // n and step != self.total:
            return  # one validation line per every_n_steps steps (a GNN validates every step)
        self.validated = step
        values = [f"{k} {_number(float(v))}" for k, v in trainer.callback_metrics.items()
                  if k.startswith("val/") and getattr(v, "numel", lambda: 1)() == 1]  # fmt: skip
        log.info(" | ".join([f"validation at step {step}", *values]))


def training_flops_per_token(pl_module: pl.LightningModule) -> float | None:
    """A GPT's training FLOPs per token as bench/throughput.py counts them for its MFU (6 N + 12 L
    D T, N the non-embedding parameters: Chowdhery et al. 2022, appendix B); None for other
    models."""
    from src.models.gpt import GPT, flops_per_token

    net = getattr(pl_module, "net", None)
    if not isinstance(net, GPT):
        return None
    params = sum(p.numel() for p in pl_module.parameters())  # as params/total: tied ones once
    return flops_per_token(vars(net.cfg), params, net.cfg.vocab_size)


class ModelSummary(RichModelSummary):
    """Lightning's rich model summary without its FLOPs column and `Total FLOPs: 0` line when it
    counted none (it counts them only by running a model's `example_input_array` at start-up,
    and no model here sets one), a line that reads as a fault; in its place, for a GPT, its
    training FLOPs per token (`training_flops_per_token`)."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.per_token = training_flops_per_token(pl_module)
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data, total_parameters, trainable_parameters, model_size,
                  total_training_modes, total_flops, **summarize_kwargs) -> None:  # fmt: skip
        if total_flops:
            return RichModelSummary.summarize(
                summary_data, total_parameters, trainable_parameters, model_size,
                total_training_modes, total_flops, **summarize_kwargs,
            )  # fmt: skip
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            numeric = name in ("Params", "Params per Device", "In sizes", "Out sizes")
            justify = "right" if numeric else "left"
            style = "dim" if name == " " else None
            table.add_column(name, justify=justify, style=style, no_wrap=name == "Name")
        for row in zip(*(values for _, values in columns), strict=True):
            table.add_row(*row)
        lines = [
            ("Trainable params", _count(trainable_parameters)),
            ("Non-trainable params", _count(total_parameters - trainable_parameters)),
            ("Total params", _count(total_parameters)),
            ("Total estimated model params size (MB)", get_formatted_model_size(model_size)),
            ("Modules in train mode", total_training_modes["train"]),
            ("Modules in eval mode", total_training_modes["eval"]),
        ]  # fmt: skip
        if self.per_token:
            lines.append(("Training FLOPs per token (6N + 12LDT)", _count(self.per_token)))
        console = get_console()
        console.print(table)
        for name, value in lines:
            console.print(f"[bold]{name}[/]: {value}")
