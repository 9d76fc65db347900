"""`dvc repro` on a fresh copy of the project: the text stages and the graph-data stages run (the
GNN benchmark stages take an hour and run in bench/), a second repro does nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT, SHARED

# the main job and the graph datasets the shared folder has (ESOL's 3D embedding takes ~20 s)
TARGETS = ["train_gpt", "prepare_graphs@planetoid", "prepare_graphs@tudataset"]


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


def test_dvc_repro_runs_then_is_a_noop(tmp_path):
    _copy_project(tmp_path)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["gpt"].update(max_steps=6, steps_per_epoch=3, limit_val_batches=2)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "WANDB_MODE": "offline"}
    dvc = [str(bin_dir / "dvc"), "repro", *TARGETS]
    params["graphs"]["raw"] = str(SHARED)  # the copy's ../shared is not the shared folder
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))

    first = subprocess.run(dvc, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "Running stage 'prepare_text'" in first.stdout
    assert "Running stage 'train_gpt'" in first.stdout
    for name in ("planetoid", "tudataset"):
        assert f"Running stage 'prepare_graphs@{name}'" in first.stdout
        split_or_processed = list((tmp_path / "data/processed/graphs" / name).rglob("*.pt"))
        assert split_or_processed, f"no processed {name} dataset"
    assert list((tmp_path / "data/processed/graphs/tudataset").rglob("splits/*.json"))
    metrics = json.loads((tmp_path / "outputs/dvc/train_gpt/metrics.json").read_text())
    assert {"train/loss", "val/loss", "test/loss"} <= metrics.keys()
    assert (tmp_path / "outputs/dvc/train_gpt/csv/metrics.csv").exists()
    assert (tmp_path / "dvc.lock").exists()

    second = subprocess.run(dvc, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Running stage" not in second.stdout
    assert "up to date" in second.stdout


def test_every_benchmark_is_a_dvc_stage():
    """`dvc repro` reproduces the README's tables: each bench script is a stage whose JSON
    result is its metrics file (checked without running them: `dvc stage list`); BERT's
    benchmark fine-tunes the checkpoint of the pre-training stage."""
    bin_dir = Path(sys.executable).parent
    out = subprocess.run([str(bin_dir / "dvc"), "stage", "list"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    benches = ("bench_gpt_shakespeare", "bench_gnn_cora", "bench_gin_mutag", "bench_esol",
               "oversmoothing", "bench_bert_speakers")  # fmt: skip
    for stage in (*benches, "prepare_graphs@esol", "prepare_text_cls", "bert_pretrain"):
        assert stage in out
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name in benches:
        script = stages[name]["cmd"].split()[1]
        assert (ROOT / script).is_file() and stages[name]["metrics"]
        assert script in stages[name]["deps"]
    pretrained = stages["bert_pretrain"]["outs"][0]
    assert pretrained in stages["bench_bert_speakers"]["deps"]
    assert pretrained in stages["bench_bert_speakers"]["cmd"]
