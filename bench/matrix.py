"""The defaults matrix: every supported (model, data) pair trained with its plain defaults,
`python -m src.train model=X data=Y` and nothing tuned, for a short fixed budget; its test
metric printed beside the trivial baseline (what a model that ignores its input scores) and
whether it is clearly above it.

    python bench/matrix.py [--only gin/tudataset gcn/planetoid ...] [--strict] [--out DIR]
                           [--json FILE]

Baselines: the training split's majority class (test/acc_majority) for classification, the
training mean (test/rmse_mean) for regression, 0.5 ROC-AUC for links, the unigram distribution
of the training tokens for language models, causal and masked, and of the training pixels' codes
for ImageGPT (its cross-entropy on the test tokens), for word2vec's negative-sampling loss
vectors that score every pair 0, (1 + S) log 2, and for translation the source sentence copied
as its own translation (its chrF).
"Clearly above": accuracy 5 points over the majority's, RMSE under 90 % of the mean's, ROC-AUC
over 0.6, a loss under 90 % of the unigram's, chrF 10 points over the copy's. A pair that makes
no sense (EGNN without coordinates, the AST's 16 x 16 patches on 20 x 20 log-mels) is listed as
refused, with its one-line error. On the karate club (20 test nodes) and MUTAG (19 test graphs per
fold), where one example is 5 points, a pair's figures are the means over three splits (split
seeds 0-2, folds 0-2). Raw data comes from data/raw (or $DATA_MIRROR); every run writes into
--out.

The stricter column (--strict): for each pair that a bench reports (BENCHED), the README's
command for it, the plain `model=X data=Y` or the preset the README names, at its own full
budget, beside the bench's figure; the pair fails when it trails by more than the stated margin
(accuracy points, or a share of a loss or an RMSE).

The last rows are a user's workflow on files of their own (written into --out/user from tiny
Shakespeare: its first 60 % as a plain text file, and the speeches of its two most frequent
speakers in the rest as a text,label CSV): BERT pre-trained on the text file, then fine-tuned
on the CSV with model.pretrained, fully and with LoRA.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean

import numpy as np

from src.utils.errors import report_errors
from src.utils.summary import emit_summary

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["logger=csv", "callbacks.progress_bar.refresh_rate=0"]


@dataclass
class Pair:
    model: str
    data: str
    metric: str  # test/acc | test/rmse | test/auroc | test/loss
    overrides: list[str] = field(default_factory=list)
    steps: int = 300
    name: str = ""
    refused: bool = False  # expected to stop with one error line (it makes no sense)
    after: str = ""  # the label of a pair that must run first ({runs}/<its folder> in overrides)
    splits: tuple[str, ...] = ()  # a run per override (data.fold=0, ...), results averaged

    @property
    def label(self) -> str:
        return self.name or f"{self.model}/{self.data}"


@dataclass
class Benched:
    """A pair's figure in a bench, and the README's command that should reach it."""

    figure: float
    margin: float  # accuracy, ROC-AUC, chrF: points below; loss, RMSE: a share above
    command: list[str]  # beside model=X data=Y: the preset the README names, or nothing
    source: str  # where the bench's table is
    metric: str = ""  # the bench's metric where it is not the pair's
    splits: tuple[str, ...] = ()  # the bench's splits where they are not the pair's
    after: str = ""  # the label of a benched pair whose README run this one reads ({runs})
    prepare: list[str] = field(default_factory=list)  # `python -m src.prepare` first, as the README


FOLDS = tuple(f"data.fold={k}" for k in range(10))  # the GIN paper's 10-fold protocol
SPEAKERS = tuple(f"data.fold={k}" for k in range(5))  # FSDD: each of its five voices held out
TEACHER = "{runs}/cnn__fsdd_small-README/{split}/checkpoints/last.ckpt"  # that split's CNN
SEEDS = tuple(f"seed={s}" for s in range(3))  # bench/bert_speakers.py's three fine-tunings
BENCHED = {
    "vit/mnist": Benched(0.989, 0.02, ["experiment=vit_mnist"], "docs/vision.md"),
    "cnn/mnist": Benched(0.992, 0.02, [], "docs/vision.md"),
    "gcn/planetoid": Benched(0.820, 0.02, ["experiment=gcn_cora"], "docs/gnn.md"),
    "gat/planetoid": Benched(0.829, 0.02, ["experiment=gat_cora"], "docs/gnn.md"),
    "gcn/planetoid (link)": Benched(0.912, 0.02, ["experiment=gcn_cora_link"], "docs/gnn.md"),
    "egnn/esol": Benched(0.661, 0.05, ["experiment=esol_egnn"], "docs/gnn.md"),
    # the GIN paper's protocol over the bench's 10 folds (the epoch chosen on the held-out folds);
    # the preset's test/acc is its best val/acc, also on the held-out fold (~18 s a fold)
    "gin/tudataset": Benched(0.897, 0.02, ["experiment=gin_mutag"], "docs/gnn.md", splits=FOLDS),
    # leave-one-speaker-out, the mean of the five speakers (bench/audio.py); the AST taught by
    # the CNN of the same fold, as the README's two commands run it
    "cnn/fsdd_small": Benched(
        0.936,
        0.02,
        ["experiment=cnn_fsdd", "data.split=speaker"],
        "docs/audio.md",
        splits=SPEAKERS,
    ),
    "ast/fsdd_small": Benched(
        0.921,  # three seeds (docs/audio.md)
        0.02,
        ["experiment=ast_fsdd", "data.split=speaker", f"model.teacher={TEACHER}"],
        "docs/audio.md",
        splits=SPEAKERS,
        after="cnn/fsdd_small",
    ),
    # masked-LM pre-training on the speakers' corpus (the task's prep writes it), then the
    # mean test accuracy of three fine-tunings from it, as bench/bert_speakers.py runs them
    "bert/text": Benched(
        3.14,
        0.05,
        ["experiment=bert_pretrain_speakers"],
        "docs/bert.md",
        "val/loss",
        prepare=["data=text_cls"],
    ),
    "bert_cls/text_cls": Benched(
        0.431,
        0.02,
        [
            "experiment=bert_finetune_speakers",
            "model.pretrained={runs}/bert__text-README/checkpoints/last.ckpt",
        ],
        "docs/bert.md",
        splits=SEEDS,
        after="bert/text",
    ),
    # chrF of beam 4: the Transformer at 3000 steps beside Marian (bench/translation_peer.py,
    # post-norm), the GRU with attention at 2500 (bench/translation.py) in the same recipe
    "seq2seq/translation": Benched(
        56.1, 2.0, ["experiment=translation_nld"], "docs/translation.md"
    ),
    "rnn_seq2seq/translation": Benched(
        39.2,
        2.0,
        ["experiment=translation_nld", "model/net=rnn", "model.net.attention=true"],
        "docs/translation.md",
    ),
    # nanoGPT's baby GPT: the val loss at 2000 steps (its recipe has no test split)
    "gpt/shakespeare": Benched(
        1.8995, 0.02, ["experiment=gpt_shakespeare_char"], "docs/gpt.md", "val/loss"
    ),
}


AGGRS = ("sum", "mean", "max", "min", "symmetric", "mlp")
# Three splits where one test split is a handful of examples, so that one node or graph is not
# the verdict: the karate club tests 20 nodes (one is 5 points), a MUTAG fold 19 graphs
SPLITS = {
    "karate": tuple(f"data.split_seed={k}" for k in range(3)),
    "tudataset": tuple(f"data.fold={k}" for k in range(3)),
}
GNNS = ["gcn", "gat", "gin", *(f"mpnn-{a}" for a in AGGRS), "graphnet", "egnn"]


def gnn(model: str, data: str, metric: str, *extra: str, steps: int = 300) -> Pair:
    name, _, aggr = model.partition("-")
    overrides = [f"model.net.aggr={aggr}"] if aggr else []
    refused = name == "egnn" and data != "esol"  # EGNN needs node coordinates
    task = next((o.split("=")[1] for o in extra if o.startswith("task=")), "")
    label = f"{model}/{data}" + (f" ({task})" if task else "")  # gcn/planetoid (link)
    return Pair(name, data, metric, [*overrides, *extra], steps, label, refused,
                splits=SPLITS.get(data, ()))  # fmt: skip


def folder(label: str) -> str:
    """The run folder of a pair, under --out."""
    return label.replace("/", "__").replace(" ", "_").replace("(", "").replace(")", "")


# Masked-LM pre-training learns from the 15 % of tokens it masks, a causal LM from every token:
# BERT's budget is GPT's in tokens under the loss, 2000 steps x 15 % ~ 300 of GPT's (~6 min on 2
# cores). At 200 steps it is still at the unigram's loss (6.45 against 6.65 on data=text).
MLM_STEPS = 2000

# a user's own files (user_files): pre-train on the text, fine-tune on the CSV
YOUR_TEXT = Pair(
    "bert",
    "text",
    "test/loss",
    ["data.path={user}/corpus.txt", "data.vocab_size=2048", "trainer.limit_val_batches=20"],
    MLM_STEPS,
    "bert/your-text",
)


def fine_tune(rank: int) -> Pair:
    """bert_cls on the user's CSV from the encoder pre-trained on their text (rank > 0: LoRA)."""
    ckpt = f"{{runs}}/{folder(YOUR_TEXT.label)}/checkpoints/last.ckpt"
    overrides = [
        "data.path={user}/speakers.csv",
        f"model.pretrained={ckpt}",
        f"model.lora.rank={rank}",
    ]
    name = "bert_cls/your-csv" + (f" (LoRA {rank})" if rank else "")
    return Pair("bert_cls", "text_cls", "test/acc", overrides, 200, name, after=YOUR_TEXT.label)


PAIRS = [
    *(gnn(m, "karate", "test/acc", steps=100) for m in GNNS),
    *(gnn(m, "planetoid", "test/acc", steps=200) for m in GNNS),
    gnn("gcn", "planetoid", "test/auroc", "task=link", steps=100),
    *(gnn(m, "tudataset", "test/acc", steps=300) for m in GNNS),
    *(gnn(m, "esol", "test/rmse", steps=300) for m in ("gcn", "gin", "graphnet", "egnn")),
    Pair("gpt", "text", "test/loss", ["trainer.limit_val_batches=20"], 200),
    Pair("gpt", "shakespeare", "test/loss", ["trainer.limit_val_batches=20"], 300),
    Pair("gpt", "text8", "test/loss", ["trainer.limit_val_batches=20"], 300),
    *(
        Pair(m, d, "test/loss", ["trainer.limit_val_batches=20"], steps)
        for m, steps in (("rnn_lm", 300), ("ngram", 1))
        for d in ("text", "shakespeare")
    ),
    Pair("word2vec", "shakespeare", "test/loss", ["data.tokenizer=word", "data.min_count=5"], 300),
    Pair("bert", "text", "test/loss", ["trainer.limit_val_batches=20"], MLM_STEPS),
    Pair("bert_cls", "text_cls", "test/acc", [], 300),
    Pair("bert_tagger", "text_tag", "test/acc", [], 200),
    Pair("seq2seq", "translation", "test/chrf", [], 300),
    Pair("rnn_seq2seq", "translation", "test/chrf", [], 300),
    *(Pair(m, d, "test/acc", [], 300) for d in ("digits", "mnist") for m in ("vit", "cnn")),
    Pair("imagegpt", "digits", "test/loss", [], 150),
    *(
        Pair(m, "image_folder", "test/acc", ["data.root={user}/pics"], 300, f"{m}/your-images")
        for m in ("vit", "cnn")
    ),
    *(Pair(m, "mnist", "test/loss", [], 300) for m in ("parti", "captioner", "cm3leon")),
    *(Pair(m, "fsdd", "test/acc", [], 300) for m in ("ast", "cnn")),
    Pair("cnn", "fsdd_small", "test/acc", [], 300),
    # the AST's 16 x 16 patches are larger than these 20 x 20 images (experiment=ast_fsdd: 4 x 4)
    Pair("ast", "fsdd_small", "test/acc", [], 300, refused=True),
    Pair("tts", "fsdd", "test/loss", [], 300),
    *(
        Pair(m, "audio", "test/acc", ["data.root={user}/sounds"], 300, f"{m}/your-audio")
        for m in ("ast", "cnn")
    ),
    *(
        Pair(m, "image_hub", "test/acc", ["data.hub={user}/pics.parquet"], 300, f"{m}/your-hub")
        for m in ("vit", "cnn")
    ),
    *(
        Pair(
            m,
            "speech_commands",
            "test/acc",
            ["data.root={user}/commands"],
            300,
            f"{m}/your-commands",
        )
        for m in ("ast", "cnn")
    ),
    YOUR_TEXT,
    fine_tune(rank=0),
    fine_tune(rank=8),
]


def user_files(user: Path, raw_dir: Path = ROOT / "data/raw",
               speakers: tuple = ("jackson", "nicolas"), takes: int = 50) -> None:  # fmt: skip
    """A user's own data, made from tiny Shakespeare (fetched into data/raw, or from the mirror):
    corpus.txt, its first 60 %, and speakers.csv, the 2 most frequent speakers' speeches after;
    pics/<digit>/<n>.png, the 8 x 8 digits as a folder of class folders, and pics.parquet, the
    same as a Hugging Face dataset (an encoded image column and a ClassLabel);
    sounds/<word>/<n>.flac, FSDD's recordings (`takes` of each) of the digits 0-4 by `speakers`
    as stereo FLAC at 16 kHz in folders named by the word (zero, one, ...): other rate, channels
    and format; and commands/, the same recordings in the Speech Commands layout (mono 16 kHz
    WAV named {speaker hash}_nohash_{take}.wav, a noise folder, testing and validation lists
    of every tenth take: two voices are too few to hold one out)."""
    import csv
    import os

    from src.data.sources import fetch
    from src.data.text_cls import shakespeare_speakers

    raw = fetch("tinyshakespeare", raw_dir, os.environ.get("DATA_MIRROR"))
    text = (raw / "input.txt").read_text(encoding="utf-8")
    cut = text.index("\n\n", int(0.6 * len(text))) + 2
    user.mkdir(parents=True, exist_ok=True)
    (user / "corpus.txt").write_text(text[:cut], encoding="utf-8")
    speeches = shakespeare_speakers(text[cut:], num_classes=2)
    with open(user / "speakers.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("text", "label"), *zip(speeches.x, speeches.y, strict=True)])
    from PIL import Image

    from src.data.image_files import read_digits

    digits = read_digits()  # a folder of class folders of PNG files
    images, labels, names = digits.images, digits.labels, digits.classes
    rows = {"image": [], "label": []}
    for i, (img, label) in enumerate(zip(images, labels, strict=True)):
        (user / "pics" / names[label]).mkdir(parents=True, exist_ok=True)
        png = user / "pics" / names[label] / f"{i}.png"
        Image.fromarray(img[0]).save(png)
        rows["image"].append({"bytes": png.read_bytes(), "path": png.name})
        rows["label"].append(int(label))
    import datasets

    features = datasets.Features({"image": datasets.Image(decode=False),
                                  "label": datasets.ClassLabel(names=list(names))})  # fmt: skip
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(user / "pics.parquet"))
    import hashlib

    import librosa
    import soundfile as sf

    fsdd = fetch("fsdd", raw_dir, os.environ.get("DATA_MIRROR")) / "recordings"
    commands = user / "commands"
    lists = {"testing": [], "validation": []}
    for digit, word in enumerate(("zero", "one", "two", "three", "four")):
        (user / "sounds" / word).mkdir(parents=True, exist_ok=True)
        (commands / word).mkdir(parents=True, exist_ok=True)
        for speaker in speakers:
            code = hashlib.sha1(speaker.encode()).hexdigest()[:8]
            for take in range(takes):
                y, sr = sf.read(fsdd / f"{digit}_{speaker}_{take}.wav", dtype="float32")
                y = librosa.resample(y, orig_sr=sr, target_sr=16000)
                sf.write(user / "sounds" / word / f"{speaker}{take}.flac",
                         np.stack([y, 0.5 * y], axis=1), 16000)  # fmt: skip
                name = f"{word}/{code}_nohash_{take}.wav"
                sf.write(commands / name, y, 16000)
                if take % 10 < 2:
                    lists["testing" if take % 10 == 0 else "validation"].append(name)
    (commands / "_background_noise_").mkdir(exist_ok=True)
    noise = np.random.default_rng(0).normal(0, 0.1, 16000 * 3).astype(np.float32)
    sf.write(commands / "_background_noise_" / "white_noise.wav", noise, 16000)
    for kind, files in lists.items():
        (commands / f"{kind}_list.txt").write_text("\n".join(files) + "\n")


def run(pair: Pair, out: Path, extra: list[str] = (), name: str = "", scored: bool = True) -> dict:
    """Train the pair into out/<name or its folder> (with splits, a folder per split:
    data.fold=0 -> fold0, and the metric and baseline averaged over them)."""
    base_dir = out / (name or folder(pair.label))
    if not pair.splits:
        return run_once(pair, out, base_dir, extra, scored)
    results = []
    for split in pair.splits:
        run_dir = base_dir / split.rpartition(".")[2].replace("=", "")
        results.append(run_once(pair, out, run_dir, [*extra, split], scored))
        if "refused" in results[-1]:
            return results[-1]
    values, baselines = ([r[key] for r in results] for key in ("value", "baseline"))
    return {"value": fmean(values) if None not in values else None,
            "baseline": fmean(baselines) if None not in baselines else None,
            "seconds": round(sum(r["seconds"] for r in results), 1), "splits": values}  # fmt: skip


def error_line(proc: subprocess.CompletedProcess) -> str:
    """A failed entry point's one error line (its last `error:` line, else its last line)."""
    lines = proc.stderr.strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors or lines or [f"exit {proc.returncode}"])[-1]


def run_once(pair: Pair, out: Path, run_dir: Path, extra: list[str], scored: bool = True) -> dict:
    """One training run of the pair; its metric, and (scored) its trivial baseline's."""
    overrides = [o.format(user=out / "user", runs=out, split=run_dir.name)
                 for o in pair.overrides]  # fmt: skip
    budget = [f"trainer.max_steps={pair.steps}", "trainer.max_epochs=-1"] if pair.steps else []
    cmd = [sys.executable, "-m", "src.train", f"model={pair.model}", f"data={pair.data}",
           *budget, *QUIET, *overrides, *extra, f"hydra.run.dir={run_dir}"]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"refused": error_line(proc)}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    base = baseline(pair, metrics, run_dir) if scored else None
    return {"value": metrics.get(pair.metric), "baseline": base, "seconds": round(seconds, 1)}


def baseline(pair: Pair, metrics: dict, run_dir: Path) -> float | None:
    kind = pair.metric.split("/")[1]
    if kind in ("acc", "rmse"):
        return metrics.get(f"test/{kind}_{'majority' if kind == 'acc' else 'mean'}")
    if kind == "auroc":
        return 0.5
    if kind == "chrf":  # translation: the source copied
        from src.data.translation import references
        from src.models.seq2seq import corpus_scores

        sources, refs = references(processed_dir(run_dir) / "test.tsv")
        return corpus_scores(sources, refs)["chrf"]
    if pair.model == "word2vec":  # vectors that ignore the words score 0: σ(0) = 1/2 for the
        from omegaconf import OmegaConf  # true context word and each of the S noise words

        return (1 + OmegaConf.load(run_dir / "config.yaml").model.net.negative) * math.log(2)
    targets = ("parti", "captioner", "cm3leon", "tts")  # sequence-to-target models
    streams = code_streams if pair.model == "imagegpt" else (
        pair_targets if pair.model in targets else token_streams)  # fmt: skip
    train, test = streams(run_dir)  # language models: the unigram distribution
    counts = np.bincount(train, minlength=int(max(train.max(), test.max())) + 1) + 1.0
    return float(-np.log(counts[test] / counts.sum()).mean())


def processed_dir(run_dir: Path) -> Path:
    from omegaconf import OmegaConf

    return ROOT / OmegaConf.load(run_dir / "config.yaml").data.processed_dir


def token_streams(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    d = processed_dir(run_dir)
    meta = json.loads((d / "meta.json").read_text())
    return tuple(np.fromfile(d / f"{s}.bin", dtype=meta["dtype"]) for s in ("train", "test"))


def code_streams(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """ImageGPT's tokens: the train and test images' pixel codes."""
    from bench.vision import image_codes

    _, train, test = image_codes(run_dir)
    return train.ravel(), test.ravel()


def pair_targets(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """The tokens the text <-> image and speech models predict: every train and test target,
    its EOS included (a speech sequence's labels that are not IGNORE)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from src.data.translation import EOS_ID, IGNORE

    data = instantiate(OmegaConf.load(run_dir / "config.yaml").data)
    data.setup()

    def predicted(tgt) -> np.ndarray:
        tgt = np.asarray(tgt)
        return tgt[tgt != IGNORE] if (tgt == IGNORE).any() else np.append(tgt, EOS_ID)

    return tuple(np.concatenate([predicted(tgt) for _, tgt in data.splits[s]])
                 for s in ("train", "test"))  # fmt: skip


def clearly_above(metric: str, value: float, base: float) -> bool:
    kind = metric.split("/")[1]
    if kind == "acc":
        return value > base + 0.05
    if kind == "auroc":
        return value > 0.6
    if kind == "chrf":
        return value > base + 10
    return value < 0.9 * base  # rmse, loss


def trails(metric: str, value: float, bench: Benched) -> bool:
    """Whether the README's command falls behind the bench's figure by more than its margin."""
    if metric.split("/")[1] in ("rmse", "loss"):
        return value > bench.figure * (1 + bench.margin)
    return value < bench.figure - bench.margin


def readme_run(pair: Pair, out: Path, extra: list[str]) -> dict:
    """The README's command for a benched pair, at its own budget (steps 0: the config's)."""
    bench = BENCHED[pair.label]
    if bench.prepare:  # a data step that fails is the pair's one line, as a failed run's
        cmd = [sys.executable, "-m", "src.prepare", *bench.prepare, *extra]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            return {"refused": error_line(proc), "bench": bench.figure, "trails": True}
    readme = replace(pair, metric=bench.metric or pair.metric, steps=0,
                     overrides=[*pair.overrides, *bench.command],
                     splits=bench.splits or pair.splits)  # fmt: skip
    r = run(readme, out, extra, f"{folder(pair.label)}-README", scored=False)
    r["bench"] = bench.figure
    r["trails"] = "refused" in r or r["value"] is None or trails(readme.metric, r["value"], bench)
    return r


def strict_column(pairs: list[Pair], out: Path, extra: list[str]) -> dict:
    """The README's command of each benched pair beside its bench's figure."""
    print(f"\n{'pair':<26} {'README command':<24} {'value':>7} {'bench':>7} {'margin':>6}  trails")
    results = {}
    for pair in pairs:
        bench = BENCHED[pair.label]
        r = results[pair.label] = readme_run(pair, out, extra)
        command = " ".join(bench.command) or "(plain)"
        value = r.get("value")
        shown = f"{value:7.3f}" if value is not None else f"{r.get('refused', value)!s:>7}"
        print(f"{pair.label:<26} {command:<24} {shown} {bench.figure:7.3f} {bench.margin:6.2f}  "
              f"{'YES' if r['trails'] else 'no'}", flush=True)  # fmt: skip
    failed = sum(r["trails"] for r in results.values())
    print(f"{len(results) - failed} of {len(results)} README commands within their bench's margin")
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", nargs="+", help="pair labels (model/data) to run")
    p.add_argument("--out", type=Path, default=ROOT / "outputs/bench/matrix")
    p.add_argument("--json", type=Path, help="also write the JSON result here (DVC's metrics)")
    p.add_argument(
        "--strict",
        action="store_true",
        help="also run the README's command of each benched pair against its figure",
    )
    p.add_argument("overrides", nargs="*", help="more key=value for every run")
    args = p.parse_args()
    wanted = set(args.only or [q.label for q in PAIRS])
    wanted |= {q.after for q in PAIRS if q.label in wanted and q.after}
    wanted |= {BENCHED[w].after for w in list(wanted) if w in BENCHED and BENCHED[w].after}
    pairs = [q for q in PAIRS if q.label in wanted]
    out = args.out.resolve()
    if any("{user}" in o for q in pairs for o in q.overrides):
        with report_errors():  # offline without tiny Shakespeare: one line
            user_files(out / "user")
    results = {}
    print(f"{'pair':<26} {'metric':<16} {'value':>7} {'baseline':>8}  above  seconds")
    for pair in pairs:
        r = results[pair.label] = run(pair, out, args.overrides)
        if "refused" in r:
            print(f"{pair.label:<26} refused: {r['refused']}", flush=True)
            continue
        value, base = r["value"], r["baseline"]
        ok = value is not None and base is not None and not math.isnan(value)
        r["above"] = ok and clearly_above(pair.metric, value, base)
        shown = f"{value:7.3f} {base:8.3f}" if ok else f"{value!s:>7} {base!s:>8}"
        print(f"{pair.label:<26} {pair.metric:<16} {shown}  {'yes' if r['above'] else 'NO':<5}  "
              f"{r['seconds']:7.1f}", flush=True)  # fmt: skip
    ran = [r for r in results.values() if "refused" not in r]
    summary = {"bench": "matrix", "pairs": results, "above": sum(r["above"] for r in ran),
               "ran": len(ran), "refused": len(results) - len(ran)}  # fmt: skip
    print(f"{summary['above']} of {summary['ran']} pairs clearly above their baseline, "
          f"{summary['refused']} refused")  # fmt: skip
    if args.strict:
        summary["readme"] = strict_column([q for q in pairs if q.label in BENCHED], out,
                                          args.overrides)  # fmt: skip
    emit_summary(summary, args.json)


if __name__ == "__main__":
    main()
