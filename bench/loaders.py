"""Image and audio collections of two sizes: preparation and loading in bounded memory, and how
fast the loader feeds a GPU, beside a plain on-the-fly loader in the same run.

    python -m bench.loaders [--only images|audio] [--images 50000] [--small 10000]
                            [--hours 20] [--small-hours 4] [--batches 40] [--out DIR] [--json F]

Images: a folder of `--images` JPEGs of 256 x 256 in 100 classes (smooth random colour fields,
tinted by class; ~8 kB each) and one of `--small` (kept in --out between runs), then:
  prepare  `python -m src.prepare data=image_folder data.mode=RGB data.root=<folder>` with
           data.num_proc=2: wall time and peak memory of the process tree;
  load     `--batches` training batches of 128 with the ViT/DeiT crops: a random resized crop
           to 224 x 224 and a flip, normalised, with 0, 1 and 2 workers, from
             ours: data=image_folder's loader, prepared uint8 images read with pread;
             peer: an ImageFolder-style Dataset (torchvision's recipe, with Pillow): each JPEG
                   decoded in the worker, then the same crop, flip and normalisation;
           images/s and the peak memory of the process tree (PSS, sampled every 0.1 s).
Audio: a folder of `--hours` of speech-like clips of 1 to 10 s at 16 kHz (16-bit WAV) in 10
class folders, 100 voices (speech_like), and one of `--small-hours`, then:
  prepare  `python -m src.prepare data=audio data.fit=full data.duration=10` at 16 kHz with
           25 ms windows every 10 ms, 64 mel bands, data.num_proc=2;
  load     `--batches` training batches of 32 recordings with SpecAugment's masks, from
             ours: data=audio's loader, log-mels read from disk, batched by length, padded;
             peer: the AST recipe's loader: each WAV decoded (soundfile) and its log-mels
                   computed (librosa, one BLAS thread a process) in the worker, then the same
                   normalisation and masks, random batches padded to their longest;
           seconds of audio/s and the peak memory.
The GPU's appetite is an estimate, not a measurement: ViT-B/16 training costs ~3 x 17.6 GFLOPs
per 224 x 224 image (forward and backward), and AST (ViT-B on 128 mel bands x 1024 frames,
1,212 patches) ~3 x 263 GFLOPs per 10-s clip, so one H200 (989 dense bf16 TFLOP/s) at 40 % MFU
takes ~7,500 images/s or ~5,000 s of audio/s. The last line is JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.prepare_text import measured
from src.utils.summary import emit_summary

ROOT = Path(__file__).resolve().parents[1]
CLASSES, SIDE, CROP, BATCH = 100, 256, 224, 128
H200 = 989e12 * 0.4  # FLOP/s: dense bf16 at 40 % MFU
GPU_IMAGES_PER_S = H200 / (3 * 17.6e9)  # ViT-B/16, see above
# AST: 86 M parameters x 1,212 patches x 2, plus attention 4 x 1,212^2 x 768 x 12 layers
GPU_AUDIO_S_PER_S = 10 * H200 / (3 * (2 * 86e6 * 1212 + 4 * 1212**2 * 768 * 12))
VOICES, WORDS, RATE, CLIPS = 100, 10, 16_000, 32
AUDIO = {"sample_rate": RATE, "duration": 10.0, "fit": "full", "win_length": 400,
         "hop_length": 160, "n_mels": 64, "freq_mask": 8, "time_mask": 20}  # fmt: skip


def draw(job: tuple[Path, int, int]) -> None:
    """Images start..stop of the folder: class k's are tinted by a colour of its own."""
    from PIL import Image

    folder, start, stop = job
    for i in range(start, stop):
        rng, label = np.random.default_rng(i), i % CLASSES
        field = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
        tint = np.random.default_rng(label).integers(0, 256, 3)
        pixels = np.asarray(field.resize((SIDE, SIDE), Image.BICUBIC), np.float32)
        image = (0.6 * pixels + 0.4 * tint).astype(np.uint8)
        path = folder / f"c{label:03d}" / f"{i:06d}.jpg"
        Image.fromarray(image).save(path, quality=90)


def make_collection(folder: Path, n: int, classes: list[str], make, per_job: int) -> float:
    """`n` items in class folders of `folder`, made by make((folder, start, stop)) in 2
    processes (kept when already there); returns the folder's size in GB."""
    done = folder / ".done"
    if not done.exists() or done.read_text() != str(n):
        shutil.rmtree(folder, ignore_errors=True)
        for name in classes:
            (folder / name).mkdir(parents=True)
        with mp.get_context("spawn").Pool(2) as pool:
            pool.map(make, [(folder, s, min(s + per_job, n)) for s in range(0, n, per_job)])
        done.write_text(str(n))
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e9


def make_folder(folder: Path, n: int) -> float:
    """`n` JPEGs in `folder`; returns its size in GB."""
    return make_collection(folder, n, [f"c{k:03d}" for k in range(CLASSES)], draw, 500)


# (F1, F2) Hz of ten vowels
VOWELS = [(730, 1090), (270, 2290), (300, 870), (530, 1840), (660, 1720), (490, 1350),
          (640, 1190), (440, 1020), (400, 1920), (570, 840)]  # fmt: skip


def speech_like(seconds: float, label: int, voice: int, rng: np.random.Generator,
                sample_rate: int = 16_000) -> np.ndarray:  # fmt: skip
    """A clip that a spectrogram model hears as speech: syllables of ~0.2 s, each a harmonic
    source at the voice's pitch (85-255 Hz, with a slow drift) shaped by two formants, cycling
    through the label's three vowels, under a syllable envelope, in light noise. float32 (S,)."""
    n, syllable = int(seconds * sample_rate), int(0.2 * sample_rate)
    f0 = 85 + 17 * (voice % 11) + 10 * np.sin(np.linspace(0, rng.uniform(2, 9), n))  # (S,)
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    harmonics = np.arange(1, 25)[:, None]  # (24, 1)
    out = np.zeros(n, np.float32)
    for k, start in enumerate(range(0, n, syllable)):
        part = slice(start, min(start + syllable, n))
        f1, f2 = VOWELS[(3 * label + k) % 10]
        hz = harmonics * f0[part].mean()  # (24, 1)
        gain = np.exp(-(((hz - f1) / 90) ** 2)) + 0.6 * np.exp(-(((hz - f2) / 120) ** 2))
        wave = (gain / harmonics * np.sin(harmonics * phase[part])).sum(0)
        out[part] = wave * np.hanning(part.stop - start)
    out += rng.normal(0, 0.01, n)
    return (0.5 * out / (np.abs(out).max() + 1e-8)).astype(np.float32)


def clip_seconds(i: int) -> float:
    return float(np.random.default_rng(i).uniform(1, 10))


def speak(job: tuple[Path, int, int]) -> None:
    """Clips start..stop of the folder: clip i says word i % 10 in voice i % 100."""
    import soundfile as sf

    folder, start, stop = job
    for i in range(start, stop):
        label, voice = i % WORDS, (i // WORDS) % VOICES
        y = speech_like(clip_seconds(i), label, voice, np.random.default_rng(i), RATE)
        sf.write(folder / f"word{label}" / f"{voice:03d}_{i:06d}.wav", y, RATE, subtype="PCM_16")


def make_clips(folder: Path, hours: float) -> tuple[int, float]:
    """Clips of `hours` in `folder`; returns (clips, size in GB)."""
    n = int(np.searchsorted(np.cumsum([clip_seconds(i) for i in range(int(hours * 800))]),
                            hours * 3600)) + 1  # fmt: skip
    return n, make_collection(folder, n, [f"word{k}" for k in range(WORDS)], speak, 200)


# --------------------------------------------------------------------------- the loaders


class FolderImages:
    """The peer: torchvision's ImageFolder recipe with Pillow, each image decoded in the worker
    that asks for it, then RandomResizedCrop(224), a flip, ToTensor and Normalize."""

    def __init__(self, root: Path, mean, std):
        self.files = sorted(root.rglob("*.jpg"))
        self.labels = [int(f.parent.name[1:]) for f in self.files]
        self.mean = np.asarray(mean, np.float32)[:, None, None]
        self.std = np.asarray(std, np.float32)[:, None, None]
        self.rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        import torch
        from PIL import Image

        from src.data.images import crop_box

        with Image.open(self.files[i]) as im:
            im = im.convert("RGB")
            top, left, h, w = crop_box(im.height, im.width, (0.08, 1.0), (3 / 4, 4 / 3), self.rng)
            im = im.resize((CROP, CROP), Image.BILINEAR, box=(left, top, left + w, top + h))
        if self.rng.random() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        x = np.asarray(im, np.float32).transpose(2, 0, 1)  # (3, H, W)
        return torch.from_numpy((x - self.mean) / self.std), self.labels[i]


def endless(loader, workers: int):
    """Batches epoch after epoch, timed from after each worker's first (started, warmed up)."""
    it = itertools.chain.from_iterable(loader for _ in itertools.count())
    for _ in range(max(workers, 1)):
        next(it)
    return it


def feed_images(kind: str, root: Path, processed: Path, workers: int, batches: int) -> None:
    """One image loader's run (in its own process, for its memory): prints images/s as JSON."""
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    from src.data.images import ImageDataModule

    dm = ImageDataModule(str(processed), source="folder", root=str(root), mode="RGB",
                         crop=[CROP, CROP], flip=True, shift=0, batch_size=BATCH,
                         num_workers=workers)  # fmt: skip
    dm.setup()
    if kind == "ours":
        loader = dm.train_dataloader()
    else:
        data = FolderImages(root, dm.meta["mean"], dm.meta["std"])
        loader = DataLoader(data, BATCH, shuffle=True, num_workers=workers,
                            generator=torch.Generator().manual_seed(0))  # fmt: skip
    it = endless(loader, workers)
    t0, n = time.perf_counter(), 0
    for _ in range(batches):
        x, _ = next(it)
        n += len(x)
    print(json.dumps({"rate": n / (time.perf_counter() - t0)}))


class FolderClips:
    """The peer: the AST recipe's loader, each WAV decoded (soundfile) and its log-mels computed
    (librosa) in the worker that asks for it, normalised, with SpecAugment's masks."""

    def __init__(self, root: Path, mean: float, std: float, classes: list[str]):
        self.files = sorted(root.rglob("*.wav"))
        self.labels = [classes.index(f.parent.name) for f in self.files]
        self.mean, self.std = mean, std
        self.rng = np.random.default_rng(0)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        import librosa
        import soundfile as sf
        import torch

        y, _ = sf.read(self.files[i], dtype="float32")
        mel = librosa.feature.melspectrogram(
            y=y[: int(AUDIO["duration"] * RATE)], sr=RATE, n_fft=512, n_mels=AUDIO["n_mels"],
            win_length=AUDIO["win_length"], hop_length=AUDIO["hop_length"],
        )  # fmt: skip
        db = librosa.power_to_db(mel, ref=np.max, amin=1e-10, top_db=80.0)
        x = torch.from_numpy((db - self.mean) / self.std).float()  # (n_mels, L)
        for axis, width in enumerate((AUDIO["freq_mask"], AUDIO["time_mask"])):
            w = int(self.rng.integers(0, width + 1))
            x.narrow(axis, int(self.rng.integers(0, x.shape[axis] - w + 1)), w).zero_()
        return x[None], self.labels[i]


def one_blas_thread(worker: int) -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def feed_audio(kind: str, root: Path, processed: Path, workers: int, batches: int) -> None:
    """One audio loader's run: prints seconds of audio delivered per second as JSON."""
    import torch
    from threadpoolctl import threadpool_limits
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    threadpool_limits(1)  # librosa's BLAS: one thread a process, as in ours's preparation
    from src.data.audio import AudioDataModule
    from src.data.spectrograms import collate_lengths

    dm = AudioDataModule(str(processed), root=str(root), batch_size=CLIPS, num_workers=workers,
                         **AUDIO)  # fmt: skip
    dm.setup()
    if kind == "ours":
        loader = dm.train_dataloader()
    else:
        data = FolderClips(root, dm.mean, dm.std, dm.classes)
        loader = DataLoader(data, CLIPS, shuffle=True, num_workers=workers,
                            collate_fn=collate_lengths, worker_init_fn=one_blas_thread,
                            generator=torch.Generator().manual_seed(0))  # fmt: skip
    it = endless(loader, workers)
    t0, frames = time.perf_counter(), 0
    for _ in range(batches):
        _, _, lengths = next(it)
        frames += int(lengths.sum())
    seconds = frames * AUDIO["hop_length"] / RATE
    print(json.dumps({"rate": seconds / (time.perf_counter() - t0)}))


# --------------------------------------------------------------------------- the run


def collection(kind: str, n: float, out: Path, args) -> dict:
    """Make one collection, prepare it and time both loaders on it: its row of the table."""
    folder, processed = out / f"{kind}{n:g}", out / f"processed-{kind}{n:g}"
    t0 = time.perf_counter()
    if kind == "images":
        items, gb = n, make_folder(folder, n)
        prepare = ["data=image_folder", "data.mode=RGB"]
        print(f"{n:,} JPEGs, {gb:.2f} GB", end="")
    else:
        (items, gb), hours = make_clips(folder, n), n
        prepare = ["data=audio", *(f"data.{k}={v}" for k, v in AUDIO.items() if "mask" not in k)]
        print(f"{hours:g} h of speech in {items:,} clips, {gb:.2f} GB", end="")
    print(f" ({time.perf_counter() - t0:.0f} s to make)", flush=True)
    shutil.rmtree(processed, ignore_errors=True)
    prep = measured([sys.executable, "-m", "src.prepare", *prepare, f"data.root={folder}",
                     "data.num_proc=2", f"data.processed_dir={processed}"])  # fmt: skip
    row = {"items": items, "gb": gb, "prepare_s": prep["wall"], "prepare_peak_gb": prep["peak_gb"]}
    unit = "images" if kind == "images" else "s of audio"
    size = n if kind == "images" else n * 3600
    print(f"  prepare: {size / prep['wall']:,.0f} {unit}/s, peak {prep['peak_gb']:.2f} GB",
          flush=True)  # fmt: skip
    for who in ("ours", "peer"):
        for workers in args.workers:
            feeder = ["--feed", kind, who, str(folder), str(processed), str(workers)]
            r = measured([sys.executable, "-m", "bench.loaders", "--batches",
                          str(args.batches), *feeder])  # fmt: skip
            rate = json.loads(r["output"].strip().splitlines()[-1])["rate"]
            row[f"{who}{workers}"] = {"rate": rate, "peak_gb": r["peak_gb"]}
            print(f"  {who}, {workers} worker(s): {rate:,.0f} {unit}/s, peak "
                  f"{r['peak_gb']:.2f} GB", flush=True)  # fmt: skip
    return row


def checks(rows: list[dict], workers: list[int]) -> dict:
    """The issue's goals: memory of the large collection against the small one's, ours against
    the peer with the same workers."""
    small, large = rows
    most = max(workers)
    ratios = [r[f"ours{w}"]["rate"] / r[f"peer{w}"]["rate"] for r in rows for w in workers]
    return {
        "prepare_memory_ratio": large["prepare_peak_gb"] / small["prepare_peak_gb"],
        "load_memory_ratio": large[f"ours{most}"]["peak_gb"] / small[f"ours{most}"]["peak_gb"],
        "vs_peer": min(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["images", "audio"])
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--hours", type=float, default=20.0)
    parser.add_argument("--small-hours", type=float, default=4.0)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, help="keep the folders here (default: a temp dir)")
    parser.add_argument("--json", type=Path)
    # modality kind root processed workers
    parser.add_argument("--feed", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.feed:
        modality, kind, root, processed, workers = args.feed
        feed = feed_images if modality == "images" else feed_audio
        feed(kind, Path(root), Path(processed), int(workers), args.batches)
        return

    out = args.out or Path(tempfile.mkdtemp(prefix="loaders-"))
    sizes = {"images": (args.small, args.images), "audio": (args.small_hours, args.hours)}
    appetite = {"images": (GPU_IMAGES_PER_S, "ViT-B/16", "images"),
                "audio": (GPU_AUDIO_S_PER_S, "AST", "s of audio")}  # fmt: skip
    targets = {"prepare_memory_ratio": ("<=", 1.2), "load_memory_ratio": ("<=", 1.2),
               "vs_peer": (">=", 1.0)}  # fmt: skip
    summary = {}
    for kind in [args.only] if args.only else ["images", "audio"]:
        rows = [collection(kind, n, out, args) for n in sizes[kind]]
        summary[kind] = {"collections": rows, "checks": checks(rows, args.workers)}
        gpu, model, unit = appetite[kind]
        per_worker = rows[1][f"ours{max(args.workers)}"]["rate"] / max(max(args.workers), 1)
        print(f"\n{model} on one H200 eats ~{gpu:,.0f} {unit}/s (estimate): about "
              f"{gpu / per_worker:.1f} workers at this machine's {per_worker:,.0f} {unit}/s "
              "each")  # fmt: skip
        for key, (op, target) in targets.items():
            value = summary[kind]["checks"][key]
            met = value <= target if op == "<=" else value >= target
            print(f"{kind} {key}: {value:.2f} against the target {op} {target}: "
                  f"{'met' if met else 'NOT met'}")  # fmt: skip
        summary[kind]["gpu_per_s"] = gpu
    emit_summary(summary, args.json)
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
