"""GPT training throughput and model FLOPs utilisation (MFU) on the hardware at hand.

    python bench/throughput.py                        # every setup this machine can run
    python bench/throughput.py --setups gpu gpu-compile ddp-compile --model gpt2-small

Trains GPT through `python -m src.train` (the default corpus, always present) for `--steps`
steps in each setup and reads `train/tokens_per_sec` (all processes, validation excluded) from
its metrics.json. MFU = tokens/s x FLOPs per token / peak FLOP/s of the devices used, with
nanoGPT's count of FLOPs per token (Chowdhery et al. 2022, appendix B): 6 N + 12 L D T for N
non-embedding parameters, L layers, width D and context T (forward and backward). The peak is
the dense bf16 figure of known GPUs (H100/H200 989 TFLOP/s, A100 312) or --peak-tflops.

Setups: cpu (trainer=default, fp32), gpu (trainer=gpu, bf16), gpu-compile (+ model.compile),
ddp and ddp-compile (trainer=ddp, every GPU of the machine). The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from src.models.gpt import flops_per_token
from src.utils.summary import emit_summary

ROOT = Path(__file__).resolve().parents[1]
SETUPS = {
    "cpu": ["trainer=default"],
    "gpu": ["trainer=gpu"],
    "gpu-compile": ["trainer=gpu", "model.compile=true"],
    "ddp": ["trainer=ddp"],
    "ddp-compile": ["trainer=ddp", "model.compile=true"],
}
MODELS = {  # L, H, D, T, batch per process
    "baby": dict(n_layer=4, n_head=4, d_model=128, block_size=64, batch_size=12),
    "gpt2-small": dict(n_layer=12, n_head=12, d_model=768, block_size=1024, batch_size=16),
}
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense tensor-core FLOP/s


def devices(setup: str) -> tuple[int, str]:
    import torch

    if setup == "cpu":
        return 1, "cpu"
    count = torch.cuda.device_count() if setup.startswith("ddp") else 1
    return count, torch.cuda.get_device_name(0)


def peak(name: str, given: float | None) -> float | None:
    if given:
        return given * 1e12
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def run(setup: str, model: dict, steps: int, out: Path) -> dict:
    m = model
    cmd = [
        sys.executable, "-m", "src.train", *SETUPS[setup], "logger=csv", "test=false",
        "callbacks.progress_bar.refresh_rate=0", f"trainer.max_steps={steps}",
        "trainer.limit_val_batches=2", "trainer.num_sanity_val_steps=0",
        f"data.steps_per_epoch={steps}", f"data.block_size={m['block_size']}",
        f"data.batch_size={m['batch_size']}", f"model.net.n_layer={m['n_layer']}",
        f"model.net.n_head={m['n_head']}", f"model.net.d_model={m['d_model']}",
        "model.generation.max_new_tokens=1", f"hydra.run.dir={out / setup}",
    ]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    start = time.time()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    metrics = json.loads((out / setup / "metrics.json").read_text())
    processed = yaml.safe_load((out / setup / "config.yaml").read_text())["data"]["processed_dir"]
    meta = json.loads((ROOT / processed / "meta.json").read_text())
    return {"tokens_per_sec": metrics["train/tokens_per_sec"], "params": metrics["params/total"],
            "vocab": meta["vocab_size"], "seconds": round(time.time() - start)}  # fmt: skip


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gpu = torch.cuda.is_available()
    setups = ["gpu", "gpu-compile", "ddp-compile"] if gpu else ["cpu"]
    parser.add_argument("--setups", nargs="+", choices=list(SETUPS), default=setups)
    parser.add_argument("--model", choices=list(MODELS), default="gpt2-small" if gpu else "baby")
    parser.add_argument("--steps", type=int, default=300 if gpu else 100)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="one device's peak TFLOP/s, for other than known GPUs")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench" / "throughput")
    parser.add_argument("--json", type=Path, default=None, help="write the summary here too")
    args = parser.parse_args()

    rows = {}
    model = MODELS[args.model]
    print(f"{'setup':<12} {'devices':<28} {'tokens/s':>12} {'TFLOP/s':>9} {'MFU':>7}")
    for setup in args.setups:
        r = run(setup, model, args.steps, args.out)
        n, name = devices(setup)
        achieved = r["tokens_per_sec"] * flops_per_token(model, r["params"], r["vocab"])
        top = peak(name, args.peak_tflops)
        mfu = achieved / (top * n) if top else None
        rows[setup] = {**r, "devices": f"{n} x {name}", "tflops": achieved / 1e12, "mfu": mfu}
        print(f"{setup:<12} {rows[setup]['devices']:<28} {r['tokens_per_sec']:>12,.0f} "
              f"{achieved / 1e12:>9.2f} {f'{mfu:.1%}' if mfu else '-':>7}")  # fmt: skip
    emit_summary({"model": args.model, "steps": args.steps, "setups": rows}, args.json)


if __name__ == "__main__":
    main()
