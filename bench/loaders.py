"""Image collections of two sizes: preparation and loading in bounded memory, and how fast the
loader feeds a GPU, beside a plain ImageFolder-style loader in the same run.

    python -m bench.loaders [--images 50000] [--small 10000] [--batches 40] [--out DIR] [--json F]

Generates a folder of `--images` JPEGs of 256 x 256 in 100 classes (smooth random colour
fields, tinted by class; ~15 kB each) and one of `--small` (kept in --out between runs), then:
  prepare  `python -m src.prepare data=image_folder data.mode=RGB data.root=<folder>` with
           data.num_proc=2: wall time and peak memory of the process tree;
  load     `--batches` training batches of 128 with the ViT/DeiT crops: a random resized crop
           to 224 x 224 and a flip, normalised, with 0, 1 and 2 workers, from
             ours: data=image_folder's loader, prepared uint8 images read with pread;
             peer: an ImageFolder-style Dataset (torchvision's recipe, with Pillow): each JPEG
                   decoded in the worker, then the same crop, flip and normalisation;
           images/s and the peak memory of the process tree (PSS, sampled every 0.1 s).
The GPU's appetite is an estimate, not a measurement: ViT-B/16 training costs ~3 x 17.6 GFLOPs
per 224 x 224 image (forward and backward), so one H200 (989 dense bf16 TFLOP/s) at 40 % MFU
takes ~7,500 images/s. The last line is JSON.
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
GPU_IMAGES_PER_S = 989e12 * 0.4 / (3 * 17.6e9)  # ViT-B/16 on one H200, see above


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


def make_folder(folder: Path, n: int) -> float:
    """`n` JPEGs in `folder` (kept when already there); returns its size in GB."""
    done = folder / ".done"
    if not done.exists() or done.read_text() != str(n):
        shutil.rmtree(folder, ignore_errors=True)
        for k in range(CLASSES):
            (folder / f"c{k:03d}").mkdir(parents=True)
        with mp.get_context("spawn").Pool(2) as pool:
            pool.map(draw, [(folder, s, min(s + 500, n)) for s in range(0, n, 500)])
        done.write_text(str(n))
    return sum(f.stat().st_size for f in folder.rglob("*.jpg")) / 1e9


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


def feed(kind: str, root: Path, processed: Path, workers: int, batches: int) -> None:
    """One loader's run (in its own process, for its memory): prints images/s as JSON."""
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
    it = itertools.chain.from_iterable(loader for _ in itertools.count())  # epoch after epoch
    next(it)  # the workers started, their first batch made
    t0, n = time.perf_counter(), 0
    for _ in range(batches):
        x, _ = next(it)
        n += len(x)
    print(json.dumps({"images_per_s": n / (time.perf_counter() - t0)}))


# --------------------------------------------------------------------------- the run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, help="keep the folders here (default: a temp dir)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--feed", nargs=4, help=argparse.SUPPRESS)  # kind root processed workers
    args = parser.parse_args()
    if args.feed:
        kind, root, processed, workers = args.feed
        feed(kind, Path(root), Path(processed), int(workers), args.batches)
        return

    out = args.out or Path(tempfile.mkdtemp(prefix="loaders-"))
    rows = []
    for n in (args.small, args.images):
        folder, processed = out / f"images{n}", out / f"processed{n}"
        t0 = time.perf_counter()
        gb = make_folder(folder, n)
        print(f"{n:,} JPEGs, {gb:.2f} GB ({time.perf_counter() - t0:.0f} s to make)", flush=True)
        shutil.rmtree(processed, ignore_errors=True)
        prep = measured([sys.executable, "-m", "src.prepare", "data=image_folder",
                         "data.mode=RGB", f"data.root={folder}", "data.num_proc=2",
                         f"data.processed_dir={processed}"])  # fmt: skip
        row = {"images": n, "jpeg_gb": gb, "prepare_s": prep["wall"],
               "prepare_peak_gb": prep["peak_gb"]}  # fmt: skip
        print(f"  prepare: {n / prep['wall']:,.0f} images/s, peak {prep['peak_gb']:.2f} GB",
              flush=True)  # fmt: skip
        for kind in ("ours", "peer"):
            for workers in args.workers:
                feeder = ["--feed", kind, str(folder), str(processed), str(workers)]
                r = measured([sys.executable, "-m", "bench.loaders", "--batches",
                              str(args.batches), *feeder])  # fmt: skip
                rate = json.loads(r["output"].strip().splitlines()[-1])["images_per_s"]
                row[f"{kind}{workers}"] = {"images_per_s": rate, "peak_gb": r["peak_gb"]}
                print(f"  {kind}, {workers} worker(s): {rate:,.0f} images/s, peak "
                      f"{r['peak_gb']:.2f} GB", flush=True)  # fmt: skip
        rows.append(row)
    small, large = rows
    most = max(args.workers)
    ratios = [r[f"ours{w}"]["images_per_s"] / r[f"peer{w}"]["images_per_s"]
              for r in rows for w in args.workers]  # fmt: skip
    checks = {
        "prepare_memory_ratio": large["prepare_peak_gb"] / small["prepare_peak_gb"],
        "load_memory_ratio": large[f"ours{most}"]["peak_gb"] / small[f"ours{most}"]["peak_gb"],
        "vs_peer": min(ratios),
    }
    per_worker = large[f"ours{most}"]["images_per_s"] / max(most, 1)
    print(f"\nViT-B/16 on one H200 eats ~{GPU_IMAGES_PER_S:,.0f} images/s (estimate): about "
          f"{GPU_IMAGES_PER_S / per_worker:.0f} workers at this machine's "
          f"{per_worker:,.0f} images/s each")  # fmt: skip
    targets = {"prepare_memory_ratio": ("<=", 1.2), "load_memory_ratio": ("<=", 1.2),
               "vs_peer": (">=", 1.0)}  # fmt: skip
    for key, (op, target) in targets.items():
        value = checks[key]
        met = value <= target if op == "<=" else value >= target
        print(f"{key}: {value:.2f} against the target {op} {target}: {'met' if met else 'NOT met'}")
    emit_summary({"collections": rows, "checks": checks,
                  "gpu_images_per_s": GPU_IMAGES_PER_S}, args.json)  # fmt: skip
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
