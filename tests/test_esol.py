"""The ESOL presets (conf/experiment/esol_gin.yaml, esol_egnn.yaml; bench/esol.py): they compose
with the settings the bench reports, and a few steps of each train, validate, checkpoint and test
end to end through `python -m src.train`. ESOL is copied from the data mirror ($DATA_MIRROR;
skipped where it lacks it) into a tmp root's raw/ and processed there once for the session (~20 s,
3D coordinates included, the esol_root fixture); the runs read that root and its raw folder,
without the mirror and without downloads."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import ROOT, assert_ok, run_module

MODELS = ("gin", "egnn")
# a few molecules of work: one thread avoids thread-pool stalls when the CPUs are busy
ENV = {"OMP_NUM_THREADS": "1"}


def compose(model: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=[f"experiment=esol_{model}"])


@pytest.mark.parametrize("model", MODELS)
def test_presets_compose(model):
    cfg = compose(model)
    assert cfg.experiment_name == f"esol_{model}"
    assert cfg.model.net.layer == model and cfg.data.name == "ESOL"
    assert (cfg.data.split, cfg.data.split_seed, cfg.data.batch_size) == ("random", 0, 64)
    assert cfg.optimized_metric == "val/rmse"
    assert cfg.callbacks.model_checkpoint.monitor == "val/rmse"
    assert cfg.callbacks.model_checkpoint.mode == "min"
    assert cfg.trainer.max_steps == -1 and cfg.trainer.max_epochs > 0  # epochs, not steps
    assert cfg.test  # the best-val checkpoint is tested
    net = cfg.model.net  # the benchmarked dropout everywhere, none of it left to by_task
    assert (net.dropout, net.input_dropout, net.head_dropout) == (0.1, 0.1, 0.1)
    if model == "gin":
        assert cfg.model.net.edge_features  # GINE: bond features in the messages


@pytest.mark.parametrize("model", MODELS)
def test_preset_trains_and_tests(tmp_path, esol_root, model):
    """2 epochs of 2 batches: validation each epoch, the best checkpoint by val RMSE tested."""
    run_dir = tmp_path / "run"
    proc = run_module(
        "src.train", f"experiment=esol_{model}", f"data.root={esol_root}",
        f"data.raw_dir={esol_root / 'raw'}", "data.download=false",
        "trainer.limit_train_batches=2", "trainer.max_steps=4", "logger=none",
        "callbacks.progress_bar.refresh_rate=0", f"hydra.run.dir={run_dir}",
        env={**ENV, "DATA_MIRROR": None},  # the csv must come from esol_root/raw
    )  # fmt: skip
    assert_ok(proc)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for key in ("val/rmse", "test/rmse", "test/mae"):
        assert math.isfinite(metrics[key]) and metrics[key] > 0, key
    (best,) = (run_dir / "checkpoints").glob("best-epoch*.ckpt")
    log = (run_dir / "train.log").read_text()
    assert f"Restoring states from the checkpoint path at {best}" in log  # tested: the best
