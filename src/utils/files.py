"""Writes that a crash, a kill -9 or a full disk cannot leave half done: the new content goes to a
temporary sibling that replaces the target in one rename, so readers see the old target or the
whole new one, and a failed write is one error line with the old target untouched."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from src.utils.errors import PipelineError


def _failed(target: Path, e: OSError) -> PipelineError:
    return PipelineError(
        f"cannot write {target}: {e.strerror or e} (anything already there is unchanged)"
    )


@contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """Yields a temporary folder next to `out` that replaces `out` when the block succeeds; on
    failure it is removed and `out` stays as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.*"):  # left by a run killed while writing
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's folder is private; the result should not be
        yield tmp
        # the old folder is renamed away whole, never deleted in place: a kill at any moment
        # leaves the old folder, the new one, or none, never a partial one under `out`
        old = tmp.with_name(tmp.name + ".old")
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise _failed(out, e) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yields a temporary path next to `path` that replaces it, flushed to disk, when the block
    succeeds; on failure it is removed and `path` stays as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise _failed(path, e) from None
    finally:
        tmp.unlink(missing_ok=True)
