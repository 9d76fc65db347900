"""`dvc repro` on a fresh copy of the project with only DATA_MIRROR set: the raw datasets are
fetched into data/raw/, the text and graph-data stages run (the benchmark stages take hours and run
in bench/), a second repro does nothing, a changed param or raw file re-runs only what depends on
it, and offline without a mirror the fetch stage stops with one clear line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import MIRROR, ROOT

# the main job and the graph datasets the mirror has (ESOL's 3D embedding takes ~20 s)
TARGETS = ["train_gpt", "prepare_graphs@planetoid", "prepare_graphs@tudataset"]
BIN = Path(sys.executable).parent


def _copy_project(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files, as a fresh clone would have them."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "clone"], cwd=dest, check=True)


def _set_params(project: Path, **gpt) -> None:
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["gpt"].update(gpt)
    (project / "params.yaml").write_text(yaml.safe_dump(params))


def _repro(project: Path, *targets: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "WANDB_MODE": "offline",
        "PROJECT_ROOT": None,  # the stages write into the copy, where dvc looks for their outs
        **(env or {}),
    }
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.run([str(BIN / "dvc"), "repro", *targets], cwd=project, env=env,
                          capture_output=True, text=True)  # fmt: skip


def _ran(proc: subprocess.CompletedProcess) -> set[str]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {line.split("'")[1] for line in proc.stdout.splitlines() if "Running stage '" in line}


def test_dvc_repro_with_only_the_mirror_set(tmp_path):
    if not (MIRROR / "planetoid" / "Cora" / "raw").is_dir():
        pytest.skip(f"the mirror {MIRROR} lacks Cora")
    _copy_project(tmp_path)
    _set_params(tmp_path, max_steps=6, steps_per_epoch=3, limit_val_batches=2)

    first = _ran(_repro(tmp_path, *TARGETS))  # DATA_MIRROR is set (tests/conftest.py)
    assert {"fetch@cora", "fetch@mutag", "prepare_text", "train_gpt",
            "prepare_graphs@planetoid", "prepare_graphs@tudataset"} <= first  # fmt: skip
    assert (tmp_path / "data/raw/planetoid/Cora/raw/ind.cora.graph").is_file()
    for out in ("planetoid/Cora", "tudataset/MUTAG"):
        assert list((tmp_path / "data/processed" / out).rglob("*.pt")), f"no processed {out}"
    assert list((tmp_path / "data/processed/tudataset/MUTAG").rglob("splits/*.json"))
    metrics = json.loads((tmp_path / "outputs/dvc/train_gpt/metrics.json").read_text())
    assert {"train/loss", "val/loss", "test/loss"} <= metrics.keys()
    assert (tmp_path / "outputs/dvc/train_gpt/csv/metrics.csv").exists()
    assert (tmp_path / "dvc.lock").exists()

    # a later stage's first import compiles bytecode into src/data/__pycache__: not a change
    pyc = tmp_path / "src/data/__pycache__/not_yet_imported.cpython-311.pyc"
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(b"bytecode")
    second = _repro(tmp_path, *TARGETS)
    assert _ran(second) == set() and "up to date" in second.stdout

    # a changed param re-runs its stage alone, a raw file changed by hand its dataset's chain
    # alone: both in one repro (each costs DVC's start-up and checks of every stage)
    _set_params(tmp_path, max_steps=7, steps_per_epoch=3, limit_val_batches=2)
    readme = tmp_path / "data/raw/TUDataset/MUTAG/raw/README.txt"
    readme.write_text(readme.read_text() + "\nannotated by hand\n")
    assert _ran(_repro(tmp_path, *TARGETS)) == {
        "train_gpt", "fetch@mutag", "prepare_graphs@tudataset"
    }  # fmt: skip
    assert readme.read_text().endswith("annotated by hand\n")  # kept, not fetched again


def test_dvc_fetch_offline_without_a_mirror_is_one_clear_line(tmp_path):
    _copy_project(tmp_path)
    offline = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
               "no_proxy": "", "DATA_MIRROR": None}  # fmt: skip
    proc = _repro(tmp_path, "fetch@esol", env=offline)
    assert proc.returncode != 0
    assert "error: dataset esol: delaney-processed.csv not found in data/raw/esol" in proc.stderr
    assert not (tmp_path / "data/raw/esol").exists()


def test_every_benchmark_is_a_dvc_stage(tmp_path):
    """`dvc repro bench/dvc.yaml` reproduces the README's tables: each bench script is a stage
    whose JSON result is its metrics file (checked without running them: `dvc stage list`, in a
    copy, since dvc writes .dvc/tmp/); BERT's benchmark fine-tunes the checkpoint of the
    pre-training stage. `dvc repro` alone runs the pipeline (dvc.yaml) and none of them."""
    _copy_project(tmp_path)
    dvc = [str(BIN / "dvc"), "stage", "list"]
    pipeline = subprocess.run(dvc, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    out = subprocess.run([*dvc, "bench/dvc.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    stages = yaml.safe_load((ROOT / "bench/dvc.yaml").read_text())["stages"]
    # not stages: the GPU throughput checks (need a GPU) and the fault-injection suite (a test run)
    not_stages = {"throughput", "step_rates", "faults"}
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")} - not_stages

    def script(name):  # python bench/x.py ... | python -m bench.x ...
        cmd = stages[name]["cmd"].split()
        return cmd[2].replace(".", "/") + ".py" if cmd[1] == "-m" else cmd[1]

    benches = [name for name in stages if script(name).startswith("bench/")]
    assert {Path(script(name)).stem for name in benches} == scripts
    for stage in benches:
        assert f"bench/dvc.yaml:{stage}" in out and f"{stage} " not in pipeline
    assert "bench/dvc.yaml:bert_pretrain" in out
    for stage in (
        "train_gpt",
        "prepare_graphs@esol",
        "prepare_text_cls",
        "fetch@esol",
        "fetch@eng-nld",
        "prepare_translation",
        "fetch@mnist",
        "prepare_images",
        "prepare_patches",
        "fetch@fsdd",
        "prepare_audio",
    ):
        assert stage in pipeline
    for name in benches:
        assert (ROOT / script(name)).is_file() and stages[name]["metrics"]
        assert script(name) in stages[name]["deps"] and stages[name]["wdir"] == ".."
    pretrained = stages["bert_pretrain"]["outs"][0]
    assert pretrained in stages["bench_bert_speakers"]["deps"]
    assert pretrained in stages["bench_bert_speakers"]["cmd"]
