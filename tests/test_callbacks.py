"""Model-selection callbacks that the papers' protocols need, and the trivial-baseline check."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from src.utils.callbacks import AccuracyAndLossCheckpoint, trivial_baseline
from tests.conftest import assert_ok, run_module


def test_accuracy_and_loss_checkpoint_follows_the_gat_protocol():
    """Keep an epoch only when its val accuracy and loss are both at least as good as the best
    so far; stop after `patience` epochs in which neither improved."""
    cb = AccuracyAndLossCheckpoint(monitor="val/acc", patience=2)
    trainer = SimpleNamespace(
        callback_metrics={}, should_stop=False,
        strategy=SimpleNamespace(reduce_boolean_decision=lambda decision: decision),
    )  # fmt: skip
    #            (acc, loss, kept, stops)
    epochs = [(0.5, 1.0, True, False),
              (0.6, 1.1, False, False),  # accuracy up, loss up: the counter resets, not kept
              (0.6, 0.9, True, False),   # ties count as good as the best
              (0.55, 0.95, False, False),
              (0.58, 0.92, False, True)]  # fmt: skip
    for acc, loss, kept, stops in epochs:
        trainer.callback_metrics["val/loss"] = loss
        assert cb.check_monitor_top_k(trainer, acc) == kept
        assert trainer.should_stop == stops
    restored = AccuracyAndLossCheckpoint(monitor="val/acc")
    restored.load_state_dict(cb.state_dict())
    assert (restored.best_acc, restored.best_loss, restored.wait) == (0.6, 0.9, 2)


def test_trivial_baseline_of_classes_and_values():
    """Classes: accuracy of the training split's most common class on val (-100 left out);
    values: RMSE of the training mean on val, over every target."""
    train, val = torch.tensor([0, 2, 2, 1, -100]), torch.tensor([2, 0, 2, -100, 2, 1])
    name, acc = trivial_baseline(train, val)
    assert name == "val/acc_majority" and abs(acc - 0.6) < 1e-6
    train = torch.tensor([[1.0, 10.0], [3.0, 20.0]])
    val = torch.tensor([[2.0, 15.0], [4.0, 13.0]])  # errors against the mean (2, 15): 0 0 2 -2
    name, rmse = trivial_baseline(train, val)
    assert name == "val/rmse_mean" and abs(rmse - 2**0.5) < 1e-6


def test_a_run_at_chance_warns_and_writes_the_baseline(tmp_path):
    """A model that cannot learn (lr 0) ends with a warning naming the likely causes, and its
    metrics.json holds the majority-class rate beside val/acc."""
    proc = run_module("src.train", "model=gcn", "data=karate", "model.optim.lr=0",
                      "trainer.max_steps=5", "logger=none", f"hydra.run.dir={tmp_path}",
                      "callbacks.progress_bar.refresh_rate=0")  # fmt: skip
    assert_ok(proc)
    log = (tmp_path / "train.log").read_text()
    assert "is no better than val/acc_majority" in log and "model.optim.lr" in log
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["val/acc"] <= metrics["val/acc_majority"] + 0.01
    assert 0 < metrics["test/acc_majority"] < 1  # the test split's, beside test/acc
