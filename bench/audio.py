"""Spoken digits (FSDD, Bishop 12.4.3): the audio spectrogram Transformer against the small CNN,
both on the same log-mel spectrograms through `python -m src.train`, on three splits:
(a) leave-one-speaker-out over the five speakers (`data.split=speaker data.fold=K`: a voice never
heard in training), (b) a random stratified split, (c) FSDD's official split (takes 0-4 of every
speaker are test).

    python bench/audio.py [--ast-steps N] [--cnn-steps N] [--models cnn ast]
                          [--teacher cnn | none] [--splits speaker random official voices]
                          [--voices 2 3] [--seeds S ...] [--jobs N] [--out DIR] [--json FILE]
                          [KEY=VALUE ...]

Each model runs its recipe, `experiment=cnn_fsdd | ast_fsdd`: both on the same 20 x 20 log-mels
(`data=fsdd_small`, CNNWordReco's features), the CNN with a mel warp for 650 steps of 32 (about
CNNWordReco's 10 epochs), then the AST (a depthwise convolution of the patch grid before every
layer, CPVT's) with warps, SpecAugment and mixup for 2,400 steps of 64, distilled from the CNN
trained on the same split (DeiT's hard distillation, the CNN's labels as the only target,
`model.teacher=<the CNN's best checkpoint>`; `--teacher none`: the AST alone, on the true
labels); --ast-steps / --cnn-steps change the steps.

(d) `voices`: how far a new voice falls with fewer training voices: for each k of --voices, the
models train on k of the five speakers (the 5 runs of k neighbours in the sorted list, cyclic)
and are tested on the other 5 - k; with (a)'s four voices, a curve of accuracy against k.
Every speaker split reports the accuracy on each held-out speaker (from the run's best
checkpoint, over that speaker's test recordings), its mean and the worst speaker.

--seeds S1 S2 ...: every run once with each seed (the AST taught by the CNN of its own seed and
split); the figures are then means over the seeds, with each seed's mean and worst speaker
beside them: one seed moves a held-out speaker by up to 6 points. --jobs N trains N runs at a
time, each on its share of the cores (OMP_NUM_THREADS).

The spectrograms are prepared once (the stage `prepare_audio`; its time and files/s printed) and
every run splits them at set-up. Each run is tested at its best val loss. Prints test accuracy
per model and split (per speaker, and their mean, for (a)), parameters and seconds per epoch.
References: this project's targets, AST >= 91.2 % mean speaker-independent accuracy (a residual
CNN trained on four of these speakers reaches 91.2 % on the fifth, saztorralba/CNNWordReco) and
>= 98 % on the random split; AST with ImageNet pre-training reaches 98.1 % on Speech Commands V2
(Gong et al. 2021), which we do not have. Raw data comes from data/raw (or $DATA_MIRROR); the
last line printed is JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import fmean

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from src.utils.summary import emit_summary, train_run

ROOT = Path(__file__).resolve().parents[1]
SPEAKERS = ("george", "jackson", "nicolas", "theo", "yweweler")  # sorted: fold K holds out the K-th
SPLITS = {
    "speaker": [["data.split=speaker", f"data.fold={k}"] for k in range(len(SPEAKERS))],
    "random": [["data.split=random"]],
    "official": [["data.split=official"]],
}
RECIPE = {"cnn": ["experiment=cnn_fsdd"], "ast": ["experiment=ast_fsdd"]}
REFERENCE = {"target_ast_speaker_mean": 0.912, "target_ast_random": 0.98,
             "cnnwordreco_speaker": 0.912, "ast_speech_commands_v2_imagenet": 0.981}  # fmt: skip


def prepare(overrides: list[str]) -> dict:
    """The mel stage, afresh and timed (its output is reused by every run)."""
    import shutil

    for o in overrides:
        if o.startswith("data.processed_dir="):
            shutil.rmtree(o.partition("=")[2], ignore_errors=True)
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "src.prepare", "data=fsdd_small", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: the mel stage failed: {proc.stderr.strip().splitlines()[-1]}")
    seconds = time.perf_counter() - t0
    folder = next(o.partition("=")[2] for o in overrides if o.startswith("data.processed_dir="))
    files = json.loads((Path(folder) / "meta.json").read_text())["files"]
    return {"seconds": round(seconds, 1), "files": files, "files_per_sec": files / seconds}


def voices_splits(k: int) -> list[list[str]]:
    """Train on k neighbouring speakers (cyclic in the sorted list), test on the rest."""
    splits = []
    for start in range(len(SPEAKERS)):
        train = {SPEAKERS[(start + i) % len(SPEAKERS)] for i in range(k)}
        held_out = ",".join(s for s in SPEAKERS if s not in train)
        splits.append(["data.split=speaker", f"data.test_speakers=[{held_out}]"])
    return splits


def run_name(split: list[str]) -> str:
    """The folder of a split's run: speaker-0, random, speaker-jackson+nicolas+theo, ..."""
    name = "-".join(override.split("=")[1] for override in split)
    return name.replace("[", "").replace("]", "").replace(",", "+")


def speaker_accuracies(run_dir: Path) -> dict[str, float]:
    """A run's test accuracy on each speaker of its test split, from its best checkpoint."""
    import numpy as np
    import torch

    from src.models.image import load_classifier

    cfg = OmegaConf.load(run_dir / "config.yaml")
    data = instantiate(cfg.data, processed_dir=str(ROOT / cfg.data.processed_dir))
    data.setup("test")
    net = load_classifier(teacher_checkpoint(run_dir))
    speakers = data.manifest()[1][data.split_rows()["test"]]
    loader = torch.utils.data.DataLoader(data.splits["test"], batch_size=256,
                                         collate_fn=data.collate)  # fmt: skip
    with torch.no_grad():
        right = np.concatenate([(net(x, *lengths).argmax(-1) == y).numpy()
                                for x, y, *lengths in loader])  # fmt: skip
    return {s: float(right[speakers == s].mean()) for s in sorted(set(speakers))}


def held_out_means(runs: list[dict]) -> dict[str, float]:
    """Each held-out speaker's accuracy, the mean over the runs that held it out."""
    held = sorted({sp for r in runs for sp in r["speakers"]})
    return {sp: fmean(r["speakers"][sp] for r in runs if sp in r["speakers"]) for sp in held}


def teacher_checkpoint(run_dir: Path) -> Path:
    """The CNN run's best checkpoint (its last when it never validated, as in a short run)."""
    found = [*sorted(run_dir.glob("checkpoints/best-*.ckpt")), run_dir / "checkpoints/last.ckpt"]
    if not found[0].exists():
        sys.exit(f"error: no CNN checkpoint in {run_dir} to distil from: run --models cnn ast")
    return found[0]


def train(model: str, split: list[str], steps: int | None, run_dir: Path,
          overrides: list[str], threads: int | None = None) -> dict:  # fmt: skip
    steps_override = [f"trainer.max_steps={steps}"] if steps else []
    m, seconds = train_run([*RECIPE[model], *split, *steps_override, "trainer.max_epochs=-1",
                            *overrides], run_dir, threads)  # fmt: skip
    cfg = OmegaConf.load(run_dir / "config.yaml")
    result = {"acc": m["test/acc"], "f1": m["test/f1"], "parameters": int(m["params/total"]),
              "steps": cfg.trainer.max_steps, "seconds": round(seconds, 1),
              "epoch_seconds": epoch_seconds(run_dir, cfg.data)}  # fmt: skip
    if cfg.data.split == "speaker":
        result["speakers"] = speaker_accuracies(run_dir)
    return result


def epoch_seconds(run_dir: Path, data: DictConfig) -> float:
    """Seconds of one training epoch: the train split's size over the spectrograms a second of
    training steps (Throughput's train/images_per_sec, averaged over the run); NaN when the run
    was too short to log it."""
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").read_text().splitlines()))
    rates = [float(r["train/images_per_sec"]) for r in rows if r.get("train/images_per_sec")]
    if not rates:
        return float("nan")
    splits = instantiate(data, processed_dir=str(ROOT / data.processed_dir)).split_rows()
    return round(len(splits["train"]) / fmean(rates), 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ast-steps", type=int, help="training steps of each AST run (its recipe's)")
    p.add_argument("--cnn-steps", type=int, help="training steps of each CNN run (its recipe's)")
    p.add_argument("--models", nargs="+", choices=["cnn", "ast"], default=["cnn", "ast"])
    p.add_argument("--teacher", choices=["cnn", "none"], default="cnn",
                   help="the AST distils from its split's CNN (trained first), or not")  # fmt: skip
    p.add_argument("--splits", nargs="+", choices=[*SPLITS, "voices"], default=list(SPLITS))
    p.add_argument("--voices", type=int, nargs="+", default=[2, 3],
                   help="--splits voices: train on this many of the five speakers")  # fmt: skip
    p.add_argument("--seeds", type=int, nargs="+",
                   help="every run once with each seed (default: the config's seed)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="runs trained at a time")
    p.add_argument("--out", type=Path, default=ROOT / "outputs/bench/audio")
    p.add_argument("--json", type=Path, help="also write the JSON result here (DVC's metrics)")
    p.add_argument("overrides", nargs="*", help="more key=value for every run")
    args = p.parse_args()
    steps = {"ast": args.ast_steps, "cnn": args.cnn_steps}
    # the spectrograms made afresh in --out, so that the stage's time is measured
    out = args.out.resolve()
    overrides = [f"data.processed_dir={out / 'fsdd-mel'}", *args.overrides]
    stage = prepare([o for o in overrides if o.startswith("data.")])
    print(f"mel stage: {stage['seconds']:.0f} s, {stage['files_per_sec']:.0f} files/s", flush=True)
    plan = {name: SPLITS[name] for name in args.splits if name != "voices"}
    if "voices" in args.splits:
        plan.update({f"voices-{k}": voices_splits(k) for k in args.voices})
    seeds = args.seeds or [None]
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None
    results = {m: {} for m in RECIPE if m in args.models}  # RECIPE's order: the teacher first
    for model in results:
        todo = [(split, s, seed) for split, split_runs in plan.items() for s in split_runs
                for seed in seeds]  # fmt: skip

        def run(split: str, s: list[str], seed: int | None, model: str = model) -> dict:
            name = run_name(s) + (f"-seed{seed}" if seed is not None else "")
            extra = [f"seed={seed}"] if seed is not None else []
            if model == "ast" and args.teacher == "cnn":
                extra.append(f"model.teacher={teacher_checkpoint(out / 'cnn' / name)}")
            return train(model, s, steps[model], out / model / name, [*overrides, *extra],
                         threads)  # fmt: skip

        with ThreadPoolExecutor(args.jobs) as pool:
            done = list(pool.map(lambda job: (job[0], job[2], run(*job)), todo))
        for split in plan:
            runs = [r for sp, _, r in done if sp == split]
            by_seed = {seed: [r for sp, sd, r in done if sp == split and sd == seed]
                       for seed in seeds}  # fmt: skip
            entry = results[model][split] = {"acc": fmean(r["acc"] for r in runs), "runs": runs}
            per = ""
            if "speakers" in runs[0]:  # each held-out speaker, over the runs that held it out
                entry["speakers"] = held_out_means(runs)
                entry["worst"] = min(entry["speakers"].values())
                per = "  (" + "  ".join(f"{sp} {100 * a:.1f}" for sp, a in
                                        entry["speakers"].items())  # fmt: skip
                per += f"; worst {100 * entry['worst']:.1f})"
            if args.seeds:  # each seed's figures: how far a single seed's may stray
                entry["seeds"] = {}
                for seed, rs in by_seed.items():
                    e = entry["seeds"][seed] = {"acc": fmean(r["acc"] for r in rs)}
                    if "speakers" in rs[0]:
                        e["worst"] = min(held_out_means(rs).values())
            print(f"{model:<4} {split:<9} {100 * entry['acc']:6.2f} %{per}  "
                  f"{runs[0]['parameters']:,} parameters, {runs[0]['steps']} steps, "
                  f"{runs[0]['epoch_seconds']:.1f} s an epoch", flush=True)  # fmt: skip
            if "seeds" in entry:
                print("     by seed: " + ", ".join(
                    f"{seed}: {100 * e['acc']:.1f} %"
                    + (f" (worst {100 * e['worst']:.1f})" if "worst" in e else "")
                    for seed, e in entry["seeds"].items()), flush=True)  # fmt: skip
    if "ast" in results:
        for split, key in (("speaker", "target_ast_speaker_mean"), ("random", "target_ast_random")):
            if split in results["ast"]:
                acc, target = results["ast"][split]["acc"], REFERENCE[key]
                print(f"AST {split}: {100 * acc:.2f} % against the target {100 * target:.1f} %: "
                      f"{'met' if acc >= target else 'not met'}")  # fmt: skip
    summary = {"bench": "audio", "recipes": RECIPE, "teacher": args.teacher, "prepare": stage,
               "models": results, "reference": REFERENCE}  # fmt: skip
    emit_summary(summary, args.json)


if __name__ == "__main__":
    main()
