"""Labelled images for the vision models (Bishop 12.4.1): one data module, several readers, no
torchvision (it does not install beside the pinned CPU torch).

Sources (`source`):
  digits   scikit-learn's 8 x 8 handwritten digits (1,797 images, always installed): the default
  mnist    MNIST's IDX files, `{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]` in `root` (MNIST,
           Fashion-MNIST, Kannada-MNIST, ... share the format); without `root`, MNIST fetched once
  cifar10  CIFAR-10's python batches (`cifar-10-batches-py/` in `root`, or fetched once)
  folder   `root/<class>/*.png|jpg|...`: any images in class sub-folders, read with Pillow,
           converted to `mode` (L or RGB)
  hub      a Hugging Face dataset with an image column (`hub`: a Hub name, a saved dataset's
           folder or Parquet / JSON Lines files; `image_column`, `label_column`): its own
           splits, those it lacks drawn from train (src.data.hub_media)
With `image_size=[H, W]`, every source's images are resized to H x W (Pillow, bilinear with
antialiasing): a folder's images of mixed sizes, or smaller images for a shorter ImageGPT window.

Preparation (the DVC stage `prepare_images`, or the first run; skipped while the settings
fingerprint in meta.json matches):
  the reader's images as uint8 (N, C, H, W) and their labels -> splits: a source's own test set
  stays the test set and val is a seeded stratified share of its train set; a source of one set
  (digits, a folder, MNIST's t10k files alone) is split train/val/test by `splits`, seeded and
  stratified -> per-channel mean and std of the train images -> written atomically into
  `processed_dir`:

    {split}_x.npy   uint8 images (N, C, H, W), read as memory maps
    {split}_y.npy   int64 labels (N,)
    meta.json       classes, image size, channels, mean, std, counts per split

Each split's images are decoded `chunk` at a time (a folder's by `num_proc` processes) and
written to its memmap as they come: memory is set by those two settings, never by the number of
images, and the loaders read from disk (under DDP, each rank its own share).

Batches are (x, y): x (B, C, H, W) float, normalised with the train statistics. Training images
are augmented as configured (see Augment): in the loader's workers, on uint8 pixels, a random
resized crop to `crop` (eval images are centre-cropped to it), a left-right `flip`, a `shift` of
up to a few pixels (what small digits need); on the device, a batch at a time,
`trivial_augment`. Mixup and CutMix mix examples and labels: they are the model's (model.mixup,
model.cutmix).

With `codes=K` (set by model=imagegpt) the images are token sequences instead, ImageGPT's: a
codebook of K colours (intensities, for grey images) learnt by k-means over a bounded sample of
the train pixels (vector quantisation), every pixel replaced by its nearest code, in raster
order, written chunk by chunk beside the images (`<processed_dir>-codes{K}/`: codebook.npy,
{split}_codes.npy; the DVC stage `prepare_patches`) and read from disk. Batches are then (x, y)
of shape (B, H W): y the codes, x the start token K followed by y[:-1], as a language model
reads text. With `patch=P` the codebook's vectors are P x P patches (Parti's image tokens) and an
image is H/P x W/P codes.

With `captions` as well (set by model=parti | captioner | cm3leon) every image of a digit becomes
a pair of caption and codes for an encoder-decoder (src.data.captions): text -> image, image ->
text or both, batched as the translation pairs are.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset

from src.data import vq
from src.data.arrays import NpyWriter, Rows
from src.data.captions import DIRECTIONS, CaptionPairs, CaptionVocab, caption, ink, ink_terciles
from src.data.image_files import (
    ImageSet,
    decode_chunk,
    read_cifar10,
    read_digits,
    read_folder,
    read_hub,
    read_mnist,
)
from src.data.parallel import Progress, in_order
from src.data.sources import data_root
from src.data.text import SPLITS, SplitLoaders
from src.data.translation import collate_pairs
from src.nn.patch import patchify, unpatchify
from src.utils.errors import PipelineError
from src.utils.files import atomic_dir

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the processed layout changes


# --------------------------------------------------------------------------- codebook


def fit_codebook(images: np.ndarray, k: int, seed: int, patch: int = 1,
                 sample: int = 200_000) -> np.ndarray:  # fmt: skip
    """k-means over the P x P patches of uint8 images (N, C, H, W), read in [0, 1], of as many
    random images as give `sample` patches -> the K centroids (K, C P P), darkest first (P = 1:
    colours, ImageGPT's palette)."""
    per_image = images[0, 0].size // patch**2
    n = min(len(images), -(-sample // per_image))
    rows = np.sort(np.random.default_rng(seed).choice(len(images), n, replace=False))
    x = patch_vectors(images[rows], patch)  # (n, H/P W/P, C P P)
    return vq.fit_codebook(x.reshape(-1, x.shape[-1]), k, seed)


def patch_vectors(images: np.ndarray, patch: int) -> np.ndarray:
    """uint8 images (N, C, H, W) -> (N, H/P W/P, C P P) float32 in [0, 1], raster order."""
    return patchify(torch.from_numpy(np.asarray(images, dtype=np.float32) / 255), patch).numpy()


def quantize(images: np.ndarray, codebook: np.ndarray, patch: int = 1) -> np.ndarray:
    """uint8 images (N, C, H, W) -> codes (N, H/P W/P): each patch's nearest centroid, in raster
    order."""
    return np.concatenate([vq.encode(patch_vectors(images[i : i + 1024], patch), codebook)
                           for i in range(0, len(images), 1024)])  # fmt: skip


def dequantize(codes: torch.Tensor, codebook: torch.Tensor, image_size,
               patch: int = 1) -> torch.Tensor:  # fmt: skip
    """codes (N, H/P W/P) -> images (N, C, H, W) in [0, 1]: every patch its centroid."""
    return unpatchify(vq.decode(codes, codebook), tuple(image_size), patch)


# --------------------------------------------------------------------------- splits


def stratified_split(y: np.ndarray, fractions, seed: int) -> list[np.ndarray]:
    """Indices of len(fractions) parts, each holding every class in proportion (seeded)."""
    rng = np.random.default_rng(seed)
    parts = [[] for _ in fractions]
    bounds = np.cumsum(fractions)[:-1] / np.sum(fractions)
    for c in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == c))
        cuts = np.round(bounds * len(members)).astype(int)
        for part, chunk in zip(parts, np.split(members, cuts), strict=True):
            part.append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


@dataclass
class Augment:
    """What a training image goes through in a loader's worker, on its uint8 pixels: a random
    resized crop to `crop` (H, W) covering a share of the image's area within `scale` and of
    aspect ratio within `ratio` (Inception's and ViT's RandomResizedCrop), a left-right flip with
    probability 1/2, a shift by up to `shift` pixels each way (zeros come in at the border).
    Images outside training are centre-cropped to `crop`."""

    crop: tuple[int, int] | None = None
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    shift: int = 0


def crop_box(h: int, w: int, scale, ratio, rng: np.random.Generator) -> tuple[int, ...]:
    """(top, left, height, width) of a random crop of an h x w image: area share ~ U(scale),
    log aspect ratio ~ U(log ratio), redrawn until it fits (10 tries, then the whole image)."""
    for _ in range(10):
        area = h * w * rng.uniform(*scale)
        aspect = np.exp(rng.uniform(*np.log(ratio)))
        ch, cw = round(np.sqrt(area / aspect)), round(np.sqrt(area * aspect))
        if 0 < ch <= h and 0 < cw <= w:
            return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw
    return 0, 0, h, w


def resized_crop(img: np.ndarray, box: tuple[int, ...], size: tuple[int, int]) -> np.ndarray:
    """uint8 (C, H, W) -> the box (top, left, height, width) resized to size, (C, *size): one
    Pillow resample per channel (bilinear, antialiased)."""
    from PIL import Image

    top, left, ch, cw = box
    if (ch, cw) == tuple(size):
        return img[:, top : top + ch, left : left + cw]
    return np.stack([np.asarray(Image.fromarray(plane).resize(
        (size[1], size[0]), Image.BILINEAR, box=(left, top, left + cw, top + ch)))
        for plane in img])  # fmt: skip


class ImageSplit(Dataset):
    """One split's uint8 images (read from disk, image by image, by Rows) as float tensors
    normalised by the train mean and std, augmented (`augment`) when `train`."""

    def __init__(self, x: np.ndarray, y: np.ndarray, mean, std, augment: Augment | None = None,
                 train: bool = False, seed: int = 0):  # fmt: skip
        self.x, self.y, self.train = x, y, train
        self.augment = augment or Augment()
        self.mean = torch.tensor(mean, dtype=torch.float32)[:, None, None]  # (C, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32)[:, None, None]
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        a, img = self.augment, np.asarray(self.x[i])  # (C, H, W) uint8
        h, w = img.shape[1:]
        if a.crop and self.train:
            img = resized_crop(img, crop_box(h, w, a.scale, a.ratio, self.rng), a.crop)
        elif a.crop:
            ch, cw = a.crop
            img = img[:, (h - ch) // 2 : (h - ch) // 2 + ch, (w - cw) // 2 : (w - cw) // 2 + cw]
        if a.flip and self.train and self.rng.random() < 0.5:
            img = img[:, :, ::-1]
        x = torch.from_numpy(np.array(img, dtype=np.float32))  # (C, H, W)
        if a.shift and self.train:
            s = a.shift
            dy, dx = self.rng.integers(-s, s + 1, size=2)
            padded = torch.nn.functional.pad(x, (s, s, s, s))
            h, w = x.shape[1:]
            x = padded[:, s + dy : s + dy + h, s + dx : s + dx + w]
        return (x - self.mean) / self.std, int(self.y[i])


class TokenImages(Dataset):
    """One split's images as ImageGPT's token sequences: (x, y), y the codes (H W,), x the start
    token followed by y[:-1]; codes (N, H W) read from their memmap."""

    def __init__(self, codes: np.ndarray, start: int):
        self.codes, self.start = codes, start

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.from_numpy(self.codes[i].astype(np.int64))
        return torch.cat([y.new_tensor([self.start]), y[:-1]]), y


class ImageDataModule(SplitLoaders, pl.LightningDataModule):
    """Images and class labels from one of the readers above (see the module docstring)."""

    def __init__(
        self,
        processed_dir: str,
        source: str = "digits",
        name: str | None = None,
        root: str | None = None,
        raw_dir: str = "data/raw",
        mirror: str | None = None,
        hub: str | None = None,
        hub_config: str | None = None,
        image_column: str = "image",
        label_column: str = "label",
        mode: str = "L",
        image_size: tuple[int, int] | None = None,
        splits: tuple[float, float, float] = (0.8, 0.1, 0.1),
        split_seed: int = 0,
        train_fraction: float = 1.0,
        shift: int = 0,
        crop: tuple[int, int] | None = None,
        crop_scale: tuple[float, float] = (0.08, 1.0),
        flip: bool = False,
        trivial_augment: bool = False,
        num_proc: int | None = None,
        chunk: int = 256,
        codes: int | None = None,
        patch: int = 1,
        captions: str | None = None,
        batch_size: int = 128,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__()
        if source not in ("digits", "mnist", "cifar10", "folder", "hub"):
            raise PipelineError(f"data.source={source!r}: choose digits, mnist, cifar10, folder "
                                "or hub")  # fmt: skip
        if source == "folder" and root is None:
            raise PipelineError("data.source=folder needs data.root=<folder of class folders>")
        if source == "hub" and hub is None:
            raise PipelineError("data.source=hub needs data.hub=<Hub name, saved dataset folder "
                                "or Parquet file>")  # fmt: skip
        if abs(sum(splits) - 1) > 1e-6 or min(splits) <= 0:
            raise PipelineError(f"data.splits={list(splits)} must be positive and sum to 1")
        if not 0 < train_fraction <= 1:
            raise PipelineError(f"data.train_fraction={train_fraction} must be in (0, 1]")
        if not 0 < crop_scale[0] <= crop_scale[1] <= 1:
            raise PipelineError(f"data.crop_scale={list(crop_scale)}: shares of the image's "
                                "area, 0 < low <= high <= 1")  # fmt: skip
        if (crop or flip or trivial_augment) and codes:
            raise PipelineError("data.crop, flip and trivial_augment are for classifiers; "
                                "ImageGPT's tokens (data.codes) are not augmented")  # fmt: skip
        if codes is not None and not 1 < codes <= 2**16:
            raise PipelineError(f"data.codes={codes}: a codebook of 2 to 65,536 codes (uint16)")
        if captions is not None and (captions not in DIRECTIONS or not codes):
            raise PipelineError(f"data.captions={captions!r}: choose {', '.join(DIRECTIONS)}, "
                                "with data.codes=K")  # fmt: skip
        self.save_hyperparameters(logger=False)
        self.processed_dir = Path(processed_dir)
        self.splits: dict[str, Dataset] = {}
        self._trivial = None

    # -- preparation
    def _settings(self) -> dict:
        hp = self.hparams
        root = Path(hp.root).expanduser().resolve() if hp.root else None
        hub = None
        if hp.source == "hub":
            local = Path(hp.hub).expanduser()
            hub = [str(local.resolve()) if local.exists() else hp.hub, hp.hub_config,
                   hp.image_column, hp.label_column]  # fmt: skip
        return {"format": FORMAT, "source": hp.source, "root": str(root), "hub": hub,
                "mode": hp.mode,
                "image_size": list(hp.image_size) if hp.image_size else None,
                "splits": list(hp.splits), "split_seed": hp.split_seed}  # fmt: skip

    def _root(self, dataset: str) -> Path:
        hp = self.hparams
        return data_root(hp.root, dataset, hp.raw_dir, hp.mirror)

    def _read(self) -> dict[str, tuple[ImageSet, np.ndarray]]:
        """Each split's source (not yet decoded) and its rows in it."""
        hp = self.hparams
        if hp.source == "digits":
            test, train = read_digits(), None
        elif hp.source == "mnist":
            test, train = read_mnist(self._root("mnist"))
        elif hp.source == "cifar10":
            test, train = read_cifar10(self._root("cifar10"))
        elif hp.source == "folder":
            test, train = read_folder(self._root("folder"), hp.mode), None
        else:
            sets = read_hub(hp.hub, hp.hub_config, hp.image_column, hp.label_column, hp.mode)
            if len(sets) == 3:  # its own train, val and test
                return {s: (sets[s], np.arange(len(sets[s].labels))) for s in SPLITS}
            train, test = sets.pop("train", None), sets.popitem()[1] if sets else None
            if test is None:
                test, train = train, None
        if train is None:  # one set: split it three ways
            parts = stratified_split(test.labels, hp.splits, hp.split_seed)
            return {s: (test, p) for s, p in zip(SPLITS, parts, strict=True)}
        # its own test set; val a share of train, as large relative to train as in splits
        share = hp.splits[1] / (hp.splits[0] + hp.splits[1])
        fit, val = stratified_split(train.labels, (1 - share, share), hp.split_seed)
        return {"train": (train, fit), "val": (train, val),
                "test": (test, np.arange(len(test.labels)))}  # fmt: skip

    def prepare_data(self) -> None:
        settings = self._settings()
        meta_file = self.processed_dir / "meta.json"
        if not meta_file.exists() or json.loads(meta_file.read_text()).get("settings") != settings:
            self._prepare_images(settings)
        if self.hparams.codes:
            self._prepare_patches()

    def _prepare_patches(self) -> None:
        """The image-patches stage (DVC's prepare_patches), into its own folder (codes_dir): a
        codebook of K P x P patches fitted by k-means on a bounded sample of the train images
        (200,000 patches), then every split's images quantised `chunk` at a time into a memmap
        of their codes, uint16 (N, H/P W/P) in raster order. Redone when the images were."""
        hp = self.hparams
        stamp = {"images": self.meta["settings"], "codes": hp.codes, "patch": hp.patch,
                 "seed": hp.split_seed}  # fmt: skip
        done = self.codes_dir / "meta.json"
        if done.exists() and json.loads(done.read_text()) == stamp:
            return
        with atomic_dir(self.codes_dir) as tmp:
            train = np.load(self.processed_dir / "train_x.npy", mmap_mode="r")
            codebook = fit_codebook(train, hp.codes, hp.split_seed, hp.patch)
            np.save(tmp / "codebook.npy", codebook)
            for split in SPLITS:
                x = Rows(self.processed_dir / f"{split}_x.npy")  # (N, C, H, W), chunk by chunk
                grid = (x.shape[1] // hp.patch) * (x.shape[2] // hp.patch)
                with NpyWriter(tmp / f"{split}_codes.npy", np.uint16, (len(x), grid)) as codes:
                    for i in range(0, len(x), hp.chunk):
                        k = min(hp.chunk, len(x) - i)
                        codes.write(quantize(x.read(i, k), codebook, hp.patch))
            (tmp / "meta.json").write_text(json.dumps(stamp, indent=1) + "\n")
        log.info("image patches: %d codes of %dx%d pixels -> %s", hp.codes, hp.patch, hp.patch,
                 self.codes_dir)  # fmt: skip

    @property
    def codes_dir(self) -> Path:
        """The codebook and codes of data.codes=K, data.patch=P, beside the images' folder."""
        hp = self.hparams
        patch = f"-p{hp.patch}" if hp.patch > 1 else ""  # P x P patches; pixels: no suffix
        return self.processed_dir.with_name(f"{self.processed_dir.name}-codes{hp.codes}{patch}")

    @property
    def codebook(self) -> torch.Tensor:
        """(K, C P P) centroids in [0, 1] (with data.codes=K, data.patch=P)."""
        return torch.from_numpy(np.load(self.codes_dir / "codebook.npy"))

    def _prepare_images(self, settings: dict) -> None:
        """Every split's images decoded `chunk` at a time (a folder's by num_proc processes) and
        written to its memmap as they come, the train split's pixel histogram counted on the way:
        memory is set by chunk and num_proc, not by the number of images."""
        hp = self.hparams
        parts = self._read()
        size = tuple(hp.image_size) if hp.image_size else None
        c, h, w = parts["train"][0].shape(size)
        total = sum(len(rows) for _, rows in parts.values())
        num_proc = hp.num_proc or os.cpu_count() or 1
        if parts["train"][0].decoded or total < 2 * hp.chunk:
            num_proc = 1  # arrays already in memory, or too few files to pay for processes
        counts = np.zeros((c, 256), np.int64)  # the train split's pixel values, per channel
        with atomic_dir(self.processed_dir) as tmp:
            out = {s: NpyWriter(tmp / f"{s}_x.npy", np.uint8, (len(rows), c, h, w))
                   for s, (_, rows) in parts.items()}  # fmt: skip
            where = []  # the split of each job handed out, in order

            def jobs():
                for split, (images, rows) in parts.items():
                    for job in images.jobs(rows, size, hp.chunk):
                        where.append(split)
                        yield job

            progress = Progress(total, "decoding images", "images", 1)
            for k, chunk in enumerate(in_order(decode_chunk, jobs(), num_proc,
                                               preload="src.data.image_files")):  # fmt: skip
                split = where[k]
                out[split].write(chunk)
                if split == "train":
                    for channel in range(c):
                        counts[channel] += np.bincount(chunk[:, channel].ravel(), minlength=256)
                progress.update(len(chunk))
            progress.close()
            for split, (images, rows) in parts.items():
                out[split].close()
                np.save(tmp / f"{split}_y.npy", images.labels[rows])
            values = np.arange(256, dtype=np.float64)
            n = counts.sum(1)
            mean = counts @ values / n
            std = np.sqrt(counts @ values**2 / n - mean**2) + 1e-6
            sizes = {s: len(r) for s, (_, r) in parts.items()}
            meta = {"settings": settings, "classes": parts["train"][0].classes,
                    "image_size": [int(h), int(w)], "channels": int(c), "mean": mean.tolist(),
                    "std": std.tolist(), "images": sizes}  # fmt: skip
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        log.info("prepared %s: %s images of %dx%dx%d with %d process(es) -> %s", hp.source,
                 meta["images"], c, h, w, num_proc, self.processed_dir)  # fmt: skip

    @property
    def meta(self) -> dict:
        return json.loads((self.processed_dir / "meta.json").read_text())

    @property
    def classes(self) -> list[str]:
        return self.meta["classes"]

    @property
    def model_kwargs(self) -> dict:
        meta = self.meta
        size = list(self.hparams.crop or meta["image_size"])  # what the model sees
        sizes = {"image_size": size, "channels": meta["channels"]}
        if self.hparams.captions:  # one vocabulary of words and codes for both directions
            n = len(CaptionVocab(self.hparams.codes))
            return {"vocab_size": n, "src_vocab_size": n, "shared_vocab": True}
        if self.hparams.codes:  # ImageGPT: K codes and the start token
            return {**sizes, "vocab_size": self.hparams.codes + 1}
        return {**sizes, "num_classes": len(meta["classes"])}

    def trivial_targets(self, split: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The labels of the train split and of `split` (for the majority-class baseline); None
        for token sequences."""
        if self.hparams.codes:
            return None

        def labels(s: str) -> torch.Tensor:
            return torch.from_numpy(np.load(self.processed_dir / f"{s}_y.npy"))

        return labels("train"), labels(split)

    # -- loading
    @property
    def vocab(self) -> CaptionVocab:
        return CaptionVocab(self.hparams.codes)

    def setup(self, stage: str | None = None) -> None:
        meta, hp = self.meta, self.hparams
        if any(side % hp.patch for side in meta["image_size"]):
            raise PipelineError(f"data.patch={hp.patch} does not tile {meta['image_size']} images")
        if hp.crop and any(c > s for c, s in zip(hp.crop, meta["image_size"], strict=True)):
            raise PipelineError(f"data.crop={list(hp.crop)} is larger than the prepared "
                                f"{meta['image_size']} images (data.image_size)")  # fmt: skip
        if hp.captions and meta["classes"] != [str(d) for d in range(10)]:
            raise PipelineError(f"data.captions name the digits 0-9; these classes are "
                                f"{', '.join(meta['classes'][:12])}")  # fmt: skip
        for split in SPLITS:
            x = np.load(self.processed_dir / f"{split}_x.npy", mmap_mode="r")
            y = np.load(self.processed_dir / f"{split}_y.npy")
            codes = None
            if hp.codes:  # (N, H/P W/P) uint16
                codes = np.load(self.codes_dir / f"{split}_codes.npy", mmap_mode="r")
            keep = None
            if split == "train" and hp.train_fraction < 1:  # a stratified share: less data
                keep = stratified_split(y, (hp.train_fraction, 1 - hp.train_fraction), hp.seed)[0]
                y, codes = y[keep], None if codes is None else codes[keep]
            if hp.captions:
                x = x if keep is None else x[keep]
                if split == "train":
                    self.terciles = ink_terciles(x, y, len(meta["classes"]), scale=255)
                amounts = ink(x, scale=255)
                texts = [caption(c, a, self.terciles) for c, a in zip(y, amounts, strict=True)]
                self.splits[split] = CaptionPairs(codes, texts, self.vocab, hp.captions)
                self.collate = collate_pairs
                continue
            if hp.codes:
                self.splits[split] = TokenImages(codes, hp.codes)
                continue
            augment = Augment(tuple(hp.crop) if hp.crop else None, tuple(hp.crop_scale),
                              flip=hp.flip, shift=hp.shift)  # fmt: skip
            rows = Rows(self.processed_dir / f"{split}_x.npy", keep)
            self.splits[split] = ImageSplit(rows, y, meta["mean"], meta["std"], augment,
                                            train=split == "train", seed=hp.seed)  # fmt: skip

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Training batches, on the device: with trivial_augment, TrivialAugment (Mueller and
        Hutter 2021; kornia's), one of its colour or geometry ops at a random strength per image,
        on the pixels in [0, 1] before normalising. A whole batch at once, where a GPU does it in
        a fraction of a step, rather than image by image in the loader's workers."""
        trainer = self.trainer
        if not self.hparams.trivial_augment or trainer is None or not trainer.training:
            return batch
        x, y = batch
        mean, std = self.splits["train"].mean.to(x), self.splits["train"].std.to(x)
        if self._trivial is None:
            from kornia.augmentation.auto import TrivialAugment

            self._trivial = TrivialAugment()
        pixels = ((x * std + mean) / 255).clamp(0, 1)  # (B, C, H, W)
        return (self._trivial(pixels) * 255 - mean) / std, y

    # -- the codebook travels inside ImageGPT's checkpoints, to render samples from them alone
    def state_dict(self) -> dict:
        if not self.hparams.codes:
            return {}
        return {"codebook": self.codebook.tolist(), "image_size": self.meta["image_size"]}

    def load_state_dict(self, state: dict) -> None:
        if state.get("codebook") is not None and state["codebook"] != self.codebook.tolist():
            raise PipelineError("the checkpoint was trained with another codebook than the data's")
