"""Bad input gets one `error: ...` line on stderr and exit code 1, not a traceback."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys


class PipelineError(Exception):
    """A problem with the user's input or configuration, not a bug: missing or empty files, a
    corpus shorter than one block, a checkpoint of another model, a loss that became NaN."""


def lost_peer(e: BaseException) -> bool:
    """Whether a failure in a multi-process run comes from another process that died or stopped
    answering (a collective's connection reset, or its timeout)."""
    import torch.distributed as dist

    return isinstance(e, dist.DistError) or (
        isinstance(e, RuntimeError) and any(s in str(e) for s in ("gloo", "NCCL", "Connection"))
    )


def exit_1_when_a_child_dies() -> None:
    """Lightning watches the processes it starts (torchrun's are not its own) and, when one
    dies, SIGKILLs them and itself: exit -9 and no message, whenever it notices before this
    process's collective fails (a race). End the run as a lost peer instead: the others killed,
    one error line, exit 1 (the last checkpoint, written atomically, is kept)."""
    from lightning_fabric.strategies.launchers import subprocess_script

    def terminate_all(observer) -> None:
        for p in observer._child_processes:
            p.send_signal(signal.SIGKILL)
        codes = [p.returncode for p in observer._child_processes if p.returncode]
        print(f"error: process 0 of {len(observer._child_processes) + 1}: another process of this "
              f"run died or stopped answering (exit code {codes[0] if codes else None}); see its "
              "log; resume with ckpt_path=last", file=sys.stderr, flush=True)  # fmt: skip
        os._exit(1)  # from the observer's thread: the main one may be inside a collective

    subprocess_script._ChildProcessObserver._terminate_all = terminate_all


@contextlib.contextmanager
def report_errors():
    """Turn PipelineError (and config errors met while instantiating) into one line + exit 1."""
    from hydra.errors import InstantiationException

    try:
        yield
    except PipelineError as e:
        message = str(e)
    except InstantiationException as e:  # e.g. a misspelt argument, or settings that clash
        if isinstance(e.__cause__, PipelineError):  # raised by the constructor itself
            message = str(e.__cause__)
        else:
            lines = [ln.strip() for ln in str(e).strip().splitlines()]
            message = " ".join(ln for ln in lines if ln and not ln.startswith("full_key:"))
    else:
        return
    logging.getLogger(__name__).debug("exiting on error", exc_info=True)
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)
