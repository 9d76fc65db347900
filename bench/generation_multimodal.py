"""Multimodal generation (Bishop 12.4.4), scored by the project's own classifiers: text -> image
on MNIST (Parti's shape, `model=parti`), image -> text (`model=captioner`) and one model for both
(CM3Leon's idea, `model=cm3leon`), all the encoder-decoder of model=seq2seq over one vocabulary
of caption words and codes of 4 x 4 patches (k-means, 512 codes, train split only); and
text -> speech on FSDD (Vall-E's recipe, `experiment=tts_fsdd`), GPT over codes of log-mel frames.

    python bench/generation_multimodal.py [--parts images speech] [--judge-steps 800]
                                          [--steps 900] [--tts-steps 1000] [--out DIR]
                                          [--json FILE] [KEY=VALUE ...]

Images:
1. The judge: the small CNN (`model=cnn data=mnist`) trained on the same split (MNIST's t10k
   images cut 80/10/10, 8,000 to train on); its test accuracy on real images, and on the test
   images rebuilt from their codes (the ceiling of any model that draws in codes).
2. Parti, the captioner and the joint model, each `--steps` steps through `python -m src.train`.
   Prompts: "a thick D", "a thin D" and "a D" for every digit, 10 samples each (temperature 1),
   judged: the prompted digit recognised (target >= 80 %, chance 10 %), the stroke (P(ink of a
   "thick" sample > ink of a "thin" one), chance 0.5), distinct code sequences and the mean
   pixel distance between samples of one prompt, beside that of real test images of one digit.
   Captions of the 1,000 test images, greedy: the digit right, and the whole caption (stroke
   included, against the measured one).
Speech:
1. Two judges, the AST of bench/audio.py (`model=ast data=fsdd`) on FSDD's official split
   (takes 0-4 of every speaker unheard): one hears the digit, one (`data.target=speaker`) the
   voice.
2. TTS (`experiment=tts_fsdd`, `--tts-steps` steps): yweweler is held out of its training, and
   each of his 500 recordings is said again from its word and a prompt (another of his
   recordings), decoded to a WAV through the codebook's frames and Griffin-Lim, and heard by the
   judges (target: >= 50 % of the words recognised, chance 10 %; his voice recognised, chance
   20 %), beside his real recordings and them rebuilt from their codes (the ceiling); and the
   val split's recordings (by the four speakers TTS was trained on, unheard) said the same way.
Sample grids, speech.png and a few WAVs are copied to --out. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from src.utils.summary import emit_summary, train_run

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("parti", "captioner", "cm3leon")
REFERENCE = {"chance": 0.1, "target_image_digit_acc": 0.8, "stroke_chance": 0.5,
             "voice_chance": 0.2, "target_speech_digit_acc": 0.5}  # fmt: skip


def real_references(judge: Path, processed: Path, codes: Path, patch: int) -> dict:
    """The judge on the test images rebuilt from their codes, and the mean pixel distance
    between real test images of one digit (30 of each)."""
    from src.data.images import dequantize, quantize
    from src.models.image import load_classifier
    from src.models.multimodal import mean_pairwise_distance

    x, y = np.load(processed / "test_x.npy"), np.load(processed / "test_y.npy")
    book = np.load(codes / "codebook.npy")  # the data's codes_dir
    rebuilt = dequantize(torch.from_numpy(quantize(x, book, patch)), torch.from_numpy(book),
                         x.shape[2:], patch)  # fmt: skip
    meta = json.loads((processed / "meta.json").read_text())
    mean = torch.tensor(meta["mean"])[:, None, None] / 255
    std = torch.tensor(meta["std"])[:, None, None] / 255
    with torch.no_grad():
        said = load_classifier(judge)((rebuilt - mean) / std).argmax(-1).numpy()
    real = torch.from_numpy(x / 255.0).float()
    spread = [mean_pairwise_distance(real[np.flatnonzero(y == d)[:30]]) for d in range(10)]
    return {"rebuilt_acc": float((said == y).mean()), "real_spread": float(np.mean(spread))}


def images(args, out: Path) -> dict:
    """The MNIST part: the judge, then each text <-> image model; prints its table."""
    mnist = ["data=mnist", "trainer.max_epochs=-1"]
    judge_metrics, judge_s = train_run(
        [*mnist, "model=cnn", f"trainer.max_steps={args.judge_steps}"], out / "judge"
    )
    judge = next((out / "judge" / "checkpoints").glob("best-*.ckpt"))  # the best val loss
    print(f"judge (CNN): test accuracy {judge_metrics['test/acc']:.3f} on real images, "
          f"{judge_s:.0f} s", flush=True)  # fmt: skip
    rows = {}
    for model in args.models:
        metrics, seconds = train_run([*mnist, f"model={model}", f"model.judge={judge}",
                                      f"trainer.max_steps={args.steps}", *args.overrides],
                                     out / model)  # fmt: skip
        rows[model] = {k.removeprefix("test/"): v for k, v in metrics.items()
                       if k.startswith("test/")} | {"seconds": seconds}  # fmt: skip
        if (out / model / "samples.png").exists():
            shutil.copy(out / model / "samples.png", out / f"{model}_samples.png")
        print(f"{model}: " + ", ".join(f"{k} {v:.3f}" for k, v in rows[model].items()),
              flush=True)  # fmt: skip

    data = OmegaConf.load(out / args.models[0] / "config.yaml").data
    processed = ROOT / data.processed_dir
    codes = processed.with_name(f"{processed.name}-codes{data.codes}-p{data.patch}")
    refs = real_references(judge, processed, codes, data.patch)

    print(
        f"\nMNIST, {args.steps} steps per generator; the judge: {judge_metrics['test/acc']:.1%} "
        f"on real test images, {refs['rebuilt_acc']:.1%} on them rebuilt from codes (ceiling)"
    )
    print(
        f"{'model':<10}{'digit drawn':>12}{'stroke':>8}{'distinct':>10}{'spread':>8}"
        f"{'caption digit':>15}{'caption exact':>15}{'seconds':>9}"
    )
    for model, r in rows.items():
        keys = ("image_digit_acc", "stroke_auc", "image_distinct", "image_spread",
                "caption_digit_acc", "caption_exact")  # fmt: skip
        cells = [r.get(k) for k in keys]
        shown = [f"{c:.3f}" if c is not None else "-" for c in cells]
        print(
            f"{model:<10}{shown[0]:>12}{shown[1]:>8}{shown[2]:>10}{shown[3]:>8}{shown[4]:>15}"
            f"{shown[5]:>15}{r['seconds']:>9.0f}"
        )
    print(f"{'real':<10}{'':>12}{'':>8}{'':>10}{refs['real_spread']:>8.3f}")
    print(
        f"references: chance 10 %, target >= 80 % digits drawn, stroke chance 0.5; samples in {out}"
    )
    return {"steps": args.steps, "judge_acc": judge_metrics["test/acc"], **refs, "models": rows}


def speech(args, out: Path) -> dict:
    """The FSDD part: the digit and voice judges, then TTS; prints its table."""
    fsdd = ["data=fsdd", "model=ast", "data.split=official", "trainer.max_epochs=-1",
            f"trainer.max_steps={args.judge_steps}"]  # fmt: skip
    judges = {}
    for name, target in (("digit_judge", "label"), ("voice_judge", "speaker")):
        metrics, seconds = train_run([*fsdd, f"data.target={target}"], out / name)
        judges[name] = {"acc": metrics["test/acc"], "seconds": seconds,
                        "ckpt": next((out / name / "checkpoints").glob("best-*.ckpt"))}  # fmt: skip
        print(f"{name} (AST): test accuracy {metrics['test/acc']:.3f} on unheard takes, "
              f"{seconds:.0f} s", flush=True)  # fmt: skip
    run = out / "tts"
    m, seconds = train_run(["experiment=tts_fsdd", f"trainer.max_steps={args.tts_steps}",
                            f"model.judge={judges['digit_judge']['ckpt']}",
                            f"model.voice_judge={judges['voice_judge']['ckpt']}",
                            "model.samples=10", *args.overrides], run)  # fmt: skip
    shutil.copy(run / "speech.png", out / "tts_speech.png")
    wavs = sorted((run / "samples").glob("*.wav"))
    for wav in wavs:
        shutil.copy(wav, out / f"tts_{wav.name}")
    rows = {kind: {"digit": m[f"test/{kind}_digit_acc"], "voice": m[f"test/{kind}_voice_acc"]}
            for kind in ("speech", "rebuilt", "real", "seen_speech")}  # fmt: skip
    print(f"\nFSDD, TTS {args.tts_steps} steps ({seconds:.0f} s): recordings heard by the judges")
    print(f"{'recordings':<46}{'digit heard':>12}{'voice heard':>12}")
    names = {"speech": "held-out speaker: said by TTS from a prompt",
             "rebuilt": "held-out speaker: real, rebuilt from codes",
             "real": "held-out speaker: real",
             "seen_speech": "speakers trained on: said by TTS from a prompt"}  # fmt: skip
    for kind, r in rows.items():
        print(f"{names[kind]:<46}{r['digit']:>12.3f}{r['voice']:>12.3f}")
    print(f"references: chance 10 % / 20 %, target >= 50 % digits heard; WAVs: "
          f"{', '.join(str(out / f'tts_{w.name}') for w in wavs[:3])}, ...")  # fmt: skip
    return {
        "tts_steps": args.tts_steps,
        "tts_seconds": seconds,
        "recordings": rows,
        "judges": {k: {"acc": v["acc"], "seconds": v["seconds"]} for k, v in judges.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", default=["images", "speech"], choices=["images", "speech"])
    p.add_argument("--judge-steps", type=int, default=800, help="training steps of each judge")
    p.add_argument("--steps", type=int, default=900, help="training steps of each image model")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--tts-steps", type=int, default=1000, help="training steps of TTS")
    p.add_argument("--out", type=Path, default=ROOT / "outputs/bench/generation_multimodal")
    p.add_argument("--json", type=Path, help="write the summary here as well")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every generator run")
    args = p.parse_args()
    out = args.out.resolve()
    summary = {"bench": "generation_multimodal", "reference": REFERENCE}
    for part in args.parts:
        summary[part] = {"images": images, "speech": speech}[part](args, out)
    emit_summary(summary, args.json)


if __name__ == "__main__":
    main()
