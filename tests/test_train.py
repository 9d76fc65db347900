"""The entry points as a user runs them: `python -m src.train`, `python -m src.sample`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import FAST, ROOT, assert_ok, assert_one_error_line, run_module


def _train(run_dir: Path, data: Path, *overrides: str, env: dict | None = None):
    """Tokenised data goes into the run's own folder, never into the repository's data/."""
    return run_module(
        "src.train", *FAST, f"data.path={data}", f"hydra.run.dir={run_dir}",
        f"paths.data_dir={run_dir}/data", *overrides, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shakespeare) -> Path:
    """One short training run shared by the tests that only read its outputs."""
    run_dir = tmp_path_factory.mktemp("run")
    assert_ok(_train(run_dir, shakespeare, "logger=csv", "test=true", "data.splits=[0.8,0.1,0.1]"))
    return run_dir


def test_run_directory_holds_config_metrics_checkpoints_samples(trained):
    metrics = json.loads((trained / "metrics.json").read_text())
    assert {"train/loss", "train/ppl", "val/loss", "val/ppl", "test/loss", "test/ppl"} <= set(
        metrics
    )
    assert {"train/tokens_per_sec", "train/startup_sec"} <= set(metrics)
    assert math.isclose(metrics["val/ppl"], math.exp(metrics["val/loss"]), rel_tol=1e-4)
    assert metrics["val/loss"] < math.log(71)  # learnt something beyond uniform over the vocab
    assert (trained / "config.yaml").exists() and (trained / "config_tree.log").exists()
    assert "n_layer: 2" in (trained / "config.yaml").read_text()  # resolved, with overrides
    assert (trained / "checkpoints" / "last.ckpt").exists()
    assert len(list((trained / "checkpoints").glob("best-*.ckpt"))) == 1
    assert (trained / "csv" / "metrics.csv").exists()
    assert "ROMEO:" in (trained / "samples.txt").read_text()
    assert (trained / "attention.png").stat().st_size > 10_000  # layers x heads heat maps


def test_checkpoint_loads_with_weights_only(trained):
    ckpt = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["model_class"] == "src.models.gpt.GPTLitModule"
    assert ckpt["hyper_parameters"]["net"]["n_layer"] == 2
    assert "tokenizer" in ckpt["TextDataModule"]


def test_bench_bare_loop_trains_the_runs_recipe(trained):
    """bench/gpt_shakespeare.py's reference: the run's model and recipe in a bare loop, scored
    on the whole val split; seeded, and it learns."""
    from bench.gpt_shakespeare import bare_training

    first, again, later = (bare_training(trained, 0, n) for n in (1, 1, 40))
    assert first == again
    assert later < first < math.log(71) + 0.5


def test_bench_spread_of_the_20_batch_estimate(trained):
    from bench.gpt_shakespeare import estimate_spread

    spread = estimate_spread(trained, draws=5, batches=2)
    assert 0 < spread < 1 and spread == estimate_spread(trained, draws=5, batches=2)


@pytest.mark.parametrize(
    "settings",
    [
        ["strategy=greedy"],
        ["strategy=sample", "temperature=0.7", "top_k=5"],
        ["strategy=sample", "top_p=0.9"],
        ["strategy=beam", "beam_width=3", "length_penalty=0.6"],
    ],
)
def test_sample_cli(trained, settings):
    ckpt = trained / "checkpoints" / "last.ckpt"
    args = [f"ckpt={ckpt}", "prompt=ROMEO:", "max_new_tokens=15", *settings]
    first = run_module("src.sample", *args)
    assert_ok(first)
    assert first.stdout.startswith("ROMEO:") or "--- sample 1\nROMEO:" in first.stdout
    if "strategy=sample" in settings:  # greedy and beam draw nothing; sampling is seeded
        assert first.stdout == run_module("src.sample", *args).stdout


# the whole val split, small enough to score in one process too
WHOLE_VAL = ["trainer.limit_val_batches=null", "data.splits=[0.98,0.02,0.0]"]
DDP = ["trainer=ddp_cpu", *WHOLE_VAL]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, shakespeare) -> Path:
    """trainer=ddp_cpu: Lightning launches 2 gloo processes (the DDP and torchrun tests read it)."""
    run_dir = tmp_path_factory.mktemp("ddp") / "run"
    assert_ok(_train(run_dir, shakespeare, *DDP, "logger=wandb"))
    return run_dir


def test_ddp_two_cpu_processes(ddp_run):
    """trainer=ddp_cpu: 2 gloo processes, one run directory, one wandb run, exact val loss."""
    assert len(list((ddp_run / "wandb").glob("offline-run-*"))) == 1
    assert not list((ddp_run / "..").glob("train_ddp_process_*"))
    metrics = json.loads((ddp_run / "metrics.json").read_text())

    # the last checkpoint's loss on the whole val split, in one process, equals the DDP figure
    from src.data.text import TextDataModule
    from src.models.gpt import GPTLitModule

    ckpt = torch.load(ddp_run / "checkpoints" / "last.ckpt", weights_only=True)
    model = GPTLitModule(**ckpt["hyper_parameters"])
    model.load_state_dict(ckpt["state_dict"])
    dm = TextDataModule(**ckpt["datamodule_hyper_parameters"])
    dm.setup("validate")
    with torch.no_grad():
        for batch in dm.val_dataloader():
            model.validation_step(batch, 0)
    assert model.val_loss.compute().item() == pytest.approx(metrics["val/loss"], rel=1e-5)


def test_torchrun_two_processes_share_one_run_folder_and_match_the_lightning_launch(
    tmp_path, shakespeare, ddp_run
):
    """torchrun --nproc_per_node=2 through the normal entry point (gloo): one run folder named by
    the launch, one wandb run, metrics.json and checkpoints from rank 0, and the same metrics as
    Lightning's own launch of 2 processes (trainer=ddp_cpu) and, within tolerance, as one process
    with the same global batch."""
    proc = run_module(
        "torch.distributed.run", "--nproc_per_node=2", "-m", "src.train", *FAST, *DDP,
        f"data.path={shakespeare}", f"paths.data_dir={tmp_path}/data", "logger=many",
        f"paths.log_dir={tmp_path / 'torchrun'}",
    )  # fmt: skip
    assert_ok(proc)
    runs = list((tmp_path / "torchrun" / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("torchrun-"), runs
    run = runs[0]
    assert (run / "train.log").exists() and (run / "train.rank1.log").exists()
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1
    assert (run / "checkpoints" / "last.ckpt").exists() and (run / ".hydra").is_dir()
    torchrun = json.loads((run / "metrics.json").read_text())

    lightning = json.loads((ddp_run / "metrics.json").read_text())
    assert_ok(_train(tmp_path / "one", shakespeare, *WHOLE_VAL, "logger=none",
                     "data.batch_size=24"))  # fmt: skip
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    for key in ("train/loss", "val/loss"):
        assert torchrun[key] == pytest.approx(lightning[key], rel=1e-5), key
        assert torchrun[key] == pytest.approx(one[key], rel=0.05), key


def test_two_runs_in_the_same_second_get_distinct_directories():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from src.utils.config import register_resolvers

    register_resolvers()
    dirs = set()
    for _ in range(2):
        with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("train", return_hydra_config=True)
            dirs.add(OmegaConf.to_container(cfg.hydra.run, resolve=True)["dir"])
    assert len(dirs) == 2


def test_text_run_does_not_import_other_modalities(tmp_path, shakespeare):
    """Lazy imports: a text run loads no graph, audio or chemistry library, and no `datasets`
    once the corpus is tokenised. (matplotlib is used: it draws the attention maps.)"""
    probe = (
        "import atexit, runpy, sys\n"
        "heavy = ('torch_geometric', 'librosa', 'soundfile', 'rdkit', 'datasets')\n"
        "import pytorch_lightning\n"
        "baseline = set(sys.modules)\n"
        "atexit.register(lambda: print('LOADED', sorted(\n"
        "    m for m in set(sys.modules) - baseline if m.split('.')[0] in heavy)))\n"
        "sys.argv = ['src.train', *sys.argv[1:]]\n"
        "runpy.run_module('src.train', run_name='__main__')\n"
    )
    args = [*FAST, f"data.path={shakespeare}", f"paths.data_dir={tmp_path}/data", "debug=fdr"]
    assert_ok(run_module("src.prepare", *args))  # tokenise first: preparing uses `datasets`
    proc = subprocess.run(
        [sys.executable, "-c", probe, *args, f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "offline"},
    )  # fmt: skip
    assert_ok(proc)
    assert "LOADED []" in proc.stdout


# ---------------------------------------------------------------- bad input: one clear line


def test_missing_corpus(tmp_path, shakespeare):
    proc = _train(tmp_path / "run", shakespeare, f"data.path={tmp_path}/nope.txt")
    assert_one_error_line(proc, "error: corpus not found")


def test_empty_corpus(tmp_path, shakespeare):
    (tmp_path / "empty.txt").write_text("")
    proc = _train(tmp_path / "run", shakespeare, f"data.path={tmp_path}/empty.txt",
                  f"data.processed_dir={tmp_path}/p")  # fmt: skip
    assert_one_error_line(proc, "error: corpus is empty")
    assert not (tmp_path / "p").exists()  # nothing that looks like a prepared corpus


def test_corpus_shorter_than_one_block(tmp_path, shakespeare):
    (tmp_path / "short.txt").write_text("To be, or not to be: that is the question.\n" * 3)
    proc = _train(tmp_path / "run", shakespeare, f"data.path={tmp_path}/short.txt",
                  f"data.processed_dir={tmp_path}/p")  # fmt: skip
    assert_one_error_line(proc, "fewer than one block")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model=nope", "Could not find 'model/nope'"),
        ("data=nope", "Could not find 'data/nope'"),
        ("trainer.max_stepz=3", "Key 'max_stepz' is not in struct"),
        ("model.net.n_layerz=3", "Key 'n_layerz' is not in struct"),
    ],
)
def test_config_errors(tmp_path, shakespeare, override, message):
    assert_one_error_line(_train(tmp_path / "run", shakespeare, override), message)


def test_checkpoint_of_another_model(tmp_path, shakespeare):
    fake = tmp_path / "bert.ckpt"
    torch.save({"state_dict": {}, "model_class": "src.models.bert.BERTLitModule"}, fake)
    proc = _train(tmp_path / "run", shakespeare, f"ckpt_path={fake}")
    assert_one_error_line(
        proc, "holds a src.models.bert.BERTLitModule, not a src.models.gpt.GPTLitModule"
    )
    proc = run_module("src.sample", f"ckpt={fake}")
    assert_one_error_line(proc, "holds a src.models.bert.BERTLitModule, not a language model")


def test_corrupt_checkpoint(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint at all")
    assert_one_error_line(run_module("src.sample", f"ckpt={bad}"), "error: cannot read checkpoint")


def test_nan_loss_stops_with_one_line_and_keeps_earlier_files(tmp_path, shakespeare):
    """An absurd learning rate blows the weights up after one step; the run stops cleanly."""
    run_dir = tmp_path / "run"
    proc = _train(run_dir, shakespeare, "model.optim.lr=1e30", "model.optim.warmup_steps=1",
                  "data.steps_per_epoch=1", "logger=csv")  # fmt: skip
    assert_one_error_line(proc, "error: training loss became nan")
    assert (run_dir / "config.yaml").exists()
    assert (run_dir / "checkpoints" / "last.ckpt").exists()  # the epoch-1 checkpoint survives


def test_bf16_mixed_precision_switch(tmp_path, shakespeare):
    """trainer.precision=bf16-mixed runs the same pipeline under autocast (CPU here)."""
    proc = _train(tmp_path, shakespeare, "trainer.precision=bf16-mixed", "logger=none")
    assert_ok(proc)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert math.isfinite(metrics["val/loss"])


@pytest.mark.slow
def test_torch_compile_switch(tmp_path, shakespeare):
    """model.compile=true compiles the Transformer stack (minutes on 2 CPU cores)."""
    proc = _train(tmp_path, shakespeare, "model.compile=true", "logger=none")
    assert_ok(proc)
    assert math.isfinite(json.loads((tmp_path / "metrics.json").read_text())["val/loss"])
