"""The preparation stages' worker pool and progress line, shared by text, images and audio.

    for result in in_order(work, jobs, num_proc, start, (args,), preload="src.data.chunks"):
        write(result)   # in the jobs' order; at most `ahead` x num_proc results in memory

Memory is set by the jobs' size and num_proc, never by how many jobs there are: the jobs are
drawn lazily, and a job is handed out only when a result has been taken.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta

log = logging.getLogger(__name__)


def in_order(
    work: Callable,
    jobs: Iterable,
    num_proc: int,
    start: Callable | None = None,
    start_args: tuple = (),
    preload: str | None = None,
    ahead: int = 2,
) -> Iterator:
    """work(job) of each job, in order, by num_proc processes (1: in this one), each set up
    once by start(*start_args). The workers are forked from a fresh server process
    (forkserver) that imported only `preload`, the module of `work`: forking this process, whose
    libraries may hold locks in other threads (pyarrow's allocator, torch's pools), can leave a
    child waiting for ever."""
    if num_proc <= 1:
        if start is not None:
            start(*start_args)
        yield from map(work, jobs)
        return
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods and preload:
        ctx.set_forkserver_preload([preload])
    with ctx.Pool(num_proc, _one_thread, (start, start_args)) as pool:
        pending: deque = deque()
        for job in jobs:
            pending.append(pool.apply_async(work, (job,)))
            if len(pending) >= ahead * num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _one_thread(start: Callable | None, start_args: tuple) -> None:
    """A worker's set-up: one BLAS/OpenMP thread (num_proc processes already use the cores;
    more threads each would fight for them: librosa's mel filter bank is a matrix product), then
    start(*start_args)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    if start is not None:
        start(*start_args)


class Progress:
    """Work done out of `total` (None: unknown), in `unit`s of `scale`: rich's bar with the
    rate and the time left on a terminal; otherwise (a log file, SLURM, nohup, DVC) a log line
    every `every` seconds."""

    def __init__(self, total: float | None, verb: str = "tokenising", unit: str = "MB",
                 scale: float = 1e6, every: float = 30.0):  # fmt: skip
        self.total, self.verb, self.unit, self.scale = total, verb, unit, scale
        self.every, self.done, self.t0 = every, 0, time.perf_counter()
        self.last = self.t0
        self.bar = None
        if sys.stdout.isatty():
            from rich import progress as rp

            columns = (rp.DownloadColumn(), rp.TransferSpeedColumn()) if unit == "MB" else (
                rp.MofNCompleteColumn(),)  # fmt: skip
            self.bar = rp.Progress(verb, rp.BarColumn(), *columns, rp.TimeRemainingColumn(),
                                   transient=True)  # fmt: skip
            self.task = self.bar.add_task(verb, total=total)
            self.bar.start()

    def update(self, amount: float) -> None:
        self.done += amount
        now = time.perf_counter()
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)
        elif now - self.last >= self.every:
            self.last = now
            log.info("%s", self.line(now))

    def line(self, now: float) -> str:
        rate = self.done / max(now - self.t0, 1e-9) / self.scale
        digits = 0 if self.scale == 1 else 1  # whole files, tenths of MB
        text = f"{self.verb} {self.done / self.scale:,.{digits}f}"
        speed = f"{rate:,.{digits + 1}f} {self.unit}/s"
        if self.total:
            left = timedelta(seconds=round((self.total - self.done) / self.scale / max(rate, 1e-9)))
            share = 100 * self.done / self.total
            text += f" of {self.total / self.scale:,.{digits}f} {self.unit} ({share:.0f} %)"
            return f"{text}, {speed}, {left} left"
        return f"{text} {self.unit}, {speed}"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
