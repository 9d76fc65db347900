"""Labelled images for the vision models (Bishop 12.4.1): one data module, several readers, no
torchvision (it does not install beside the pinned CPU torch).

Sources (`source`):
  digits   scikit-learn's 8 x 8 handwritten digits (1,797 images, always installed): the default
  mnist    MNIST's IDX files, `{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]` in `root` (MNIST,
           Fashion-MNIST, Kannada-MNIST, ... share the format); without `root`, MNIST fetched once
  cifar10  CIFAR-10's python batches (`cifar-10-batches-py/` in `root`, or fetched once)
  folder   `root/<class>/*.png|jpg|...`: any images in class sub-folders, read with Pillow,
           converted to `mode` (L or RGB)
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

Batches are (x, y): x (B, C, H, W) float, normalised with the train statistics; training images
are shifted at random by up to `shift` pixels each way (zeros come in at the border), the
augmentation small data needs.

With `codes=K` (set by model=imagegpt) the images are token sequences instead, ImageGPT's: a
codebook of K colours (intensities, for grey images) learnt by k-means over the train pixels
(vector quantisation, `codebook{K}.npy`), every pixel replaced by its nearest code, in raster
order. Batches are then (x, y) of shape (B, H W): y the codes, x the start token K followed by
y[:-1], as a language model reads text. With `patch=P` the codebook's vectors are P x P patches
(Parti's image tokens) and an image is H/P x W/P codes.

With `captions` as well (set by model=parti | captioner | cm3leon) every image of a digit becomes
a pair of caption and codes for an encoder-decoder (src.data.captions): text -> image, image ->
text or both, batched as the translation pairs are.
"""

from __future__ import annotations

import gzip
import json
import logging
import pickle
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset

from src.data import vq
from src.data.captions import DIRECTIONS, CaptionPairs, CaptionVocab, caption, ink, ink_terciles
from src.data.sources import data_root
from src.data.text import SPLITS, SplitLoaders
from src.data.translation import collate_pairs
from src.nn.patch import patchify, unpatchify
from src.utils.errors import PipelineError
from src.utils.files import atomic_dir

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the processed layout changes
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
Images = tuple[np.ndarray, np.ndarray, list[str]]  # uint8 (N, C, H, W), int64 (N,), class names


# --------------------------------------------------------------------------- readers


def read_digits() -> Images:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.round(d.images * (255 / 16)).astype(np.uint8)[:, None]  # 0..16 -> 0..255, (N, 1, 8, 8)
    return x, d.target.astype(np.int64), [str(c) for c in d.target_names]


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (LeCun's format: magic 0x0000 08 <dims>, big-endian sizes, uint8 data), plain
    or gzipped -> its array."""
    try:
        raw = (gzip.open if path.suffix == ".gz" else open)(path, "rb").read()
    except (OSError, EOFError) as e:
        raise PipelineError(f"{path}: not a readable IDX file ({e})") from None
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise PipelineError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != np.prod(shape):
        raise PipelineError(f"{path}: truncated, {data.size} bytes for a {shape} array")
    return data.reshape(shape)


def idx_file(root: Path, prefix: str, kind: str) -> Path | None:
    """root/{prefix}-{kind}-idx?-ubyte[.gz], or None."""
    found = sorted(root.glob(f"{prefix}-{kind}-idx*-ubyte*"))
    return found[0] if found else None


def read_mnist(root: Path) -> tuple[Images, Images | None]:
    """(the test set, the train set or None): MNIST's layout, t10k-* and train-*."""
    sets = []
    for prefix in ("t10k", "train"):
        images, labels = idx_file(root, prefix, "images"), idx_file(root, prefix, "labels")
        if images is None or labels is None:
            sets.append(None)
            continue
        x, y = read_idx(images), read_idx(labels).astype(np.int64)
        if x.ndim != 3 or len(x) != len(y):
            raise PipelineError(f"{images}: {x.shape} images for {len(y)} labels")
        sets.append((x[:, None], y, [str(c) for c in range(int(y.max()) + 1)]))
    if sets[0] is None:
        raise PipelineError(f"{root}: no t10k-images-idx3-ubyte[.gz] with its t10k-labels file")
    return sets[0], sets[1]


def read_cifar10(root: Path) -> tuple[Images, Images]:
    """(test, train) from CIFAR-10's python pickles."""
    folder = root / "cifar-10-batches-py" if (root / "cifar-10-batches-py").is_dir() else root

    def load(name: str) -> dict:
        try:
            with open(folder / name, "rb") as f:
                return pickle.load(f, encoding="bytes")  # the dataset's own format: trusted files
        except (OSError, pickle.UnpicklingError, EOFError) as e:
            raise PipelineError(f"{folder / name}: not a CIFAR-10 file ({e})") from None

    def batch(name: str) -> tuple[np.ndarray, np.ndarray]:
        d = load(name)
        return d[b"data"].reshape(-1, 3, 32, 32), np.asarray(d[b"labels"], np.int64)

    names = [n.decode() for n in load("batches.meta")[b"label_names"]]
    train = [batch(f"data_batch_{i}") for i in range(1, 6)]
    x, y = np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])
    return (*batch("test_batch"), names), (x, y, names)


def resized(im, size: tuple[int, int] | None):
    """A Pillow image at size (H, W), or as it is when size is None."""
    from PIL import Image

    return im if size is None else im.resize((size[1], size[0]), Image.BILINEAR)


def resize_all(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 images (N, C, H, W) -> (N, C, size[0], size[1]), channel by channel."""
    from PIL import Image

    return np.stack([[np.asarray(resized(Image.fromarray(c), size)) for c in img] for img in x])


def read_folder(root: Path, mode: str, image_size: tuple[int, int] | None) -> Images:
    """root/<class>/<image>: every image converted to `mode`, resized to image_size if given
    (else all must share one size)."""
    from PIL import Image, UnidentifiedImageError

    if mode not in ("L", "RGB"):
        raise PipelineError(f"data.mode={mode!r}: choose L (grey) or RGB")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise PipelineError(f"{root}: no class sub-folders (root/<class>/<image files>)")
    x, y, sizes = [], [], {}
    for label, name in enumerate(classes):
        files = sorted(f for f in (root / name).iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise PipelineError(f"{root / name}: an empty class folder (no image files)")
        for f in files:
            try:
                with Image.open(f) as im:
                    a = np.asarray(resized(im.convert(mode), image_size), dtype=np.uint8)
            except (OSError, UnidentifiedImageError) as e:
                raise PipelineError(f"{f}: not a readable image ({e})") from None
            sizes.setdefault(a.shape[:2], f)
            x.append(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))
            y.append(label)
    if len(sizes) > 1:
        (s1, f1), (s2, f2) = list(sizes.items())[:2]
        raise PipelineError(
            f"images of mixed sizes ({f1}: {s1[0]}x{s1[1]}, {f2}: {s2[0]}x{s2[1]}); set "
            "data.image_size=[H,W] to resize them all"
        )
    return np.stack(x), np.asarray(y, np.int64), classes


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


class ImageSplit(Dataset):
    """One split's images as float tensors normalised by the train mean and std; with shift > 0,
    each image moved by a random offset in [-shift, shift] pixels along each axis."""

    def __init__(self, x: np.ndarray, y: np.ndarray, mean, std, shift: int = 0, seed: int = 0):
        self.x, self.y, self.shift = x, y, shift
        self.mean = torch.tensor(mean, dtype=torch.float32)[:, None, None]  # (C, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32)[:, None, None]
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = torch.from_numpy(np.array(self.x[i], dtype=np.float32))  # (C, H, W)
        if self.shift:
            s = self.shift
            dy, dx = self.rng.integers(-s, s + 1, size=2)
            padded = torch.nn.functional.pad(img, (s, s, s, s))
            h, w = img.shape[1:]
            img = padded[:, s + dy : s + dy + h, s + dx : s + dx + w]
        return (img - self.mean) / self.std, int(self.y[i])


class TokenImages(Dataset):
    """One split's images as ImageGPT's token sequences: (x, y), y the codes (H W,), x the start
    token followed by y[:-1]."""

    def __init__(self, codes: np.ndarray, start: int):
        self.codes, self.start = torch.from_numpy(codes), start

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.codes[i]
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
        mode: str = "L",
        image_size: tuple[int, int] | None = None,
        splits: tuple[float, float, float] = (0.8, 0.1, 0.1),
        split_seed: int = 0,
        train_fraction: float = 1.0,
        shift: int = 0,
        codes: int | None = None,
        patch: int = 1,
        captions: str | None = None,
        batch_size: int = 128,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__()
        if source not in ("digits", "mnist", "cifar10", "folder"):
            raise PipelineError(f"data.source={source!r}: choose digits, mnist, cifar10 or folder")
        if source == "folder" and root is None:
            raise PipelineError("data.source=folder needs data.root=<folder of class folders>")
        if abs(sum(splits) - 1) > 1e-6 or min(splits) <= 0:
            raise PipelineError(f"data.splits={list(splits)} must be positive and sum to 1")
        if not 0 < train_fraction <= 1:
            raise PipelineError(f"data.train_fraction={train_fraction} must be in (0, 1]")
        if captions is not None and (captions not in DIRECTIONS or not codes):
            raise PipelineError(f"data.captions={captions!r}: choose {', '.join(DIRECTIONS)}, "
                                "with data.codes=K")  # fmt: skip
        self.save_hyperparameters(logger=False)
        self.processed_dir = Path(processed_dir)
        self.splits: dict[str, Dataset] = {}

    # -- preparation
    def _settings(self) -> dict:
        hp = self.hparams
        root = Path(hp.root).expanduser().resolve() if hp.root else None
        return {"format": FORMAT, "source": hp.source, "root": str(root), "mode": hp.mode,
                "image_size": list(hp.image_size) if hp.image_size else None,
                "splits": list(hp.splits), "split_seed": hp.split_seed}  # fmt: skip

    def _root(self, dataset: str) -> Path:
        hp = self.hparams
        return data_root(hp.root, dataset, hp.raw_dir, hp.mirror)

    def _read(self) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[str]]:
        """The three splits' (images, labels), and the class names."""
        hp = self.hparams
        if hp.source == "digits":
            test, train = read_digits(), None
        elif hp.source == "mnist":
            test, train = read_mnist(self._root("mnist"))
        elif hp.source == "cifar10":
            test, train = read_cifar10(self._root("cifar10"))
        else:
            test, train = read_folder(self._root("folder"), hp.mode, hp.image_size), None
        x, y, classes = test
        if train is None:  # one set: split it three ways
            parts = stratified_split(y, hp.splits, hp.split_seed)
            out = {s: (x[p], y[p]) for s, p in zip(SPLITS, parts, strict=True)}
        else:  # its own test set; val a share of train, as large relative to train as in splits
            tx, ty, classes = train
            share = hp.splits[1] / (hp.splits[0] + hp.splits[1])
            fit, val = stratified_split(ty, (1 - share, share), hp.split_seed)
            out = {"train": (tx[fit], ty[fit]), "val": (tx[val], ty[val]), "test": (x, y)}
        size = tuple(hp.image_size or ())
        if size and x.shape[2:] != size:
            out = {s: (resize_all(xs, size), ys) for s, (xs, ys) in out.items()}
        return out, classes

    def prepare_data(self) -> None:
        settings = self._settings()
        meta_file = self.processed_dir / "meta.json"
        if not meta_file.exists() or json.loads(meta_file.read_text()).get("settings") != settings:
            self._prepare_images(settings)
        if self.hparams.codes and not self._codebook_file.exists():
            train = np.load(self.processed_dir / "train_x.npy", mmap_mode="r")
            hp = self.hparams
            codebook = fit_codebook(train, hp.codes, hp.split_seed, hp.patch)
            tmp = self._codebook_file.with_suffix(".tmp.npy")
            np.save(tmp, codebook)
            tmp.replace(self._codebook_file)  # whole or absent

    @property
    def _codebook_file(self) -> Path:
        hp = self.hparams
        patch = f"-p{hp.patch}" if hp.patch > 1 else ""  # P x P patches; pixels: no suffix
        return self.processed_dir / f"codebook{hp.codes}{patch}.npy"

    @property
    def codebook(self) -> torch.Tensor:
        """(K, C P P) centroids in [0, 1] (with data.codes=K, data.patch=P)."""
        return torch.from_numpy(np.load(self._codebook_file))

    def _prepare_images(self, settings: dict) -> None:
        parts, classes = self._read()
        train = parts["train"][0].astype(np.float64)
        mean, std = train.mean(axis=(0, 2, 3)), train.std(axis=(0, 2, 3)) + 1e-6
        with atomic_dir(self.processed_dir) as tmp:
            for split, (x, y) in parts.items():
                np.save(tmp / f"{split}_x.npy", np.ascontiguousarray(x, dtype=np.uint8))
                np.save(tmp / f"{split}_y.npy", y.astype(np.int64))
            c, h, w = parts["train"][0].shape[1:]
            meta = {"settings": settings, "classes": classes, "image_size": [int(h), int(w)],
                    "channels": int(c), "mean": mean.tolist(), "std": std.tolist(),
                    "images": {s: len(y) for s, (_, y) in parts.items()}}  # fmt: skip
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        log.info("prepared %s: %s images of %dx%dx%d -> %s", self.hparams.source,
                 meta["images"], c, h, w, self.processed_dir)  # fmt: skip

    @property
    def meta(self) -> dict:
        return json.loads((self.processed_dir / "meta.json").read_text())

    @property
    def classes(self) -> list[str]:
        return self.meta["classes"]

    @property
    def model_kwargs(self) -> dict:
        meta = self.meta
        sizes = {"image_size": meta["image_size"], "channels": meta["channels"]}
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
        if hp.captions and meta["classes"] != [str(d) for d in range(10)]:
            raise PipelineError(f"data.captions name the digits 0-9; these classes are "
                                f"{', '.join(meta['classes'][:12])}")  # fmt: skip
        for split in SPLITS:
            x = np.load(self.processed_dir / f"{split}_x.npy", mmap_mode="r")
            y = np.load(self.processed_dir / f"{split}_y.npy")
            if split == "train" and hp.train_fraction < 1:  # a stratified share: less data
                keep = stratified_split(y, (hp.train_fraction, 1 - hp.train_fraction), hp.seed)[0]
                x, y = x[keep], y[keep]
            if hp.captions:
                if split == "train":
                    self.terciles = ink_terciles(x / 255.0, y, len(meta["classes"]))
                amounts = ink(x / 255.0)
                texts = [caption(c, a, self.terciles) for c, a in zip(y, amounts, strict=True)]
                codes = quantize(x, self.codebook.numpy(), hp.patch)
                self.splits[split] = CaptionPairs(codes, texts, self.vocab, hp.captions)
                self.collate = collate_pairs
                continue
            if hp.codes:
                self.splits[split] = TokenImages(quantize(x, self.codebook.numpy()), hp.codes)
                continue
            shift = hp.shift if split == "train" else 0
            self.splits[split] = ImageSplit(x, y, meta["mean"], meta["std"], shift, hp.seed)

    # -- the codebook travels inside ImageGPT's checkpoints, to render samples from them alone
    def state_dict(self) -> dict:
        if not self.hparams.codes:
            return {}
        return {"codebook": self.codebook.tolist(), "image_size": self.meta["image_size"]}

    def load_state_dict(self, state: dict) -> None:
        if state.get("codebook") is not None and state["codebook"] != self.codebook.tolist():
            raise PipelineError("the checkpoint was trained with another codebook than the data's")
