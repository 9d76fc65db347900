"""Labelled images as their sources hold them, for the image data module (src/data/images.py):
the small fixed datasets read whole (scikit-learn's digits, MNIST's IDX files, CIFAR-10's
pickles: at most 180 MB), a folder's files listed (or a Hugging Face dataset's image column,
src.data.hub_media) and decoded by preparation workers, a chunk of images at a time. Kept free
of torch, so that a worker starts in a fraction of a second and holds only its chunk."""

from __future__ import annotations

import gzip
import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from src.data.hub_media import blob_name, blobs, media_labels, open_media
from src.utils.errors import PipelineError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
CHANNELS = {"L": 1, "RGB": 3}


@dataclass
class ImageSet:
    """N labelled images not yet written: uint8 arrays in memory (N, C, H, W), or N files (or
    encoded images in a dataset's `column`, read a chunk at a time) to decode, converted to
    `mode` (L or RGB)."""

    labels: np.ndarray  # (N,) int64
    classes: list[str]
    images: np.ndarray | None = None
    files: list[str] | None = None
    mode: str = "L"
    table: object = None  # a datasets.Dataset, its `column` encoded images (hub_media)
    column: str = "image"

    @property
    def decoded(self) -> bool:
        """Arrays already in memory, not files or blobs for workers to decode."""
        return self.images is not None

    def items(self, rows) -> list:
        """What decode_chunk opens for `rows`: file paths, or the dataset's encoded images."""
        if self.table is not None:
            return blobs(self.table, self.column, rows)
        return [self.files[j] for j in rows]

    def shape(self, size: tuple[int, int] | None) -> tuple[int, int, int]:
        """(C, H, W) of every image once read: at `size`, or as stored (a folder: as its first
        file; decode_chunk checks the others)."""
        if self.images is not None:
            c, h, w = self.images.shape[1:]
        else:
            c = CHANNELS[self.mode]
            with open_image(self.items([0])[0]) as im:  # the header only
                w, h = im.size
        return (c, *size) if size else (c, h, w)

    def jobs(self, rows: np.ndarray, size: tuple[int, int] | None, chunk: int):
        """The decode_chunk jobs that read `rows` in order, `chunk` images each."""
        for i in range(0, len(rows), chunk):
            part = rows[i : i + chunk]
            if self.images is not None:
                yield self.images[part], None, self.mode, size, None
            elif size:
                yield None, self.items(part), self.mode, size, None
            else:  # every file must be the size of the first
                first = blob_name(self.items([0])[0])
                yield None, self.items(part), self.mode, self.shape(None)[1:], first


def open_image(item: str | dict):
    """A file, or an encoded image of a dataset ({"bytes", "path"}), opened by Pillow."""
    from PIL import Image, UnidentifiedImageError

    try:
        if isinstance(item, dict) and item.get("bytes"):
            return Image.open(io.BytesIO(item["bytes"]))
        return Image.open(item["path"] if isinstance(item, dict) else item)
    except (OSError, UnidentifiedImageError) as e:
        raise PipelineError(f"{blob_name(item)}: not a readable image ({e})") from None


def decode_chunk(job: tuple) -> np.ndarray:
    """One job of ImageSet.jobs -> its images, uint8 (k, C, H, W) at the size asked: arrays
    resized (Pillow, bilinear with antialiasing), files decoded, converted and resized. With
    `first` (no size was set), a file of another size than that one stops the stage."""
    from PIL import Image

    images, files, mode, size, first = job
    if images is not None:
        if size is None or images.shape[2:] == tuple(size):
            return np.ascontiguousarray(images)
        return np.stack([[np.asarray(resized(Image.fromarray(c), size)) for c in img]
                         for img in images])  # fmt: skip
    out = np.empty((len(files), CHANNELS[mode], *size), np.uint8)
    for k, f in enumerate(files):
        try:
            with open_image(f) as im:
                if first and im.size != (size[1], size[0]):
                    raise PipelineError(
                        f"images of mixed sizes ({first}: {size[0]}x{size[1]}, {blob_name(f)}: "
                        f"{im.size[1]}x{im.size[0]}); set data.image_size=[H,W] to resize them all"
                    )
                a = np.asarray(resized(im.convert(mode), size), dtype=np.uint8)
        except OSError as e:  # a truncated file fails at decoding, after its header was read
            raise PipelineError(f"{blob_name(f)}: not a readable image ({e})") from None
        out[k] = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
    return out


def resized(im, size: tuple[int, int] | None):
    """A Pillow image at size (H, W), or as it is when size is None or its own."""
    from PIL import Image

    if size is None or im.size == (size[1], size[0]):
        return im
    return im.resize((size[1], size[0]), Image.BILINEAR)


# --------------------------------------------------------------------------- sources


def read_digits() -> ImageSet:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.round(d.images * (255 / 16)).astype(np.uint8)[:, None]  # 0..16 -> 0..255, (N, 1, 8, 8)
    return ImageSet(d.target.astype(np.int64), [str(c) for c in d.target_names], x)


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


def read_mnist(root: Path) -> tuple[ImageSet, ImageSet | None]:
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
        sets.append(ImageSet(y, [str(c) for c in range(int(y.max()) + 1)], x[:, None]))
    if sets[0] is None:
        raise PipelineError(f"{root}: no t10k-images-idx3-ubyte[.gz] with its t10k-labels file")
    return sets[0], sets[1]


def read_cifar10(root: Path) -> tuple[ImageSet, ImageSet]:
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
    test_x, test_y = batch("test_batch")
    return ImageSet(test_y, names, test_x), ImageSet(y, names, x)


def read_folder(root: Path, mode: str) -> ImageSet:
    """root/<class>/<image>: the files of each class folder, in sorted order, not yet read."""
    if mode not in CHANNELS:
        raise PipelineError(f"data.mode={mode!r}: choose L (grey) or RGB")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise PipelineError(f"{root}: no class sub-folders (root/<class>/<image files>)")
    files, labels = [], []
    for label, name in enumerate(classes):
        found = sorted(f for f in (root / name).iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        if not found:
            raise PipelineError(f"{root / name}: an empty class folder (no image files)")
        files += map(str, found)
        labels += [label] * len(found)
    return ImageSet(np.asarray(labels, np.int64), classes, files=files, mode=mode)


def read_hub(name: str, config: str | None, column: str, label_column: str,
             mode: str) -> dict[str, ImageSet]:  # fmt: skip
    """A Hugging Face dataset's images (hub_media), one ImageSet per split it has (train, and
    val and test when it has them)."""
    if mode not in CHANNELS:
        raise PipelineError(f"data.mode={mode!r}: choose L (grey) or RGB")
    parts = open_media(name, config, column, "image")
    labels, classes = media_labels(parts, label_column)
    return {s: ImageSet(labels[s], classes, mode=mode, table=t, column=column)
            for s, t in parts.items()}  # fmt: skip
