"""Labelled text for fine-tuning (Bishop 12.2.5 / 12.3.3): one label per sequence (task="cls",
e.g. who speaks a speech) or one label per word (task="tag", e.g. the lexical category of every
token of a Python snippet).

Preparation (once; skipped while the settings fingerprint in meta.json matches):
  examples (built-in source or the user's CSV / JSONL) -> label ids -> seeded train/val/test split
  -> tokenizer (byte-level BPE trained on the TRAIN texts only, or a given tokenizer.json)
  -> every example as [CLS] + its ids, written atomically into `processed_dir`:

    tokenizer.json   the tokenizer (special tokens at ids 0..5 as in src.data.text)
    labels.json      label names, list index = label id
    meta.json        vocab_size, num_classes, examples / tokens / counts per split and label, ...
    {split}.npz      ids (int32, all examples concatenated, each starting with CLS),
                     offsets (n + 1 int64: example i is ids[offsets[i]:offsets[i + 1]]),
                     labels (cls: n int64; tag: one per id, -100 on CLS and non-first sub-tokens)
    {split}.jsonl    the raw examples: {"text", "label"} (cls) or {"tokens", "tags"} (tag), ids
    corpus.txt       a masked-LM pre-training corpus holding no val/test example (see below)

Examples are stored whole; batches cut them to `block_size` tokens (the CLS included), so the
block size can change without preparing again.

Sources
  source=shakespeare_speakers (task cls): the speeches of tiny Shakespeare (a line "NAME:" followed
    by the speech's lines up to a blank line), labelled by speaker, for the `num_classes` speakers
    with the most speeches. corpus.txt is the whole text without the val/test speeches.
  source=python_tokens (task tag): chunks of `chunk_lines` lines of `python_files` files of the
    Python standard library, every token labelled with its category from Python's own `tokenize`:
    NAME, KEYWORD (keyword.iskeyword; soft keywords such as `match` stay NAME), OP, NUMBER,
    STRING (f-string pieces too), COMMENT. Layout tokens (NEWLINE, NL, INDENT, DEDENT) are dropped.
  path=FILE.csv (columns text,label[,split]) or FILE.jsonl ({"text", "label"[, "split"]} per line;
    for task tag {"tokens": [...], "tags": [...][, "split"]}): the user's data. Labels may be
    strings or integers; ids follow their sorted order. Without a split column the split is a
    seeded stratified (cls) or random (tag) draw with fractions `splits`. corpus.txt holds the
    train texts, separated by blank lines.

Words (task tag) are encoded as if separated by single spaces: every word but the first gets a
leading space, which byte-level BPE turns into its "Ġ" marker as it does for running text. The
tokenizer is trained on the same space-joined text, so `" ".join(tokens)` is what the model sees.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import keyword
import logging
import math
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from src.data.corpus import stdlib_files
from src.data.sources import fetch, lookup, plain_name
from src.data.text import (
    CLS_ID,
    PAD_ID,
    SPLITS,
    PaddedSplits,
    check_counts,
    check_splits,
    checkpoint_tokenizer,
    load_tokenizer,
    load_tokenizer_file,
    train_tokenizer,
)
from src.utils.checkpoint import load_checkpoint
from src.utils.errors import PipelineError
from src.utils.files import atomic_dir

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the processed layout changes, so old folders are rebuilt
IGNORE = -100  # label of tokens that carry none (CLS, padding, later sub-tokens of a word)
TASKS = {"cls": "shakespeare_speakers", "tag": "python_tokens"}  # task -> its built-in source
PY_TAGS = ("NAME", "KEYWORD", "OP", "NUMBER", "STRING", "COMMENT")
# a speech: "NAME:" at the start of the text or after a blank line, then non-blank lines
SPEECH = re.compile(r"(?:\A|(?<=\n\n))([^\n:]+):\n((?:[^\n]+(?:\n|\Z))+)")


# --------------------------------------------------------------------------- examples


@dataclass
class Examples:
    """Labelled examples before splitting. x: texts (cls) or word lists (tag); y: label values
    (cls) or tag lists (tag); split: "train"/"val"/"test" per example when the data has them.
    A built-in corpus may bring its raw text and the span of every example in it."""

    x: list
    y: list
    split: list[str] | None = None
    names: list | None = None  # label names in id order; None = sorted unique values of y
    raw_text: str | None = None
    spans: list[tuple[int, int]] | None = None


def shakespeare_speakers(text: str, num_classes: int) -> Examples:
    """The speeches of the `num_classes` speakers with the most speeches (ties by name)."""
    speeches = [(m[1], m[2].rstrip("\n"), m.span()) for m in SPEECH.finditer(text)]
    counts: dict[str, int] = {}
    for speaker, _, _ in speeches:
        counts[speaker] = counts.get(speaker, 0) + 1
    if not 2 <= num_classes <= len(counts):
        raise PipelineError(
            f"data.num_classes={num_classes}: choose between 2 and the {len(counts)} speakers"
        )
    top = sorted(counts, key=lambda s: (-counts[s], s))[:num_classes]
    kept = [s for s in speeches if s[0] in set(top)]
    return Examples(
        x=[s[1] for s in kept],
        y=[s[0] for s in kept],
        names=sorted(top),
        raw_text=text,
        spans=[s[2] for s in kept],
    )


def python_tokens(max_files: int, chunk_lines: int) -> Examples:
    """Chunks of stdlib sources with a PY_TAGS category per token (files spread evenly over the
    sorted stdlib; files that do not tokenize are skipped)."""
    files = stdlib_files()
    files = files[:: max(1, len(files) // max(max_files, 1))][:max_files]
    x, y = [], []
    for f in files:
        try:
            toks = list(tokenize.generate_tokens(io.StringIO(f.read_text("utf-8")).readline))
        except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
            continue
        chunks: dict[int, tuple[list, list]] = {}
        for t in toks:
            tag = py_tag(t)
            if tag is not None:
                words, tags = chunks.setdefault((t.start[0] - 1) // chunk_lines, ([], []))
                words.append(t.string)
                tags.append(tag)
        for words, tags in chunks.values():
            x.append(words)
            y.append(tags)
    if not x:
        raise PipelineError("no Python tokens found in the standard library sources")
    return Examples(x=x, y=y, names=list(PY_TAGS))


def py_tag(t: tokenize.TokenInfo) -> str | None:
    if t.type == tokenize.NAME:
        return "KEYWORD" if keyword.iskeyword(t.string) else "NAME"
    name = tokenize.tok_name[t.type]
    if name.startswith("FSTRING_"):  # Python >= 3.12 splits f-strings into pieces
        return "STRING" if t.string else None
    return name if name in PY_TAGS else None  # NEWLINE, NL, INDENT, DEDENT, ... carry no word


def read_labelled(path: Path, task: str) -> Examples:
    """The user's CSV (text,label[,split]) or JSONL (text/label or tokens/tags [, split])."""
    if not path.is_file():
        raise PipelineError(f"labelled data not found: {path}")
    keys = ("text", "label") if task == "cls" else ("tokens", "tags")
    if path.suffix.lower() == ".csv":
        if task != "cls":
            raise PipelineError(f"{path}: tagging data must be JSONL with tokens and tags")
        reader = csv.DictReader(io.StringIO(_utf8(path), newline=""))
        if not reader.fieldnames:
            raise PipelineError(f"labelled data is empty: {path}")
        missing = [k for k in keys if k not in reader.fieldnames]
        if missing:
            raise PipelineError(
                f"{path} lacks the column(s) {', '.join(missing)} "
                f"(has {', '.join(reader.fieldnames)})"
            )
        rows = []
        try:
            for i, r in enumerate(reader):
                rows.append((i + 2, r))  # line numbers count the header
        except csv.Error as e:  # e.g. a field past csv's size limit (131072 characters)
            raise PipelineError(f"{path} line {len(rows) + 2}: {e}") from None
    elif path.suffix.lower() in (".jsonl", ".json"):
        rows = []
        for i, line in enumerate(_utf8(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise PipelineError(f"{path} line {i} is not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise PipelineError(f"{path} line {i} is not a JSON object")
            missing = [k for k in keys if k not in row]
            if missing:
                raise PipelineError(f"{path} line {i} lacks the key(s) {', '.join(missing)}")
            rows.append((i, row))
    else:
        raise PipelineError(f"{path}: labelled data must be .csv or .jsonl")
    if not rows:
        raise PipelineError(f"labelled data is empty: {path}")

    x, y, split = [], [], []
    for line, row in rows:
        a, b = row[keys[0]], row[keys[1]]
        if task == "cls" and (a is None or b is None or str(b).strip() == ""):
            raise PipelineError(f"{path} line {line} has no {keys[0] if a is None else keys[1]}")
        if task == "tag" and not (
            isinstance(a, list) and isinstance(b, list) and len(a) == len(b) > 0
        ):
            raise PipelineError(f"{path} line {line}: tokens and tags must be equal-length lists")
        # JSON's NaN and 1e999 (inf) parse as floats, which would become a class named "nan"
        labels = b if task == "tag" else [b]
        if any(isinstance(v, float) and not math.isfinite(v) for v in labels):
            raise PipelineError(f"{path} line {line}: a label is NaN or infinite, not a class")
        x.append(str(a) if task == "cls" else [str(w) for w in a])
        y.append(b)
        s = row.get("split")
        if s is not None and s not in SPLITS:
            raise PipelineError(f"{path} line {line}: split {s!r} is none of {', '.join(SPLITS)}")
        split.append(s)
    has_split = [s is not None for s in split]
    if any(has_split) and not all(has_split):
        raise PipelineError(f"{path}: some examples have a split and some do not")
    return Examples(x=x, y=y, split=split if all(has_split) else None)


def _utf8(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")  # newlines as they are: csv reads them itself
    except UnicodeDecodeError:
        raise PipelineError(f"labelled data {path} is not UTF-8 text") from None


def label_names(values) -> list:
    """Sorted distinct labels: integers (or strings of digits) numerically, anything else as
    strings."""
    values = set(values)
    try:
        ints = {v: int(v) for v in values if not isinstance(v, (bool, float))}
        if len(ints) == len(values) and all(str(i) == str(v).strip() for v, i in ints.items()):
            return sorted(set(ints.values()))
    except ValueError:
        pass
    return sorted({str(v) for v in values})


def label_key(value, names: list):
    return int(value) if names and isinstance(names[0], int) else str(value)


# --------------------------------------------------------------------------- splitting, encoding


def split_ids(strata: np.ndarray, fractions, seed: int) -> np.ndarray:
    """0/1/2 (train/val/test) per example: within each stratum a seeded permutation cut by
    `fractions` (val and test rounded, train the rest)."""
    rng = np.random.default_rng(seed)
    out = np.zeros(len(strata), dtype=np.int64)
    for s in np.unique(strata):
        idx = rng.permutation(np.flatnonzero(strata == s))
        n_val, n_test = (round(f * len(idx)) for f in fractions[1:])
        out[idx[len(idx) - n_val - n_test : len(idx) - n_test]] = 1
        out[idx[len(idx) - n_test :]] = 2
    return out


def encode(tok, task: str, x: list, y: list) -> tuple[list[list[int]], list]:
    """[CLS] + ids per example; for tag also the label per id (first sub-token of each word)."""
    if task == "cls":
        return [[CLS_ID, *e.ids] for e in tok.encode_batch(x)], y
    encs = tok.encode_batch([spaced(words) for words in x], is_pretokenized=True)
    ids, labels = [], []
    for e, tags in zip(encs, y, strict=True):
        lab, prev = [IGNORE], None
        for w in e.word_ids:
            lab.append(tags[w] if w is not None and w != prev else IGNORE)
            prev = w
        ids.append([CLS_ID, *e.ids])
        labels.append(lab)
    return ids, labels


def spaced(words: list[str]) -> list[str]:
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def fingerprint_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def without_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` without the given spans, each with the newline that follows it (the blank line
    that separates blocks)."""
    pieces, pos = [], 0
    for lo, hi in sorted(spans):
        pieces.append(text[pos:lo])
        pos = hi + (text[hi : hi + 1] == "\n")
    return "".join([*pieces, text[pos:]])


def write_split(stem: Path, members: np.ndarray, x: list, y: list, ids: list, labels: list,
                tag: bool, num_classes: int) -> dict:  # fmt: skip
    """`{stem}.npz` (the encoded examples) and `{stem}.jsonl` (the raw ones); returns counts."""
    lens = np.array([len(ids[i]) for i in members], dtype=np.int64)
    if tag:
        lab = np.array([v for i in members for v in labels[i]], dtype=np.int64)
        per_label = np.array([v for i in members for v in y[i]], dtype=np.int64)
    else:
        lab = per_label = np.array([y[i] for i in members], dtype=np.int64)
    np.savez(
        stem.with_suffix(".npz"),
        ids=np.array([t for i in members for t in ids[i]], dtype=np.int32),
        offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
        labels=lab,
    )
    keys = ("tokens", "tags") if tag else ("text", "label")
    with open(stem.with_suffix(".jsonl"), "w", encoding="utf-8") as f:
        for i in members:
            f.write(json.dumps({keys[0]: x[i], keys[1]: y[i]}, ensure_ascii=False) + "\n")
    return {
        "examples": len(members),
        "tokens": int(lens.sum()),
        "max_length": int(lens.max(initial=0)),
        "counts": np.bincount(per_label, minlength=num_classes).tolist(),
    }


# --------------------------------------------------------------------------- batches


class LabelledSequences(Dataset):
    """The examples of one split, each cut to its first `block_size` tokens."""

    def __init__(self, path: Path, block_size: int, tag: bool):
        with np.load(path) as z:
            self.ids, self.offsets, self.labels = z["ids"], z["offsets"], z["labels"]
        self.block_size, self.tag = block_size, tag

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int):
        lo = self.offsets[i]
        hi = min(self.offsets[i + 1], lo + self.block_size)
        return self.ids[lo:hi], self.labels[lo:hi] if self.tag else self.labels[i]


def pad_batch(items: list, tag: bool) -> dict[str, torch.Tensor]:
    """input_ids (B, T) padded with PAD to the longest example; labels (B,) or (B, T) with -100
    on the padding."""
    t = max(len(ids) for ids, _ in items)
    x = torch.full((len(items), t), PAD_ID, dtype=torch.long)
    y = torch.full((len(items), t), IGNORE, dtype=torch.long) if tag else None
    for i, (ids, lab) in enumerate(items):
        x[i, : len(ids)] = torch.from_numpy(ids.astype(np.int64))
        if tag:
            y[i, : len(lab)] = torch.from_numpy(lab.astype(np.int64))
    if not tag:
        y = torch.tensor([int(lab) for _, lab in items], dtype=torch.long)
    return {"input_ids": x, "labels": y}


# --------------------------------------------------------------------------- data module


class TextClsDataModule(PaddedSplits):
    """Batches {"input_ids": (B, T), "labels": (B,)} (task cls) or {"input_ids": (B, T),
    "labels": (B, T)} (task tag): T <= block_size, input_ids[:, 0] is CLS (id 3), PAD (id 2)
    after each example's end, label -100 where a token carries none."""

    def __init__(
        self,
        processed_dir: str,
        task: str = "cls",
        source: str | None = None,
        path: str | None = None,
        name: str | None = None,
        dataset: str = "tinyshakespeare",
        raw_dir: str = "data/raw",
        mirror: str | None = None,
        num_classes: int = 8,
        python_files: int = 200,
        chunk_lines: int = 8,
        splits: tuple[float, float, float] = (0.8, 0.1, 0.1),
        split_seed: int = 0,
        vocab_size: int = 2048,
        tokenizer_file: str | None = None,
        pretrained: str | None = None,
        block_size: int = 128,
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__()
        if task not in TASKS:
            raise PipelineError(f"data.task={task!r}: choose one of {', '.join(TASKS)}")
        source = source or TASKS[task]
        if path is None and source != TASKS[task]:
            raise PipelineError(
                f"data.source={source!r} does not fit task {task}; use {TASKS[task]} or data.path"
            )
        if name is not None:
            plain_name(name)
        check_counts(block_size=block_size, batch_size=batch_size, vocab_size=vocab_size)
        if block_size < 2:
            raise PipelineError(f"data.block_size={block_size} leaves no room after CLS")
        check_splits(splits)
        self.save_hyperparameters(logger=False)
        self.hparams.source = source
        self.processed_dir = Path(processed_dir)
        self._raw: dict[str, list[dict]] = {}
        self.splits: dict[str, LabelledSequences] = {}

    # -- preparation
    def _input_file(self) -> Path:
        hp = self.hparams
        if hp.path is not None:
            return Path(hp.path).expanduser()
        folder = fetch(hp.dataset, hp.raw_dir, hp.mirror)  # the speeches' plays
        return folder / lookup(hp.dataset).files[0]

    def _settings(self) -> dict:
        hp = self.hparams
        s = {"format": FORMAT, "task": hp.task, "splits": list(hp.splits),
             "split_seed": hp.split_seed}  # fmt: skip
        if hp.path is None and hp.source == "python_tokens":
            files = stdlib_files()
            s.update(source=hp.source, python=sys.version.split()[0], stdlib=len(files),
                     python_files=hp.python_files, chunk_lines=hp.chunk_lines)  # fmt: skip
        else:
            f = self._input_file()
            if not f.is_file():
                raise PipelineError(f"labelled data not found: {f}")
            s.update(input=str(f), input_sha256=fingerprint_file(f))
            if hp.path is None:
                s.update(source=hp.source, num_classes=hp.num_classes)
        given = self.given_tokenizer
        if given is not None:
            s["tokenizer_sha256"] = hashlib.sha256(given.encode()).hexdigest()
        else:
            s["vocab_size"] = hp.vocab_size
        return s

    @functools.cached_property
    def given_tokenizer(self) -> str | None:
        """The tokenizer (JSON) the data must be encoded with, None to train one on the train
        texts: a pre-trained encoder's (`pretrained`, model.pretrained: a pre-trained model
        brings its tokenizer, as in HF), or `tokenizer_file`. Both given must agree."""
        hp = self.hparams
        file = load_tokenizer_file(hp.tokenizer_file).to_str() if hp.tokenizer_file else None
        if not hp.pretrained:
            return file
        tok = checkpoint_tokenizer(load_checkpoint(hp.pretrained))
        if tok is None:
            raise PipelineError(f"the checkpoint {hp.pretrained} carries no tokenizer")
        if file is not None and file != tok:
            raise PipelineError(
                f"data.tokenizer_file={hp.tokenizer_file} is not the tokenizer the pre-trained "
                f"encoder in {hp.pretrained} learnt; drop data.tokenizer_file (model.pretrained "
                "brings its own)"
            )
        return tok

    def _up_to_date(self, settings: dict, fingerprint: str) -> bool:
        """Whether `processed_dir` holds these examples, encoded as asked: the same fingerprint,
        or the same inputs already encoded with the very tokenizer given (e.g. the one an encoder
        was pre-trained with on this folder), which must not rebuild it."""
        meta_path = self.processed_dir / "meta.json"
        if not meta_path.exists():
            return False
        meta = json.loads(meta_path.read_text())
        if meta.get("fingerprint") == fingerprint:
            return True
        given, tok_keys = self.given_tokenizer, ("vocab_size", "tokenizer_sha256")
        inputs = [
            {k: v for k, v in s.items() if k not in tok_keys} for s in (meta["settings"], settings)
        ]
        tok_file = self.processed_dir / "tokenizer.json"
        return (given is not None and inputs[0] == inputs[1] and tok_file.is_file()
                and load_tokenizer(tok_file.read_text()).to_str() == given)  # fmt: skip

    def _examples(self) -> Examples:
        hp = self.hparams
        if hp.path is not None:
            return read_labelled(self._input_file(), hp.task)
        if hp.source == "python_tokens":
            return python_tokens(hp.python_files, hp.chunk_lines)
        return shakespeare_speakers(self._input_file().read_text(encoding="utf-8"), hp.num_classes)

    def _tokenizer_for(self, train_texts: list[str]):
        given = self.given_tokenizer
        if given is None:
            return train_tokenizer("bpe", train_texts, self.hparams.vocab_size)
        return load_tokenizer(given)

    def prepare_data(self) -> None:
        """Build `processed_dir` unless it is there for the same inputs and settings."""
        hp = self.hparams
        settings = self._settings()
        fingerprint = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]
        if self._up_to_date(settings, fingerprint):
            return
        where = hp.path or hp.source
        log.info("preparing labelled text (%s, task %s) -> %s", where, hp.task, self.processed_dir)

        ex = self._examples()
        tag = hp.task == "tag"
        names = ex.names or label_names([v for tags in ex.y for v in tags] if tag else ex.y)
        index = {label_key(n, names): i for i, n in enumerate(names)}
        if tag:
            y = [[index[label_key(v, names)] for v in tags] for tags in ex.y]
        else:
            y = [index[label_key(v, names)] for v in ex.y]
        if ex.split is not None:
            part = np.array([SPLITS.index(s) for s in ex.split], dtype=np.int64)
        else:
            strata = np.zeros(len(y), dtype=np.int64) if tag else np.asarray(y)
            part = split_ids(strata, hp.splits, hp.split_seed)
        counts = np.bincount(part, minlength=3)
        for k, name in enumerate(SPLITS[:2]):
            if counts[k] == 0:
                raise PipelineError(f"the {name} split of {where} has no examples")

        texts = [" ".join(x) if tag else x for x in ex.x]
        tok = self._tokenizer_for([t for t, p in zip(texts, part, strict=True) if p == 0])
        ids, labels = encode(tok, hp.task, ex.x, y)

        if ex.raw_text is not None:
            held_out = [sp for sp, p in zip(ex.spans, part, strict=True) if p > 0]
            corpus = without_spans(ex.raw_text, held_out)
        else:
            corpus = "\n\n".join(t for t, p in zip(texts, part, strict=True) if p == 0) + "\n"

        meta = {"fingerprint": fingerprint, "task": hp.task, "vocab_size": tok.get_vocab_size(),
                "num_classes": len(names), "settings": settings}  # fmt: skip
        with atomic_dir(self.processed_dir) as tmp:
            stats = {}
            for k, split in enumerate(SPLITS):
                members = np.flatnonzero(part == k)
                n = len(names)
                stats[split] = write_split(tmp / split, members, ex.x, y, ids, labels, tag, n)
            for key in ("examples", "tokens", "max_length"):
                meta[key] = {split: st[key] for split, st in stats.items()}
            meta["counts"] = {
                split: {str(n): c for n, c in zip(names, st["counts"], strict=True)}
                for split, st in stats.items()
            }
            tok.save(str(tmp / "tokenizer.json"))
            (tmp / "labels.json").write_text(json.dumps(names, ensure_ascii=False))
            (tmp / "corpus.txt").write_text(corpus, encoding="utf-8")
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False))
        log.info("examples %s, labels %d, vocabulary %d", meta["examples"], len(names),
                 meta["vocab_size"])  # fmt: skip

    # -- what was prepared
    @property
    def label_names(self) -> list:
        return json.loads((self.processed_dir / "labels.json").read_text())

    @property
    def model_kwargs(self) -> dict:
        meta = self.meta
        return {"vocab_size": meta["vocab_size"], "num_classes": meta["num_classes"]}

    def _rows(self, split: str) -> list[dict]:
        if split not in SPLITS:
            raise PipelineError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
        if split not in self._raw:
            lines = (self.processed_dir / f"{split}.jsonl").read_text(encoding="utf-8")
            self._raw[split] = [json.loads(line) for line in lines.splitlines()]
        return self._raw[split]

    def texts(self, split: str) -> list:
        """The raw examples of a split: texts (cls) or word lists (tag)."""
        key = "tokens" if self.hparams.task == "tag" else "text"
        return [r[key] for r in self._rows(split)]

    def labels(self, split: str) -> list:
        """Label ids of a split: one per example (cls) or a list per example (tag)."""
        key = "tags" if self.hparams.task == "tag" else "label"
        return [r[key] for r in self._rows(split)]

    # -- loading
    def setup(self, stage: str | None = None) -> None:
        meta = self.meta
        for split in SPLITS:
            if meta["examples"][split]:
                self.splits[split] = LabelledSequences(
                    self.processed_dir / f"{split}.npz",
                    self.hparams.block_size,
                    tag=meta["task"] == "tag",
                )

    def trivial_targets(self, split: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The labels of the training examples and of `split`'s: one per example (cls) or per
        token (tag); None when the data has no such split."""
        if split not in self.splits:
            return None
        return tuple(
            torch.from_numpy(self.splits[s].labels.astype(np.int64)) for s in ("train", split)
        )

    def collate(self, items: list) -> dict[str, torch.Tensor]:
        return pad_batch(items, tag=self.hparams.task == "tag")

    # -- the tokenizer and label names travel inside every checkpoint
    def state_dict(self) -> dict:
        return {**super().state_dict(), "labels": self.label_names}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "labels" in state and state["labels"] != self.label_names:
            raise PipelineError("the checkpoint was trained on other labels than this data has")
