"""Checkpoints are read with `weights_only=True` (no pickled code runs) and checked for the model
they hold."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from lightning_fabric.plugins import TorchCheckpointIO

from src.utils.errors import PipelineError
from src.utils.files import atomic_file

log = logging.getLogger(__name__)


def class_path(obj) -> str:
    """`module.QualName` of a class, or of an object's class."""
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def load_checkpoint(path: str | Path, expected_class: str | None = None) -> dict:
    """Load a Lightning checkpoint; `expected_class` is the model's `module.QualName`."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated file, not a checkpoint, or holds arbitrary objects
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        if any("Unsupported global" in ln for ln in lines):  # pickled code: named, not run
            reason = next(ln for ln in lines if "Unsupported global" in ln)
        elif not lines or any("WeightsUnpickler error" in ln for ln in lines):  # empty, random
            reason = "damaged, or not a file torch.save wrote"
        else:
            reason = lines[0]
        raise PipelineError(f"cannot read checkpoint {path}: {reason}") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise PipelineError(f"{path} is not a checkpoint of this pipeline")
    found = ckpt.get("model_class")
    if expected_class and found != expected_class:
        raise PipelineError(
            f"checkpoint {path} holds a {found or 'foreign model'}, not a {expected_class}"
        )
    return ckpt


def _flat(d, prefix: str = "") -> dict:
    """{"net": {"d_model": 128}} -> {"net.d_model": 128}"""
    out = {}
    for k, v in dict(d).items():
        if isinstance(v, dict) or hasattr(v, "items"):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_same_model(ckpt: dict, model, path: str | Path) -> None:
    """A checkpoint whose tensors do not fit `model` is one error line naming the model settings
    that differ (config against checkpoint); settings that differ without changing a shape
    (a learning rate, dropout) are a warning, since resuming with them is a choice."""
    saved, now = _flat(ckpt.get("hyper_parameters") or {}), _flat(model.hparams)
    differ = [f"{k}={now[k]!r} (checkpoint: {saved[k]!r})"
              for k in sorted(saved.keys() & now.keys()) if saved[k] != now[k]]  # fmt: skip
    # parameters only: buffers (an n-gram model's count tables) take their size from the data
    buffers = {k for k, _ in model.named_buffers()}
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in buffers}
    stored = {k: tuple(v.shape) for k, v in ckpt["state_dict"].items() if k not in buffers}
    if shapes != stored:
        clash = next(
            f"{k} is {shapes.get(k)} here, {stored.get(k)} in the checkpoint"
            for k in sorted(shapes.keys() | stored.keys()) if shapes.get(k) != stored.get(k)
        )  # fmt: skip
        settings = f"; settings that differ: {', '.join(differ)}" if differ else ""
        raise PipelineError(f"checkpoint {path} does not fit this model ({clash}){settings}")
    if differ:
        log.warning("checkpoint %s: other settings now: %s",
                                            path, ", ".join(differ))  # fmt: skip


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, made atomic: the checkpoint goes to a temporary sibling
    renamed over the target, so a kill or a full disk during the save leaves the previous
    checkpoint whole; a failed save is one error line."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        with atomic_file(Path(path)) as tmp:
            torch.save(checkpoint, tmp)
