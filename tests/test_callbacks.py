"""Model-selection callbacks that the papers' protocols need."""

from __future__ import annotations

from types import SimpleNamespace

from src.utils.callbacks import AccuracyAndLossCheckpoint


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
