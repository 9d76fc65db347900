"""Checkpoints are read with `weights_only=True` (no pickled code runs) and checked for the model
they hold."""

from __future__ import annotations

from pathlib import Path

import torch

from src.utils.errors import PipelineError


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
        lines = str(e).splitlines()
        reason = next((ln.strip() for ln in lines if "Unsupported global" in ln), lines[0])
        raise PipelineError(f"cannot read checkpoint {path}: {reason}") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise PipelineError(f"{path} is not a checkpoint of this pipeline")
    found = ckpt.get("model_class")
    if expected_class and found != expected_class:
        raise PipelineError(
            f"checkpoint {path} holds a {found or 'foreign model'}, not a {expected_class}"
        )
    return ckpt
