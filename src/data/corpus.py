"""Corpora of any size -> the token memmaps that `TextDataModule` reads, in bounded memory.

    documents (text files, JSONL / Parquet rows, a saved or Hub dataset), streamed in order
    -> the tokenizer, trained on the first `tokenizer_sample` MB of them (all by default)
    -> chunks of ~`chunk_mb` MB of text, encoded by `num_proc` processes, each chunk written to
       its own file as soon as it is done (a killed preparation resumes at the first missing one)
    -> `{train,val,test}.bin`: contiguous parts of the one EOS-separated stream, or whole
       documents drawn by a seeded hash (`split_by=document`, as nanoGPT splits OpenWebText)

Memory is set by `chunk_mb` x `num_proc` and the tokenizer sample, never by the corpus: documents
are read lazily (gzip-compressed files too), long ones in pieces of about a MB cut after a line
break between two non-space characters, or, in text without line breaks (text8 is one line of
10^8 characters), before a space between a non-space character and a letter. Such a cut changes
no token of the char, word and byte-level BPE tokenizers (each splits its input at line breaks,
and BPE's pre-tokenizer starts a word at the space before it), so the result is the same as
encoding whole documents.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import re
import shutil
import sysconfig
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from src.data import chunks
from src.data.parallel import Progress, in_order
from src.data.text import EOS, SPLITS, check_splits, load_tokenizer_file, train_tokenizer
from src.utils.errors import PipelineError
from src.utils.files import atomic_dir, atomic_file

log = logging.getLogger(__name__)

PIECE = 1 << 20  # characters of text given to the tokenizer at once: bounds its working memory
TABLES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}  # datasets' builders
# Generated tables and test data are not the human-written text we want from the stdlib.
STDLIB_EXCLUDE = {"site-packages", "test", "tests", "idle_test", "encodings", "pydoc_data"}


# --------------------------------------------------------------------------- sources


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(
        p for p in root.rglob("*.py") if not STDLIB_EXCLUDE & set(p.relative_to(root).parts)
    )


def corpus_files(path: str | None, glob: str) -> list[Path]:
    """The files of a corpus: one file, the files of a folder matching `glob`, or the stdlib."""
    if path is None:
        return stdlib_files()
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.glob(glob) if f.is_file())
        if not files:
            raise PipelineError(f"no files matching {glob!r} in corpus folder {p}")
        return files
    raise PipelineError(f"corpus not found: {p}")


class Corpus:
    """An ordered stream of documents: each text file is one, or each row's `text_column` of
    JSONL / Parquet files, of a folder written by `datasets`' `save_to_disk`, or of a dataset of
    the Hugging Face Hub (`hub`, `hub_config`, `hub_split`; `streaming` reads it without a
    local copy). `path` None and no `hub`: the Python standard library's sources.
    `max_chars`: the stream's first this many characters only (a corpus's head: the same
    text from a whole download and from a copy of its beginning)."""

    def __init__(self, path: str | Path | None = None, glob: str = "**/*",
                 text_column: str = "text", hub: str | None = None, hub_config: str | None = None,
                 hub_split: str = "train", streaming: bool = False,
                 max_chars: int | None = None):  # fmt: skip
        if max_chars is not None and max_chars < 1:
            raise PipelineError(f"data.max_chars={max_chars}: a positive number, or null for all")
        self.text_column, self.hub, self.max_chars = text_column, hub, max_chars
        self.hub_args = {"name": hub_config, "split": hub_split, "streaming": streaming}
        self.files: list[Path] = []
        self.kind = "hub" if hub else "files"
        if hub:
            return
        p = Path(path).expanduser() if path is not None else None
        saved = ("dataset_info.json", "dataset_dict.json")  # a Dataset's, a DatasetDict's
        if p is not None and p.is_dir() and any((p / name).is_file() for name in saved):
            self.kind, self.files = "saved", [p]
            return
        self.files = corpus_files(None if p is None else str(p), glob)
        suffixes = {f.suffix.lower() for f in self.files}
        if suffixes & TABLES.keys():
            if len({TABLES.get(s) for s in suffixes}) > 1:
                raise PipelineError(f"corpus {p} mixes {sorted(suffixes)} files; choose one kind")
            self.kind = TABLES[suffixes.pop()]

    def identity(self) -> dict:
        """What the prepared data depends on: the files' names, sizes and times, or the Hub
        dataset's name and arguments."""
        if self.kind == "hub":
            identity = {"hub": self.hub, **self.hub_args, "text_column": self.text_column}
        else:
            files = self.files
            if self.kind == "saved":
                files = sorted(f for f in self.files[0].iterdir() if f.is_file())
            identity = {"files": [[str(f), f.stat().st_size, int(f.stat().st_mtime)]
                                  for f in files]}  # fmt: skip
            if self.kind != "files":
                identity["text_column"] = self.text_column
        if self.max_chars is not None:  # only when set: earlier preparations stay valid
            identity["max_chars"] = self.max_chars
        return identity

    def size(self) -> int | None:
        """Bytes to read (for progress), when known."""
        if self.kind == "hub":
            return None
        if self.kind == "saved":
            size = sum(f.stat().st_size for f in self.files[0].glob("*.arrow"))
        else:
            size = sum(_text_size(f) for f in self.files)
        return size if self.max_chars is None else min(size, self.max_chars)

    def pieces(self) -> Iterator[tuple[str, bool, int]]:
        """(text, ends a document, bytes read) in corpus order; documents of blank text are
        left out, and long ones come in several pieces; the last cut at max_chars."""
        left = self.max_chars
        for piece, ends, size in self._all_pieces():
            if left is not None and len(piece) >= left:
                piece = piece[:left]
                yield piece, True, len(piece.encode())
                return
            yield piece, ends, size
            if left is not None:
                left -= len(piece)

    def _all_pieces(self) -> Iterator[tuple[str, bool, int]]:
        if self.kind == "files":
            yield from self._file_pieces()
            return
        for text in self._rows():
            if text and text.strip():
                cuts = list(_cut(text))
                for k, piece in enumerate(cuts):
                    yield piece, k == len(cuts) - 1, len(piece.encode())

    def _file_pieces(self) -> Iterator[tuple[str, bool, int]]:
        skipped = 0
        for f in self.files:
            size = _text_size(f)
            try:
                if size <= PIECE and not _gzipped(f):  # most files: read whole, blank ones left out
                    text = f.read_text(encoding="utf-8")
                    if text.strip():
                        yield text, True, size
                    continue
                opener = gzip.open if _gzipped(f) else open
                with opener(f, "rt", encoding="utf-8", newline="") as stream:
                    yield from _stream_pieces(stream)
            except UnicodeDecodeError:
                if len(self.files) == 1:
                    raise PipelineError(f"corpus {f} is not UTF-8 text") from None
                if size > PIECE:  # pieces already given cannot be taken back
                    raise PipelineError(f"corpus file {f} is not UTF-8 past its start") from None
                skipped += 1  # a folder may hold binary or legacy-encoded files
        if skipped:
            log.warning("skipped %d of %d files that are not UTF-8", skipped, len(self.files))

    def _rows(self) -> Iterator[str]:
        import datasets

        datasets.disable_progress_bars()
        if self.kind == "hub":
            ds = datasets.load_dataset(self.hub, **self.hub_args)
        elif self.kind == "saved":
            ds = datasets.load_from_disk(str(self.files[0]))
        else:  # json, parquet: read lazily, no Arrow copy of the files
            files = [str(f) for f in self.files]
            ds = datasets.load_dataset(self.kind, data_files=files, split="train", streaming=True)
        if isinstance(ds, datasets.DatasetDict):
            raise PipelineError(f"{self.files[0]} holds splits {list(ds)}; name one folder")
        columns = ds.column_names
        if columns is not None and self.text_column not in columns:
            raise PipelineError(
                f"data.text_column={self.text_column!r} is not a column of the corpus: {columns}"
            )
        for batch in ds.iter(batch_size=1000):
            yield from batch[self.text_column]


def _gzipped(f: Path) -> bool:
    return f.suffix.lower() == ".gz"


def _text_size(f: Path) -> int:
    """Bytes of text in file f: a gzip file's from its trailer (the size modulo 2^32)."""
    if not _gzipped(f):
        return f.stat().st_size
    with open(f, "rb") as stream:
        stream.seek(-4, os.SEEK_END)
        return int.from_bytes(stream.read(4), "little")


def _next_cut(text: str, start: int) -> int:
    """Where the piece of `text` that begins at `start` ends: after the last line break within
    PIECE characters that has a non-space character on both sides, else before the last space
    within them between a non-space character and a letter, else after the first such line
    break further on (0: none)."""
    end = start + PIECE
    k = text.rfind("\n", start + 1, end)
    while k > start and (text[k - 1].isspace() or k + 1 >= len(text) or text[k + 1].isspace()):
        k = text.rfind("\n", start + 1, k)
    if k > start:
        return k + 1
    k = text.rfind(" ", start + 1, end)
    while k > start and (text[k - 1].isspace() or k + 1 >= len(text) or not text[k + 1].isalpha()):
        k = text.rfind(" ", start + 1, k)
    if k > start:
        return k
    later = _SAFE_BREAK.search(text, end)
    return later.end() if later else 0


_SAFE_BREAK = re.compile(r"(?<=\S)\n(?=\S)")


def _cut(text: str) -> Iterator[str]:
    """`text` in pieces of about PIECE characters, cut only where tokens cannot change."""
    start = 0
    while len(text) - start > PIECE and (cut := _next_cut(text, start)):
        yield text[start:cut]
        start = cut
    yield text[start:]


def _stream_pieces(stream) -> Iterator[tuple[str, bool, int]]:
    """A long file's pieces, reading PIECE characters at a time."""
    buffer = ""
    while block := stream.read(PIECE):
        buffer += block
        while len(buffer) > PIECE and (cut := _next_cut(buffer, 0)):
            piece, buffer = buffer[:cut], buffer[cut:]
            yield piece, False, len(piece.encode())
    yield buffer, True, len(buffer.encode())


def sample(corpus: Corpus, megabytes: float | None) -> Iterator[str]:
    """The corpus's first `megabytes` of text (None: all of it), for training a tokenizer."""
    budget = None if megabytes is None else megabytes * 1e6
    for text, _, size in corpus.pieces():
        yield text
        if budget is not None:
            budget -= size
            if budget <= 0:
                return


# --------------------------------------------------------------------------- encoding


def _in_order(jobs: Iterable[tuple], num_proc: int, tokenizer_json: str) -> Iterator[int]:
    """`chunks.encode_chunk` of each job, in order, with at most 2 x num_proc chunks in memory.
    The tokenizer library's own threads stay off: num_proc processes, one core each, do the
    work."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield from in_order(chunks.encode_chunk, jobs, num_proc, chunks.start_worker,
                            (tokenizer_json, EOS), preload="src.data.chunks")  # fmt: skip
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def _document_part(seed: int, document: int, splits) -> str:
    """The split of one document, drawn by a seeded hash: the same for every run and process."""
    digest = hashlib.blake2b(f"{seed}:{document}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "little") / 2**64
    return SPLITS[min(int(np.searchsorted(np.cumsum(splits), u, side="right")), 2)]


# --------------------------------------------------------------------------- preparation


def prepare_corpus(
    out_dir: Path,
    corpus: Corpus,
    tokenizer: str,
    vocab_size: int | None,
    splits: tuple[float, float, float],
    tokenizer_file: str | None = None,
    min_count: int = 1,
    tokenizer_sample: float | None = None,
    split_by: str = "stream",
    split_seed: int = 0,
    num_proc: int | None = None,
    chunk_mb: float = 16,
) -> None:
    """Tokenise `corpus` into `out_dir` (see the module's docstring), skipping the work when it is
    already there for the same inputs and settings. The result is written into a temporary
    folder and renamed, so a failed run never leaves files that look complete; finished chunks
    wait in `.<out_dir>-work/` for the next run to resume from.

    `tokenizer_file` (a saved tokenizer.json) replaces training a tokenizer, e.g. to pre-train on
    a corpus with the tokenizer of the task the model will be fine-tuned on. `min_count` cuts the
    word tokenizer's vocabulary (see train_tokenizer). `num_proc` None: every core."""
    if split_by not in ("stream", "document"):
        raise PipelineError(f"data.split_by={split_by!r}: choose stream or document")
    tok = None
    if tokenizer_file is not None:
        tok = load_tokenizer_file(tokenizer_file)
        tokenizer = "file:" + hashlib.sha256(tok.to_str().encode()).hexdigest()[:16]
    settings = {
        **corpus.identity(),
        "tokenizer": tokenizer,
        "vocab_size": vocab_size if tokenizer in ("bpe", "word") else None,
        "splits": list(splits),
    }
    # only when set, so that the data prepared before these settings existed stays valid
    if tokenizer == "word":
        settings["min_count"] = min_count
    if tokenizer_sample is not None:
        settings["tokenizer_sample"] = tokenizer_sample
    if split_by == "document":
        settings.update(split_by=split_by, split_seed=split_seed)
    fingerprint = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]
    meta_path = out_dir / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()).get("fingerprint") == fingerprint:
        return
    check_splits(splits)

    work = out_dir.with_name(f".{out_dir.name}-work")
    if not (work / f"{fingerprint}.json").is_file():  # another corpus or settings: start anew
        shutil.rmtree(work, ignore_errors=True)
        (work / "chunks").mkdir(parents=True)
        with atomic_file(work / f"{fingerprint}.json") as part:
            part.write_text(json.dumps(settings))
    try:
        if tok is None:
            tok = _tokenizer(work, corpus, tokenizer, vocab_size, min_count, tokenizer_sample)
        dtype = np.dtype(np.uint16 if tok.get_vocab_size() < 2**16 else np.uint32)
        if num_proc is None:  # every core, unless the corpus is too small to pay for processes
            size = corpus.size()
            num_proc = 1 if size is not None and size < 8 * PIECE else os.cpu_count() or 1
        log.info(
            "tokenising the corpus (%s) with %d process(es) -> %s", corpus.kind, num_proc, out_dir
        )
        t0 = time.perf_counter()
        document_splits = splits if split_by == "document" else None
        stats = _encode(work / "chunks", corpus, tok, dtype, document_splits, split_seed, num_proc,
                        chunk_mb)  # fmt: skip
        if stats["documents"] == 0:
            where = corpus.files[0] if len(corpus.files) == 1 else corpus.hub or "the corpus"
            raise PipelineError(f"corpus is empty: {where}")

        with atomic_dir(out_dir) as tmp:
            sizes = _write_splits(work / "chunks", stats, tmp, dtype, splits, split_by)
            tok.save(str(tmp / "tokenizer.json"))
            meta = {
                "fingerprint": fingerprint,
                "vocab_size": tok.get_vocab_size(),
                "dtype": dtype.name,
                "tokens": sizes,
                "documents": stats["documents"],
                "characters": stats["characters"],
                "settings": settings,
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    except PipelineError:  # bad input or a full disk: nothing worth resuming
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - t0
    mb = sum(stats["bytes"]) / 1e6
    log.info("tokens: %s, vocabulary: %d; %.1f MB encoded and written in %.1f s (%.2f MB/s)",
             sizes, meta["vocab_size"], mb, seconds, mb / max(seconds, 1e-9))  # fmt: skip


def _tokenizer(work: Path, corpus: Corpus, kind: str, vocab_size, min_count, megabytes):
    """The tokenizer trained on the corpus's sample, or the one an interrupted run trained."""
    from src.data.text import load_tokenizer

    saved = work / "tokenizer.json"
    if saved.is_file():
        return load_tokenizer(saved.read_text())
    t0 = time.perf_counter()
    tok = train_tokenizer(kind, sample(corpus, megabytes), vocab_size, min_count)
    with atomic_file(saved) as part:
        part.write_text(tok.to_str())
    log.info("trained the %s tokenizer in %.1f s", kind, time.perf_counter() - t0)
    return tok


def _encode(chunks: Path, corpus: Corpus, tok, dtype, document_splits, seed: int,
            num_proc: int, chunk_mb: float) -> dict:  # fmt: skip
    """Encode the corpus chunk by chunk into `chunks/`, skipping the chunks already done; the
    counts of documents and characters, and each chunk's tokens per part."""
    stats = {"documents": 0, "characters": 0}
    chunk_bytes: list[int] = []  # text read for each chunk
    size = corpus.size()
    progress = Progress(size)
    if size:  # a small corpus still gives each process several chunks
        chunk_mb = min(chunk_mb, max(size / 4e6 / num_proc, PIECE / 1e6))

    def jobs() -> Iterator[tuple]:
        batch, nbytes = [], 0
        for text, ends, size in corpus.pieces():
            part = "all"
            if document_splits is not None:
                part = _document_part(seed, stats["documents"], document_splits)
            batch.append((text, ends, part))
            stats["documents"] += ends
            stats["characters"] += len(text)
            nbytes += size
            if nbytes >= chunk_mb * 1e6:
                yield from job(batch, nbytes)
                batch, nbytes = [], 0
        if batch:
            yield from job(batch, nbytes)

    def job(batch: list, nbytes: int) -> Iterator[tuple]:
        index = len(chunk_bytes)
        chunk_bytes.append(nbytes)
        if (chunks / f"{index:06d}.json").is_file():  # encoded by an earlier, interrupted run
            progress.update(nbytes)
        else:
            yield str(chunks), index, dtype.name, batch

    for index in _in_order(jobs(), num_proc, tok.to_str()):
        progress.update(chunk_bytes[index])
    progress.close()
    stats["counts"] = [
        json.loads((chunks / f"{index:06d}.json").read_text()) for index in range(len(chunk_bytes))
    ]
    stats["bytes"] = chunk_bytes
    return stats


def _write_splits(chunks: Path, stats: dict, out: Path, dtype, splits, split_by) -> dict:
    """Concatenate the chunks' token files into `out/{train,val,test}.bin`, reading one chunk
    at a time; the stream's parts are cut at the split fractions (a single document has no
    EOS at its end)."""
    counts = stats["counts"]
    sizes = dict.fromkeys(SPLITS, 0)
    if split_by == "document":
        for split in SPLITS:
            with open(out / f"{split}.bin", "wb") as f:
                for index, count in enumerate(counts):
                    if count.get(split):
                        f.write((chunks / f"{index:06d}.{split}.bin").read_bytes())
                        sizes[split] += count[split]
        return sizes
    total = sum(c["all"] for c in counts) - (stats["documents"] == 1)
    # the last cut is the stream's end: float sums such as 0.7 + 0.2 + 0.1 fall short of 1
    cuts = [int(b * total) for b in np.cumsum([0, *splits])[:-1]] + [total]
    files = [open(out / f"{split}.bin", "wb") for split in SPLITS]  # noqa: SIM115
    try:
        position = 0
        for index in range(len(counts)):
            ids = np.fromfile(chunks / f"{index:06d}.all.bin", dtype=dtype)
            lo, hi = position, min(position + len(ids), total)
            for f, a, b in zip(files, cuts[:-1], cuts[1:], strict=True):
                if max(a, lo) < min(b, hi):
                    f.write(ids[max(a, lo) - lo : min(b, hi) - lo].tobytes())
            position += len(ids)
    finally:
        for f in files:
            f.close()
    return {split: b - a for split, a, b in zip(SPLITS, cuts[:-1], cuts[1:], strict=True)}
