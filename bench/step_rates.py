"""How many images (or spectrograms) a second one training step of ViT-B/16 and of the AST takes
on the GPU at hand: the rate a data loader must deliver to keep it busy (bench/loaders.py).

    python bench/step_rates.py [--batch 256] [--steps 20] [--compile] [--json FILE]

ViT-B/16 (Dosovitskiy et al. 2021): 224 x 224 RGB images in 16 x 16 patches, L = 12, D = 768, 12
heads, 1,000 classes. The AST (Gong et al. 2021): the same encoder on one-channel log-mel
spectrograms in 16 x 16 patches at stride 10, here 126 x 1016 (AST's 128 x 1024 cut to tile
exactly: 12 x 101 = 1,212 patches, AST's count), 527 classes (AudioSet). Both are this project's
`src.models.image.ViT`, trained on random inputs with bf16 autocast and AdamW (fused); the
steps are timed after warm-up, between two CUDA synchronisations. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from src.models.image import ViT, ViTConfig

MODELS = {
    "vit_b16": ViTConfig(image_size=(224, 224), channels=3, num_classes=1000, patch_size=16,
                         n_layer=12, n_head=12, d_model=768),
    "ast": ViTConfig(image_size=(126, 1016), channels=1, num_classes=527, patch_size=16,
                     patch_stride=10, n_layer=12, n_head=12, d_model=768),
}  # fmt: skip


def rate(cfg: ViTConfig, batch: int, steps: int, compile: bool) -> dict:
    torch.manual_seed(0)
    torch._dynamo.reset()  # a fresh compilation for each model: its shapes are static
    model = ViT(cfg).cuda()
    step_model = torch.compile(model) if compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(batch, cfg.channels, *cfg.image_size, device="cuda")
    y = torch.randint(cfg.num_classes, (batch,), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(step_model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    for _ in range(5):  # warm-up (and compilation)
        step()
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / steps
    return {"images_per_s": batch / seconds, "step_ms": 1e3 * seconds, "warmup_s": warm,
            "tokens": model.patches.num_patches + 1,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--compile", action="store_true", help="also with torch.compile")
    p.add_argument("--json", help="also write the JSON result here")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    rows = {"device": torch.cuda.get_device_name(0), "batch": args.batch}
    for name, cfg in MODELS.items():
        for compiled in (False, True) if args.compile else (False,):
            key = name + ("_compiled" if compiled else "")
            torch.cuda.reset_peak_memory_stats()
            rows[key] = r = rate(cfg, args.batch, args.steps, compiled)
            print(f"{key:<18} {r['images_per_s']:>9,.0f} images/s  {r['step_ms']:7.1f} ms/step  "
                  f"{r['tokens']} tokens  {r['peak_memory_gb']:.1f} GB", flush=True)  # fmt: skip
    print(json.dumps(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
