"""Prepared arrays on disk, written and read without a memory map: a map's pages (dirty ones
written, clean ones read) count in the process that touches them until the kernel drops them,
so a stage or an epoch over a collection larger than memory would grow with it. Plain writes
and preads leave the pages to the page cache instead.

    with NpyWriter(path, np.float32, (None, 64)) as w:   # rows counted as they come
        w.write(block)                                 # (k, 64)
    Rows(path)[i]                                      # row i, (64,)
    Spans(path, offsets)[i]                            # rows offsets[i]:offsets[i+1], (L_i, 64)

Kept free of torch: preparation workers and loader workers import it.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import numpy as np

from src.utils.errors import PipelineError

HEADER = 128  # bytes of every .npy header written here: room for any shape, rewritten in place


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The .npy (version 1.0) header of a C-ordered array, padded to HEADER bytes."""
    text = f"{{'descr': {np.lib.format.dtype_to_descr(dtype)!r}, 'fortran_order': False, " \
           f"'shape': {tuple(shape)!r}, }}"  # fmt: skip
    pad = HEADER - 10 - len(text) - 1
    if pad < 0:
        raise ValueError(f"a .npy header for shape {shape} does not fit {HEADER} bytes")
    return b"\x93NUMPY\x01\x00" + (HEADER - 10).to_bytes(2, "little") + (
        text + " " * pad + "\n").encode("latin1")  # fmt: skip


class NpyWriter:
    """A .npy file written block by block of rows, in order, with plain writes. shape[0] is the
    number of rows, or None when it is not known in advance (files skipped, recordings of any
    length): the header is then rewritten with the rows counted when the file is closed."""

    def __init__(self, path: Path, dtype, shape: tuple[int | None, ...]):
        self.path, self.dtype, self.shape, self.rows = path, np.dtype(dtype), tuple(shape), 0
        self.file = open(path, "wb")  # noqa: SIM115 (closed by close)
        self.file.write(npy_header(self.dtype, (shape[0] or 0, *shape[1:])))

    def write(self, block: np.ndarray) -> None:
        """The next rows, (k, *shape[1:])."""
        if block.shape[1:] != self.shape[1:] or (
            self.shape[0] is not None and self.rows + len(block) > self.shape[0]
        ):
            raise ValueError(f"{self.path}: rows {block.shape} after {self.rows} of {self.shape}")
        self.file.write(np.ascontiguousarray(block, dtype=self.dtype).tobytes())
        self.rows += len(block)

    def close(self) -> None:
        if self.shape[0] is None:
            self.file.seek(0)
            self.file.write(npy_header(self.dtype, (self.rows, *self.shape[1:])))
        self.file.close()
        if self.shape[0] is not None and self.rows != self.shape[0]:
            raise ValueError(f"{self.path}: {self.rows} rows written of {self.shape[0]}")

    def __enter__(self) -> NpyWriter:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.file.close()


def npy_layout(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, offset of the data) of a C-ordered .npy file, from its header."""
    with open(path, "rb") as f:
        fmt = np.lib.format
        version = fmt.read_magic(f)
        header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = header(f)
        offset = f.tell()
    if fortran:
        raise PipelineError(f"{path}: a Fortran-ordered array; expected C order")
    return shape, dtype, offset


class Rows:
    """The rows of a .npy file (N, ...) read one at a time with pread: pages read stay in the page
    cache, not in the process, so a loader's memory does not grow as an epoch touches a collection
    larger than memory. `index` picks a subset (e.g. a share of train)."""

    def __init__(self, path: Path, index: np.ndarray | None = None):
        shape, self.dtype, self.offset = npy_layout(path)
        self.path, self.shape = path, shape[1:]
        self.size = int(np.prod(self.shape)) * self.dtype.itemsize
        self.index = np.arange(shape[0]) if index is None else np.asarray(index)
        self.fd: int | None = None  # opened in the process that reads (a loader's worker)

    def __len__(self) -> int:
        return len(self.index)

    def read(self, start: int, count: int) -> np.ndarray:
        """Rows start .. start + count of the file, (count, ...)."""
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY)
        raw = os.pread(self.fd, count * self.size, self.offset + start * self.size)
        return np.frombuffer(raw, self.dtype).reshape(count, *self.shape)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.read(int(self.index[i]), 1)[0]

    def subset(self, index: np.ndarray) -> Rows:
        """The items `index` of these (a split of the file's rows)."""
        part = copy.copy(self)
        part.index, part.fd = self.index[np.asarray(index, dtype=np.int64)], None
        return part

    def __getstate__(self) -> dict:  # to a worker process: without the descriptor
        return {**self.__dict__, "fd": None}


class Spans(Rows):
    """Items of different lengths stored one after another as the rows of a .npy file (a
    recording's frames, (L_i, ...)): item j is rows offsets[j] .. offsets[j + 1]."""

    def __init__(self, path: Path, offsets: np.ndarray, index: np.ndarray | None = None):
        super().__init__(path, np.arange(len(offsets) - 1) if index is None else index)
        self.offsets = np.asarray(offsets)

    @property
    def lengths(self) -> np.ndarray:
        """(len(self),) the rows of each item."""
        return np.diff(self.offsets)[self.index]

    def __getitem__(self, i: int) -> np.ndarray:
        j = int(self.index[i])
        return self.read(int(self.offsets[j]), int(self.offsets[j + 1] - self.offsets[j]))
