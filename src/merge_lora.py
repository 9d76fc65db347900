"""Fold the LoRA adapters of a fine-tuned BERT checkpoint into its weights, W_0 + (alpha/R) A B,
and save a plain checkpoint of the same classifier (model.lora.rank=0): same outputs, no adapters,
no extra cost at inference.

python -m src.merge_lora ckpt=RUN/checkpoints/last.ckpt out=RUN/checkpoints/merged.ckpt
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from src.utils.config import register_resolvers

register_resolvers()


def merge_checkpoint(src: str, dst: str, probe_len: int = 32) -> float:
    """Write the merged checkpoint to `dst` (which must not exist); returns the largest absolute
    difference between merged and unmerged logits on a random probe batch."""
    from pathlib import Path

    import torch

    from src.models.bert import BertClassifier
    from src.utils.checkpoint import class_path, load_checkpoint
    from src.utils.errors import PipelineError
    from src.utils.files import atomic_file

    out = Path(dst)
    if out.exists():
        raise PipelineError(f"{out} exists; choose another out= (nothing was overwritten)")
    ckpt = load_checkpoint(src, expected_class=class_path(BertClassifier))
    hp = dict(ckpt["hyper_parameters"], pretrained=None)  # the weights come from ckpt itself
    if not (hp.get("lora") or {}).get("rank"):
        raise PipelineError(f"{src} was fine-tuned without LoRA (model.lora.rank=0): no adapters")
    model = BertClassifier(**hp)
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    probe = torch.randint(
        0, hp["vocab_size"], (4, probe_len), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        before = model(probe)
        merged = model.merged()
        diff = (merged(probe) - before).abs().max().item()

    plain = {k: v for k, v in ckpt.items() if k not in ("optimizer_states", "lr_schedulers",
                                                       "callbacks", "loops")}  # fmt: skip
    plain["state_dict"] = merged.state_dict()
    plain["hyper_parameters"] = dict(hp, lora=dict(hp["lora"], rank=0))
    with atomic_file(out) as tmp:  # a reader never sees half a file
        torch.save(plain, tmp)
    return diff


@hydra.main(version_base="1.3", config_path="../conf", config_name="merge_lora")
def main(cfg: DictConfig) -> None:
    from src.utils.errors import report_errors

    with report_errors():
        diff = merge_checkpoint(cfg.ckpt, cfg.out)
    print(f"merged LoRA into {cfg.out}; max |merged - unmerged| logit on a probe batch: {diff:.2e}")


if __name__ == "__main__":
    main()
