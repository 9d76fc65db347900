"""Sentence pairs for translation (Bishop 12.3.5): source<TAB>target lines -> BPE ids.

Preparation (the DVC stage `prepare_translation`, or the first run; skipped while the settings
fingerprint in meta.json matches):
  pairs (the user's TSV through `path`, a registered dataset such as `dataset=eng-nld`, or the
  built-in number pairs) -> a seeded train/val/test split of the distinct source sentences, so
  that the several translations many sentences have never leak from train into val or test
  -> byte-level BPE trained on the train pairs, one vocabulary for both languages or one each
  (`shared_vocab`) -> every pair encoded, written atomically into `processed_dir`:

    tokenizer.json         the source tokenizer (the only one when the vocabulary is shared)
    target_tokenizer.json  the target tokenizer, when it is not
    {split}.npz            src / tgt ids (int32, concatenated) and their offsets (n + 1)
    {split}.tsv            the raw pairs, for BLEU against every reference of a source
    meta.json              sizes, settings, pairs dropped for being longer than max_length

A TSV line is `source<TAB>target[<TAB>anything]` (the Tatoeba / Anki export); a line with no tab
or an empty side stops preparation with its line number, so pairs can never be misaligned.

Batches (HF's names): input_ids (B, S) the source, decoder_input_ids (B, T) = EOS + target (the
end-of-text token also starts a sentence, as GPT-2 separates documents), labels (B, T) = target
+ EOS; PAD (id 2) after each sentence in the inputs, -100 in the labels.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import random
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from src.data.sources import fetch, lookup
from src.data.text import (
    EOS,
    PAD_ID,
    SPECIAL_TOKENS,
    SPLITS,
    PaddedSplits,
    load_tokenizer,
    train_tokenizer,
)
from src.data.text_cls import fingerprint_file
from src.utils.errors import PipelineError
from src.utils.files import atomic_dir

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the processed layout changes
IGNORE = -100  # label of padding, skipped by the loss
EOS_ID = SPECIAL_TOKENS.index(EOS)  # ends a target, and starts it in the decoder's input


# --------------------------------------------------------------------------- raw pairs


def read_pairs(path: Path) -> list[tuple[str, str]]:
    """(source, target) of every non-blank line of a TSV file; a malformed line is an error."""
    if not path.is_file():
        raise PipelineError(f"translation pairs not found: {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise PipelineError(f"{path} is not UTF-8 text") from None
    pairs, bad = [], []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split("\t")]
        if len(cols) < 2 or not cols[0] or not cols[1]:
            bad.append(n)
            continue
        pairs.append((cols[0], cols[1]))
    if bad:
        raise PipelineError(
            f"{path}: {len(bad)} line(s) are not source<TAB>target with both sides non-empty, "
            f"first at line {bad[0]}: {lines[bad[0] - 1][:60]!r}"
        )
    if not pairs:
        raise PipelineError(f"{path} holds no sentence pairs")
    return pairs


def number_pairs() -> list[tuple[str, str]]:
    """English -> Dutch, written out by num2words and CLDR (babel): the cardinals 0-9999
    ("twenty-one" -> "eenentwintig": Dutch says the units first), the ordinals 1-1000 and 2,000
    dates from 1900-2099 ("Tuesday, March 5, 2024" -> "dinsdag 5 maart 2024"). Deterministic."""
    from babel.dates import format_date
    from num2words import num2words

    pairs = [(num2words(n, lang="en"), num2words(n, lang="nl")) for n in range(10_000)]
    pairs += [(num2words(n, lang="en", to="ordinal"), num2words(n, lang="nl", to="ordinal"))
              for n in range(1, 1001)]  # fmt: skip
    rng, first = random.Random(0), datetime.date(1900, 1, 1)
    days = rng.sample(range((datetime.date(2099, 12, 31) - first).days), 2000)
    dates = [first + datetime.timedelta(d) for d in days]
    pairs += [(format_date(d, "full", locale="en"), format_date(d, "full", locale="nl"))
              for d in dates]  # fmt: skip
    return pairs


def references(tsv: Path) -> tuple[list[str], list[list[str]]]:
    """The distinct sources of a prepared split's pairs, in file order, and all their targets."""
    refs: dict[str, list[str]] = {}
    for line in tsv.read_text("utf-8").splitlines():
        source, target = line.split("\t")
        refs.setdefault(source, []).append(target)
    return list(refs), list(refs.values())


def split_by_source(
    pairs: list[tuple[str, str]], fractions, seed: int
) -> dict[str, list[tuple[str, str]]]:
    """Seeded train/val/test parts of the distinct sources; a source's pairs stay together."""
    sources = sorted({s for s, _ in pairs})
    random.Random(seed).shuffle(sources)
    cuts = np.cumsum([0, *fractions])
    cuts = [round(c * len(sources)) for c in cuts[:-1]] + [len(sources)]
    part = {s: SPLITS[i] for i in range(3) for s in sources[cuts[i] : cuts[i + 1]]}
    return {name: [p for p in pairs if part[p[0]] == name] for name in SPLITS}


# --------------------------------------------------------------------------- batches


class SentencePairs(Dataset):
    """The encoded pairs of one split: (source ids, target ids) as int arrays."""

    def __init__(self, path: Path):
        with np.load(path) as z:
            self.src, self.src_off, self.tgt, self.tgt_off = (
                z[k] for k in ("src", "src_offsets", "tgt", "tgt_offsets")
            )

    def __len__(self) -> int:
        return len(self.src_off) - 1

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.src[self.src_off[i] : self.src_off[i + 1]],
                self.tgt[self.tgt_off[i] : self.tgt_off[i + 1]])  # fmt: skip


def pad(rows: list, value: int) -> torch.Tensor:
    """Rows of different lengths -> (B, longest), `value` after each row's end."""
    out = torch.full((len(rows), max(map(len, rows))), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out


def collate_pairs(items: list) -> dict[str, torch.Tensor]:
    src = [s for s, _ in items]
    tgt = [t.tolist() for _, t in items]
    return {
        "input_ids": pad(src, PAD_ID),  # (B, S)
        "decoder_input_ids": pad([[EOS_ID, *t] for t in tgt], PAD_ID),  # (B, T)
        "labels": pad([[*t, EOS_ID] for t in tgt], IGNORE),  # (B, T)
    }


# --------------------------------------------------------------------------- data module


class TranslationDataModule(PaddedSplits):
    """Padded batches of sentence pairs (see the module docstring), and every split's distinct
    sources with all their references, for BLEU."""

    def __init__(
        self,
        processed_dir: str,
        name: str | None = None,
        path: str | None = None,
        dataset: str | None = None,
        raw_dir: str = "data/raw",
        mirror: str | None = None,
        shared_vocab: bool = True,
        vocab_size: int = 4000,
        max_length: int = 64,
        splits: tuple[float, float, float] = (0.9, 0.05, 0.05),
        split_seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__()
        if abs(sum(splits) - 1) > 1e-6 or min(splits) <= 0:
            raise PipelineError(f"data.splits={list(splits)} must be positive and sum to 1")
        self.save_hyperparameters(logger=False)
        self.processed_dir = Path(processed_dir)
        self.splits: dict[str, SentencePairs] = {}
        self._target_tokenizer = None

    # -- preparation
    def _input_file(self) -> Path | None:
        hp = self.hparams
        if hp.path is not None:
            return Path(hp.path).expanduser()
        if hp.dataset is not None:
            return fetch(hp.dataset, hp.raw_dir, hp.mirror) / lookup(hp.dataset).files[0]
        return None  # the built-in number pairs

    def prepare_data(self) -> None:
        hp, f = self.hparams, self._input_file()
        settings = {"format": FORMAT, "splits": list(hp.splits), "split_seed": hp.split_seed,
                    "shared_vocab": hp.shared_vocab, "vocab_size": hp.vocab_size,
                    "max_length": hp.max_length}  # fmt: skip
        settings.update({"input": str(f), "sha256": fingerprint_file(f)} if f else {"input": None})
        fingerprint = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]
        meta_path = self.processed_dir / "meta.json"
        if meta_path.exists() and json.loads(meta_path.read_text())["fingerprint"] == fingerprint:
            return
        pairs = read_pairs(f) if f is not None else number_pairs()
        parts = split_by_source(pairs, hp.splits, hp.split_seed)
        src_train = [s for s, _ in parts["train"]]
        tgt_train = [t for _, t in parts["train"]]
        log.info("training BPE on %d train pairs -> %s", len(src_train), self.processed_dir)
        if hp.shared_vocab:
            src_tok = tgt_tok = train_tokenizer("bpe", src_train + tgt_train, hp.vocab_size)
        else:
            src_tok = train_tokenizer("bpe", src_train, hp.vocab_size)
            tgt_tok = train_tokenizer("bpe", tgt_train, hp.vocab_size)
        meta = {"fingerprint": fingerprint, "settings": settings, "pairs": {}, "dropped": {},
                "vocab_size": tgt_tok.get_vocab_size(),
                "src_vocab_size": src_tok.get_vocab_size()}  # fmt: skip
        with atomic_dir(self.processed_dir) as tmp:
            for split, kept in parts.items():
                src = [e.ids for e in src_tok.encode_batch([s for s, _ in kept])]
                tgt = [e.ids for e in tgt_tok.encode_batch([t for _, t in kept])]
                # the target gains EOS at both ends: at most max_length - 1 tokens of its own
                fits = [len(s) <= hp.max_length and len(t) < hp.max_length
                        for s, t in zip(src, tgt, strict=True)]  # fmt: skip
                keep = [i for i, ok in enumerate(fits) if ok]
                write_pairs(tmp / split, [kept[i] for i in keep], [src[i] for i in keep],
                            [tgt[i] for i in keep])  # fmt: skip
                meta["pairs"][split], meta["dropped"][split] = len(keep), len(kept) - len(keep)
            if not meta["pairs"]["train"]:
                raise PipelineError(f"no training pair fits data.max_length={hp.max_length}")
            src_tok.save(str(tmp / "tokenizer.json"))
            if not hp.shared_vocab:
                tgt_tok.save(str(tmp / "target_tokenizer.json"))
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if any(meta["dropped"].values()):
            log.warning("pairs longer than data.max_length=%d tokens, left out: %s",
                        hp.max_length, meta["dropped"])  # fmt: skip
        log.info("pairs: %s", meta["pairs"])

    # -- what was prepared
    @property
    def target_tokenizer(self):
        if self._target_tokenizer is None:
            f = self.processed_dir / "target_tokenizer.json"
            self._target_tokenizer = load_tokenizer(f.read_text()) if f.exists() else self.tokenizer
        return self._target_tokenizer

    @property
    def model_kwargs(self) -> dict:
        meta = self.meta
        return {"vocab_size": meta["vocab_size"], "src_vocab_size": meta["src_vocab_size"],
                "shared_vocab": meta["settings"]["shared_vocab"]}  # fmt: skip

    def references(self, split: str) -> tuple[list[str], list[list[str]]]:
        """The distinct sources of a split, in file order, and all the targets of each."""
        return references(self.processed_dir / f"{split}.tsv")

    # -- loading
    def setup(self, stage: str | None = None) -> None:
        for split in SPLITS:
            if self.meta["pairs"][split]:
                self.splits[split] = SentencePairs(self.processed_dir / f"{split}.npz")

    def collate(self, items: list) -> dict[str, torch.Tensor]:
        return collate_pairs(items)

    # -- both tokenizers travel inside every checkpoint
    def state_dict(self) -> dict:
        return {**super().state_dict(), "target_tokenizer": self.target_tokenizer.to_str()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if state.get("target_tokenizer", self.target_tokenizer.to_str()) != (
            self.target_tokenizer.to_str()
        ):
            raise PipelineError("the checkpoint was trained with another target tokenizer")


def write_pairs(stem: Path, pairs: list, src: list[list[int]], tgt: list[list[int]]) -> None:
    """`{stem}.npz` (the encoded pairs) and `{stem}.tsv` (the raw ones)."""

    def flat(rows):
        off = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        return np.array([t for r in rows for t in r], dtype=np.int32), off

    (s, s_off), (t, t_off) = flat(src), flat(tgt)
    np.savez(stem.with_suffix(".npz"), src=s, src_offsets=s_off, tgt=t, tgt_offsets=t_off)
    with open(stem.with_suffix(".tsv"), "w", encoding="utf-8") as f:
        f.writelines(f"{a}\t{b}\n" for a, b in pairs)
