"""Text corpora for language modelling: tokenizers, and windows sampled from token memmaps.

Preparation (the DVC stage `prepare_text`, or the first run that needs it; src/data/corpus.py):
  documents (text files, JSONL / Parquet rows, a saved or Hub dataset) -> tokenizer
  (character-level, byte-level BPE or word-level, trained with HF `tokenizers`)
  -> one token stream, documents separated by <|endoftext|> -> train/val/test parts
  -> `{train,val,test}.bin` (uint16/uint32 memmaps), `tokenizer.json`, `meta.json`.
This is nanoGPT's scheme: the training loader then draws random windows of block_size + 1 tokens.

The default corpus is the Python standard library's own sources (about 12 MB of human-written
code and docstrings), which every machine that runs this pipeline has, network or not.

    python -m src.prepare data=shakespeare          # prepare only (the DVC stage)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from src.data.sources import fetch, plain_name
from src.utils.errors import PipelineError

log = logging.getLogger(__name__)

EOS, UNK, PAD, CLS, SEP, MASK = "<|endoftext|>", "<unk>", "<pad>", "<cls>", "<sep>", "<mask>"
SPECIAL_TOKENS = [EOS, UNK, PAD, CLS, SEP, MASK]  # ids 0..5 in every tokenizer built here
PAD_ID, CLS_ID, MASK_ID = (SPECIAL_TOKENS.index(t) for t in (PAD, CLS, MASK))
SPLITS = ("train", "val", "test")


# --------------------------------------------------------------------------- tokenizers


def train_tokenizer(kind: str, docs: Iterable[str], vocab_size: int | None = None,
                    min_count: int = 1):  # fmt: skip
    """Character-level, byte-level BPE or word-level, all as HF `tokenizers.Tokenizer`s with the
    same special tokens, so that one encode/decode/save path serves them all.

    Character level is BPE with the corpus's characters as vocabulary and no merges. Word level
    (word2vec's, sec. 12.2.1) lowercases the text and splits it into runs of letters and digits,
    runs of punctuation and line breaks (the lines of verse and code); the `vocab_size` most
    frequent words seen at least `min_count` times form the vocabulary, and any other word is
    <unk>. Decoding joins the words with spaces: lowercase and spacing are not restored.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if kind == "char":
        chars: set[str] = set()
        for doc in docs:
            chars |= set(doc)
        chars = sorted(chars)
        vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + chars)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
        tok.decoder = decoders.Fuse()
    elif kind == "bpe":
        if not vocab_size:
            raise PipelineError("data.vocab_size must be set for the bpe tokenizer")
        tok = Tokenizer(models.BPE(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(docs, trainer=trainer)
    elif kind == "word":
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        tok.normalizer = normalizers.Lowercase()
        # HF's Whitespace pre-tokenizer (keep the matches of \w+|[^\w\s]+, drop the rest),
        # keeping line breaks too: a word-level GPT then writes lines, and a "\n" prompt is a token
        tok.pre_tokenizer = pre_tokenizers.Split(
            Regex(r"\w+|[^\w\s]+|\n"), behavior="removed", invert=True
        )
        trainer = trainers.WordLevelTrainer(
            vocab_size=vocab_size or 2**31 - 1,  # None: every word seen min_count times
            min_frequency=min_count,
            special_tokens=SPECIAL_TOKENS,
            show_progress=False,
        )
        tok.train_from_iterator(docs, trainer=trainer)
    else:
        raise PipelineError(f"unknown tokenizer {kind!r}; choose char, bpe or word")
    tok.add_special_tokens(SPECIAL_TOKENS)  # never split "<mask>" etc. into characters
    return tok


def load_tokenizer(json_str: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json_str)


def load_tokenizer_file(path: str | Path):
    """A saved tokenizer.json, checked to hold the special tokens at the ids every model here
    assumes (0..5, as train_tokenizer builds them)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise PipelineError(f"tokenizer file not found: {path}")
    tok = load_tokenizer(path.read_text())
    if [tok.token_to_id(t) for t in SPECIAL_TOKENS] != list(range(len(SPECIAL_TOKENS))):
        raise PipelineError(
            f"tokenizer file {path} lacks the special tokens {SPECIAL_TOKENS} at ids "
            f"0..{len(SPECIAL_TOKENS) - 1}"
        )
    return tok


def check_splits(splits) -> None:
    """data.splits: three train/val/test fractions, train and val positive, summing to 1."""
    numbers = (
        isinstance(splits, (list, tuple))
        and len(splits) == 3
        and all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in splits)
    )
    # `not ... <=` rather than `>`: a NaN fraction fails every comparison
    if not numbers or not abs(sum(splits) - 1) <= 1e-6 or not min(splits[:2]) > 0 or splits[2] < 0:
        shown = list(splits) if isinstance(splits, (list, tuple)) else repr(splits)
        raise PipelineError(f"data.splits={shown} must be positive train/val and sum to 1")


def check_counts(**settings) -> None:
    """Settings that count something (tokens, examples, steps) must be positive integers: a
    value of another type would fail deep inside a library, far from its cause."""
    for key, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PipelineError(f"data.{key}={value!r} must be a positive integer")


# --------------------------------------------------------------------------- loading


class TokenWindows(Dataset):
    """Windows w of block_size + 1 tokens from a memmap, by start offset: x = w[:-1], y = w[1:].

    `__getitems__` fetches a whole batch with one fancy-indexing call instead of B slices.
    """

    def __init__(self, path: Path, dtype: str, block_size: int):
        self.data = np.memmap(path, dtype=dtype, mode="r")
        self.block_size = block_size
        self.n_starts = len(self.data) - block_size  # valid offsets: 0 .. n_starts - 1

    def __len__(self) -> int:
        return max(self.n_starts, 0)

    def __getitems__(self, offsets: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = np.asarray(offsets)[:, None] + np.arange(self.block_size + 1)  # (B, T + 1)
        w = torch.from_numpy(self.data[idx].astype(np.int64))
        return w[:, :-1], w[:, 1:]

    def __getitem__(self, offset: int):
        x, y = self.__getitems__([offset])
        return x[0], y[0]


def _identity(batch):
    return batch  # __getitems__ already returns the collated batch


class RandomWindowSampler(Sampler[int]):
    """Random window offsets, `batches` batches of `batch_size` per epoch, drawn as a pure
    function of (seed, epoch) where the epoch follows from the trainer's step count when the
    epoch's iteration starts. A resumed run therefore sees exactly the batches the uninterrupted
    run would have seen (batches already used in a partly finished epoch are skipped).
    Under DDP each rank takes every world-th offset of one shared draw."""

    def __init__(self, n_starts: int, batches: int, batch_size: int, seed: int,
                 rank: int = 0, world: int = 1, batches_done=lambda: 0):  # fmt: skip
        self.n_starts, self.batches, self.batch_size = n_starts, batches, batch_size
        self.seed, self.rank, self.world = seed, rank, world
        self.batches_done = batches_done  # () -> batches this process has trained on so far

    def __len__(self) -> int:
        return self.batches * self.batch_size

    def __iter__(self):
        epoch, done = divmod(self.batches_done(), self.batches)
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        draw = torch.randint(self.n_starts, (len(self) * self.world,), generator=g)
        return iter(draw[self.rank :: self.world][done * self.batch_size :].tolist())


def checkpoint_tokenizer(ckpt: dict) -> str | None:
    """The tokenizer (JSON) a checkpoint's text data module encoded text with, or None. Lightning
    saves a data module's `state_dict` in the checkpoint under its class name."""
    states = (ckpt.get(name) or {} for name in ("TextDataModule", "TextClsDataModule"))
    return next((s["tokenizer"] for s in states if "tokenizer" in s), None)


class PreparedText(pl.LightningDataModule):
    """A data module whose preparation wrote `processed_dir` with meta.json and tokenizer.json.
    The tokenizer travels inside every checkpoint, so a checkpoint alone can encode and decode
    text, and resuming with data prepared by another tokenizer is an error."""

    processed_dir: Path
    _tokenizer = None

    @property
    def meta(self) -> dict:
        return json.loads((self.processed_dir / "meta.json").read_text())

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer((self.processed_dir / "tokenizer.json").read_text())
        return self._tokenizer

    def state_dict(self) -> dict:
        return {"tokenizer": self.tokenizer.to_str()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("tokenizer") != self.tokenizer.to_str():
            raise PipelineError(
                "the checkpoint was trained with another tokenizer than this data config builds"
            )


class SplitLoaders:
    """The loaders of a data module whose `splits` are map-style datasets of whole examples:
    training batches shuffled (seeded), val and test in order, batched by `collate` (None:
    torch's default). Its hparams hold batch_size, seed and num_workers."""

    splits: dict[str, Dataset]
    collate = None

    def sampler(self, split: str) -> Iterable[int] | None:
        """The order of a split's examples when it is not plain (shuffled for training)."""
        return None

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        if split not in self.splits:
            raise PipelineError(f"the data has no {split} split (data.splits); run with test=false")
        hp = self.hparams
        sampler = self.sampler(split)
        shuffle = shuffle and sampler is None
        return DataLoader(
            self.splits[split],
            batch_size=hp.batch_size,
            shuffle=shuffle,
            sampler=sampler,
            generator=torch.Generator().manual_seed(hp.seed) if shuffle else None,
            collate_fn=self.collate,
            num_workers=hp.num_workers,
            persistent_workers=hp.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")


class LengthGroupedSampler(Sampler[int]):
    """Examples of varying lengths in an order whose runs of `batch_size` have like lengths, so
    that a batch padded to its longest wastes little: each epoch the examples are shuffled, cut
    into pools of `pool` batches, each pool sorted by length and cut into batches, and the
    batches shuffled (a last short one kept last, so that every batch the loader cuts from this
    order is one of them). The order is seeded by (seed, epoch), so every DDP rank draws the same
    one; Lightning's DistributedSamplerWrapper then gives rank r every W-th index of it, so under
    DDP `batch_size` is the global batch (a rank's x W): each rank's batch is then a W-th of one
    run of like lengths."""

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int, pool: int = 50):
        self.lengths, self.batch_size, self.seed, self.pool = lengths, batch_size, seed, pool
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1
        order, size, batches = rng.permutation(len(self.lengths)), self.batch_size * self.pool, []
        for i in range(0, len(order), size):
            part = order[i : i + size]
            part = part[np.argsort(self.lengths[part], kind="stable")]
            batches += [part[j : j + self.batch_size] for j in range(0, len(part), self.batch_size)]
        short = len(order) % self.batch_size != 0  # the last pool's last batch
        for b in [*rng.permutation(len(batches) - short), *[len(batches) - 1] * short]:
            yield from batches[b].tolist()


class PaddedSplits(SplitLoaders, PreparedText):
    """A prepared text data module whose examples are padded to the batch's longest by
    `collate`."""

    def collate(self, items: list) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class TextDataModule(PreparedText):
    """Language-modelling batches (x, y) of shape (B, T), y being x shifted by one token.

    An epoch is `steps_per_epoch` random batches (validation and checkpointing follow epochs);
    validation reads the first `val_tokens` tokens of its split (None: all), and test the whole
    test split, in non-overlapping windows.
    """

    def __init__(
        self,
        name: str,
        processed_dir: str,
        path: str | None = None,
        glob: str = "**/*",
        text_column: str = "text",
        hub: str | None = None,
        hub_config: str | None = None,
        hub_split: str = "train",
        streaming: bool = False,
        max_chars: int | None = None,
        dataset: str | None = None,
        raw_dir: str = "data/raw",
        mirror: str | None = None,
        tokenizer: str = "bpe",
        vocab_size: int | None = 4096,
        min_count: int = 1,
        tokenizer_file: str | None = None,
        tokenizer_sample: float | None = None,
        splits: tuple[float, float, float] = (0.9, 0.05, 0.05),
        split_by: str = "stream",
        split_seed: int = 0,
        num_proc: int | None = None,
        chunk_mb: float = 16,
        block_size: int = 128,
        batch_size: int = 32,
        steps_per_epoch: int = 500,
        val_tokens: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__()
        plain_name(name)
        check_counts(block_size=block_size, batch_size=batch_size, steps_per_epoch=steps_per_epoch,
                     min_count=min_count)  # fmt: skip
        optional = {"vocab_size": vocab_size, "num_proc": num_proc, "val_tokens": val_tokens}
        check_counts(**{key: value for key, value in optional.items() if value is not None})
        check_splits(splits)
        self.save_hyperparameters(logger=False)
        self.processed_dir = Path(processed_dir)
        self.splits: dict[str, TokenWindows] = {}

    # -- preparation: runs once, on one process per node
    def prepare_data(self) -> None:
        from src.data.corpus import Corpus, prepare_corpus

        hp = self.hparams
        path = hp.path
        if path is None and hp.dataset:  # a registered public corpus, fetched once
            path = fetch(hp.dataset, hp.raw_dir, hp.mirror)
        corpus = Corpus(path, hp.glob, hp.text_column, hp.hub, hp.hub_config, hp.hub_split,
                        hp.streaming, hp.max_chars)  # fmt: skip
        prepare_corpus(self.processed_dir, corpus, hp.tokenizer, hp.vocab_size, tuple(hp.splits),
                       hp.tokenizer_file, hp.min_count, hp.tokenizer_sample, hp.split_by,
                       hp.split_seed, hp.num_proc, hp.chunk_mb)  # fmt: skip

    @property
    def model_kwargs(self) -> dict:
        """What the model needs to know about the data (train.py passes it to the model)."""
        return {"vocab_size": self.meta["vocab_size"]}

    def counts(self, split: str = "train") -> np.ndarray:
        """(K,) how often each token occurs in a split: word2vec's unigram distribution."""
        data = np.memmap(self.processed_dir / f"{split}.bin", dtype=self.meta["dtype"], mode="r")
        return np.bincount(data, minlength=self.meta["vocab_size"])

    # -- loading: runs on every process
    def setup(self, stage: str | None = None) -> None:
        meta, t = self.meta, self.hparams.block_size
        for name in SPLITS:
            if meta["tokens"][name] == 0:
                continue
            ds = TokenWindows(self.processed_dir / f"{name}.bin", meta["dtype"], t)
            if len(ds) == 0:
                raise PipelineError(
                    f"the {name} split has {meta['tokens'][name]} tokens, fewer than one block of "
                    f"{t + 1}; use a larger corpus or a smaller data.block_size"
                )
            self.splits[name] = ds

    def _rank_world(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    def train_dataloader(self) -> DataLoader:
        hp, ds = self.hparams, self.splits["train"]
        rank, world = self._rank_world()
        sampler = RandomWindowSampler(
            ds.n_starts, hp.steps_per_epoch, hp.batch_size, hp.seed, rank, world,
            batches_done=self._batches_done,
        )  # fmt: skip
        return self._loader(ds, sampler)

    def _batches_done(self) -> int:
        """Training batches consumed so far; restored from the checkpoint on resume."""
        t = self.trainer
        return t.global_step * t.accumulate_grad_batches if t is not None else 0

    def _eval_loader(self, split: str, limit: int | None = None) -> DataLoader:
        ds = self.splits[split]
        rank, world = self._rank_world()
        end = ds.n_starts if limit is None else min(ds.n_starts, limit)
        offsets = list(range(0, end, self.hparams.block_size))[rank::world]
        return self._loader(ds, offsets)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val", self.hparams.val_tokens)

    def test_dataloader(self) -> DataLoader:
        if "test" not in self.splits:
            raise PipelineError("this corpus has no test split (data.splits); run with test=false")
        return self._eval_loader("test")

    def _loader(self, ds: Dataset, sampler) -> DataLoader:
        n = self.hparams.num_workers
        return DataLoader(
            ds,
            batch_size=self.hparams.batch_size,
            sampler=sampler,
            collate_fn=_identity,
            num_workers=n,
            persistent_workers=n > 0,
        )
