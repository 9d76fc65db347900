"""Shared fixtures: paths to the repository and the data mirror, and a runner for the entry
points in a subprocess (as a user runs them)."""

from __future__ import annotations

import atexit
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "tests" / "data"
# Sample files kept gzipped in the repository (large text compresses 2.6 x); the mirror holds
# them under their upstream names.
GZIPPED = ("tinyshakespeare/input.txt",)


def sample_mirror() -> Path:
    """tests/data/ as a mirror in a temporary folder, removed when this process exits: the
    GZIPPED files unpacked, every other file a link to the repository's copy."""
    mirror = Path(tempfile.mkdtemp(prefix="data-mirror-")).resolve()
    atexit.register(shutil.rmtree, mirror, ignore_errors=True)
    for f in SAMPLES.rglob("*"):
        rel = f.relative_to(SAMPLES).as_posix()
        if f.is_dir() or rel == "README.md":
            continue
        target = mirror / rel.removesuffix(".gz") if rel.removesuffix(".gz") in GZIPPED else None
        if target is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(f) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
            (mirror / rel).symlink_to(f)
    return mirror


# The data mirror (paths.data_mirror, a folder with data/raw's layout) that the tests' runs copy
# real datasets from, as a user's runs copy a lab's shared copy: $DATA_MIRROR, else the small
# real samples this repository carries (tests/data/README.md), so that a fresh clone with no
# network runs every test. Tests whose dataset a given mirror lacks are skipped.
# The samples' mirror is made once, by the first process (pytest-xdist's workers inherit it).
if not os.environ.get("DATA_MIRROR"):
    os.environ["SAMPLE_MIRROR"] = os.environ["DATA_MIRROR"] = str(sample_mirror())
MIRROR = Path(os.environ["DATA_MIRROR"]).resolve()  # seen by every run, here or in a subprocess
ON_SAMPLES = os.environ.get("SAMPLE_MIRROR") == str(MIRROR)
SHAKESPEARE = MIRROR / "tinyshakespeare" / "input.txt"
ESOL_CSV = MIRROR / "esol" / "delaney-processed.csv"

# pytest-xdist runs one worker per core; a run a test starts takes one torch thread, so that two
# workers' runs do not oversubscribe the cores with spinning thread pools (tiny models: one thread
# loses nothing). A test that wants more threads sets OMP_NUM_THREADS in its run's env.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def project_root_in_tmp(tmp_path_factory) -> None:
    """paths.root_dir ($PROJECT_ROOT) in a temporary folder: a run that names no hydra.run.dir or
    paths.data_dir writes there (outputs/, data/), never into the clone."""
    os.environ["PROJECT_ROOT"] = str(tmp_path_factory.mktemp("project"))


@pytest.fixture
def seeded() -> None:
    import torch

    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread avoids thread-pool stalls when the CPUs are busy."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def shakespeare() -> Path:
    if not SHAKESPEARE.exists():
        pytest.skip(f"dataset missing in the mirror: {SHAKESPEARE}")
    return SHAKESPEARE


def made_once(tmp_path_factory, name: str, make) -> Path:
    """A folder that `make(folder)` fills once per test session, shared by pytest-xdist's workers:
    the first worker to ask makes it under a file lock, the others wait and read it."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this session's folder, above each worker's own
    folder = base / name
    with FileLock(f"{folder}.lock"):
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            make(folder)
            (folder / ".made").touch()
    return folder


@pytest.fixture(scope="session")
def esol_root(tmp_path_factory) -> Path:
    """A data root with ESOL processed (RDKit 3D coordinates: ~20 s), once for the session and
    read by every worker (nothing writes into it after)."""
    from src.data.molecules import MoleculeNetDataModule

    if not ESOL_CSV.exists():
        pytest.skip(f"dataset missing in the mirror: {ESOL_CSV}")

    def make(root: Path) -> None:
        MoleculeNetDataModule(
            root=str(root), raw_dir=str(root / "raw"), mirror=str(MIRROR)
        ).prepare_data()

    return made_once(tmp_path_factory, "moleculenet", make)


def run_module(
    module: str, *overrides: str, env: dict | None = None, cwd: Path = ROOT, timeout: int = 600
) -> subprocess.CompletedProcess:
    """`python -m module overrides...` with wandb kept offline and inside the test's folders."""
    full_env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0", **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None}
    return subprocess.run(
        [sys.executable, "-m", module, *overrides],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def assert_one_error_line(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """Bad input: exit code 1, no traceback, and stderr says what is wrong in one line."""
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr[-2000:]


# A few seconds of training on tiny Shakespeare: 2 epochs of 5 steps, validation on 4 batches.
FAST = [
    "experiment=gpt_shakespeare_char",
    "trainer.max_steps=10",
    "data.steps_per_epoch=5",
    "trainer.limit_val_batches=4",
    "trainer.log_every_n_steps=1",
    "model.net.n_layer=2",
    "model.net.d_model=32",
    "model.generation.max_new_tokens=20",
    "callbacks.progress_bar.refresh_rate=0",
]
