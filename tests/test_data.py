"""Text data: corpus discovery, download, tokenizers, memmap preparation, windows and sampling,
and the Lightning data module, all offline and on small corpora."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from src.data import chunks, corpus, text
from src.data.corpus import Corpus, corpus_files, prepare_corpus, stdlib_files
from src.data.text import (
    EOS,
    SPECIAL_TOKENS,
    RandomWindowSampler,
    TextDataModule,
    TokenWindows,
    load_tokenizer,
    train_tokenizer,
)
from src.utils.errors import PipelineError

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def shakespeare_text(shakespeare) -> str:
    return shakespeare.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def small_text(shakespeare_text) -> str:
    return shakespeare_text[:100_000]


@pytest.fixture
def small_file(tmp_path, small_text) -> Path:
    f = tmp_path / "small.txt"
    f.write_text(small_text, encoding="utf-8")
    return f


def encode_documents(tok, docs: list[str]) -> np.ndarray:
    """The stream prepare_corpus writes: each document's ids and an EOS, none after a lone one."""
    eos = tok.token_to_id(EOS)
    ids = [i for d in docs for i in [*tok.encode(d).ids, eos]]
    return np.asarray(ids[:-1] if len(docs) == 1 else ids)


def documents(source: Corpus) -> list[str]:
    """The corpus's documents, their pieces joined."""
    docs, parts = [], []
    for piece, ends, _ in source.pieces():
        parts.append(piece)
        if ends:
            docs.append("".join(parts))
            parts = []
    return docs


@pytest.fixture(scope="session")
def bpe(small_text):
    return train_tokenizer("bpe", [small_text], 400)


def bins(out_dir: Path, dtype: str) -> dict[str, np.ndarray]:
    return {s: np.fromfile(out_dir / f"{s}.bin", dtype=dtype) for s in text.SPLITS}


def leftovers(parent: Path) -> list[Path]:
    """Temporary folders prepare_corpus may have left next to its output."""
    return [p for p in parent.iterdir() if p.name.startswith(".")]


# --------------------------------------------------------------------------- raw text


def test_stdlib_default_corpus_is_megabytes_of_python_sources():
    """The default corpus is the stdlib's .py files, without tests or generated tables."""
    files = stdlib_files()
    assert files
    root = Path(sysconfig.get_paths()["stdlib"])
    excluded = {"test", "site-packages", "encodings"}
    total = 0
    for f in files:
        assert f.suffix == ".py"
        assert not excluded & set(f.relative_to(root).parts), f
        total += len(f.read_bytes().decode("utf-8"))
    assert total > 3_000_000
    assert corpus_files(None, "**/*") == files


def test_corpus_files_file_folder_and_errors(tmp_path):
    """A file is its own corpus; a folder yields its sorted glob matches; else PipelineError."""
    one = tmp_path / "one.txt"
    one.write_text("hello")
    assert corpus_files(str(one), "*.md") == [one]

    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    for name in ("b.txt", "a.txt", "sub/c.txt", "skip.md"):
        (folder / name).write_text(name)
    assert corpus_files(str(folder), "**/*.txt") == sorted(
        [folder / "a.txt", folder / "b.txt", folder / "sub" / "c.txt"]
    )
    assert corpus_files(str(folder), "*.txt") == [folder / "a.txt", folder / "b.txt"]

    with pytest.raises(PipelineError, match="not found"):
        corpus_files(str(tmp_path / "missing"), "*")
    with pytest.raises(PipelineError, match="no files matching"):
        corpus_files(str(folder), "*.rst")


def test_empty_binary_and_mixed_corpora(tmp_path):
    """Empty corpora and a lone non-UTF-8 file are errors; a binary file in a folder is skipped."""
    out = tmp_path / "proc"
    folder = tmp_path / "docs"
    folder.mkdir()
    empty = folder / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(PipelineError, match="corpus is empty"):
        prepare_corpus(out, Corpus(empty), "char", None, (0.9, 0.05, 0.05))

    binary = folder / "blob.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81 not utf-8 \xc3\x28")
    with pytest.raises(PipelineError, match="UTF-8"):
        documents(Corpus(binary))
    with pytest.raises(PipelineError, match="corpus is empty"):  # [blob.bin, empty.txt]
        prepare_corpus(out, Corpus(folder), "char", None, (0.9, 0.05, 0.05))

    (folder / "a.txt").write_text("first document")
    (folder / "b.txt").write_text("second document")
    assert documents(Corpus(folder)) == ["first document", "second document"]


# --------------------------------------------------------------------------- tokenizers


def test_char_tokenizer_round_trips_shakespeare(shakespeare_text):
    """The char tokenizer has 6 specials + one id per distinct character and is lossless."""
    tok = train_tokenizer("char", [shakespeare_text])
    assert len(set(shakespeare_text)) == 65
    assert tok.get_vocab_size() == len(SPECIAL_TOKENS) + 65 == 71
    ids = encode_documents(tok, [shakespeare_text])
    assert len(ids) == len(shakespeare_text)
    assert tok.decode(ids.tolist()) == shakespeare_text
    for i, special in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(special) == i


def test_bpe_tokenizer_is_byte_level_and_keeps_specials(bpe, small_text):
    """BPE has the specials at ids 0..5, round-trips any text, never splits a special token."""
    assert 300 <= bpe.get_vocab_size() <= 500
    assert [bpe.token_to_id(s) for s in SPECIAL_TOKENS] == list(range(6))
    assert bpe.id_to_token(0) == "<|endoftext|>"

    sample = small_text[:5000]
    ids = bpe.encode(sample).ids
    assert len(ids) < len(sample)  # merges were learnt
    assert bpe.decode(ids) == sample
    unseen = "naïve café — 東京 🙂 \t\r\n"  # characters absent from the training text
    assert bpe.decode(bpe.encode(unseen).ids) == unseen
    assert bpe.token_to_id("<unk>") not in bpe.encode(unseen).ids

    ids = bpe.encode("to be <mask> not").ids
    assert ids.count(bpe.token_to_id("<mask>")) == 1


def test_tokenizer_json_round_trip(bpe, small_text):
    """A tokenizer saved to JSON and loaded back encodes identically."""
    again = load_tokenizer(bpe.to_str())
    assert again.encode(small_text[:2000]).ids == bpe.encode(small_text[:2000]).ids


def test_unknown_tokenizer_and_bpe_without_vocab():
    """Misconfigured tokenizers are PipelineErrors."""
    with pytest.raises(PipelineError, match="unknown tokenizer"):
        train_tokenizer("wordpiece", ["abc"])
    with pytest.raises(PipelineError, match="vocab_size"):
        train_tokenizer("bpe", ["abc"], None)


def test_documents_are_separated_by_one_eos_and_a_lone_one_has_none(tmp_path, bpe):
    eos = bpe.token_to_id("<|endoftext|>")
    docs = ["First citizen speaks.", "Second citizen answers.", "Third."]
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, d in enumerate(docs):
        (folder / f"{i}.txt").write_text(d)
    tokenizer = tmp_path / "bpe.json"
    bpe.save(str(tokenizer))
    for source, expected in ((folder, docs), (folder / "0.txt", docs[:1])):
        out = tmp_path / "out" / source.name
        prepare_corpus(out, Corpus(source), "bpe", None, (0.34, 0.33, 0.33), str(tokenizer))
        ids = np.concatenate(list(bins(out, "uint16").values())).tolist()
        stream = [i for d in expected for i in [*bpe.encode(d).ids, eos]]
        assert ids == (stream[:-1] if len(expected) == 1 else stream)
        assert bpe.decode(ids) == "".join(expected)  # EOS is skipped on decode


# --------------------------------------------------------------------------- prepare_corpus


@pytest.mark.parametrize("splits", [(0.9, 0.05, 0.05), (0.7, 0.2, 0.1)])
def test_prepare_corpus_writes_contiguous_splits(tmp_path, small_file, splits):
    """train/val/test.bin concatenate to the full token stream, cut at the split fractions."""
    out = tmp_path / "proc" / "small-char"
    prepare_corpus(out, Corpus(small_file), "char", None, splits)
    assert sorted(p.name for p in out.iterdir()) == [
        "meta.json",
        "test.bin",
        "tokenizer.json",
        "train.bin",
        "val.bin",
    ]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint16"
    assert meta["documents"] == 1
    assert meta["characters"] == len(small_file.read_text())

    tok = load_tokenizer((out / "tokenizer.json").read_text())
    assert meta["vocab_size"] == tok.get_vocab_size()
    stream = encode_documents(tok, documents(Corpus(small_file)))
    parts = bins(out, meta["dtype"])
    assert np.array_equal(np.concatenate(list(parts.values())), stream)
    n = len(stream)
    assert len(parts["train"]) == int(splits[0] * n)
    assert len(parts["val"]) == int((splits[0] + splits[1]) * n) - int(splits[0] * n)
    assert {k: len(v) for k, v in parts.items()} == meta["tokens"]
    assert leftovers(out.parent) == []


def test_prepare_corpus_bpe_multi_document_stream(tmp_path, small_text):
    """A folder of documents becomes one EOS-separated stream, split without loss."""
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.txt").write_text(small_text[i * 20_000 : (i + 1) * 20_000])
    source = Corpus(folder, "*.txt")
    out = tmp_path / "proc"
    prepare_corpus(out, source, "bpe", 350, (0.8, 0.1, 0.1))
    meta = json.loads((out / "meta.json").read_text())
    assert meta["documents"] == 4
    assert meta["vocab_size"] == 350
    assert meta["dtype"] == "uint16"
    tok = load_tokenizer((out / "tokenizer.json").read_text())
    stream = np.concatenate(list(bins(out, meta["dtype"]).values()))
    assert np.array_equal(stream, encode_documents(tok, documents(source)))
    assert (stream == 0).sum() == 4  # one EOS after each document
    assert tok.decode(stream.tolist()) == small_text[:80_000]


def test_prepare_corpus_second_call_does_no_work(tmp_path, small_file, monkeypatch):
    """Identical inputs and settings skip preparation and leave the files untouched."""
    out = tmp_path / "proc"
    prepare_corpus(out, Corpus(small_file), "char", None, (0.9, 0.05, 0.05))
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}

    def boom(*args, **kwargs):
        raise AssertionError("the tokenizer was trained again")

    monkeypatch.setattr(corpus, "train_tokenizer", boom)
    prepare_corpus(out, Corpus(small_file), "char", None, [0.9, 0.05, 0.05])
    # vocab_size does not matter to the char tokenizer
    prepare_corpus(out, Corpus(small_file), "char", 1234, (0.9, 0.05, 0.05))
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes


def test_prepare_corpus_rebuilds_on_changed_settings(tmp_path, small_file):
    """A new vocab_size, new splits or a changed file rebuilds the output."""
    out = tmp_path / "proc"
    prepare_corpus(out, Corpus(small_file), "bpe", 300, (0.9, 0.05, 0.05))
    meta1 = json.loads((out / "meta.json").read_text())
    assert meta1["vocab_size"] == 300

    prepare_corpus(out, Corpus(small_file), "bpe", 400, (0.9, 0.05, 0.05))
    meta2 = json.loads((out / "meta.json").read_text())
    assert meta2["vocab_size"] == 400
    assert meta2["fingerprint"] != meta1["fingerprint"]

    prepare_corpus(out, Corpus(small_file), "bpe", 400, (0.5, 0.25, 0.25))
    meta3 = json.loads((out / "meta.json").read_text())
    assert meta3["tokens"]["train"] == sum(meta3["tokens"].values()) // 2
    assert meta3["fingerprint"] != meta2["fingerprint"]

    small_file.write_text(small_file.read_text()[:50_000])
    prepare_corpus(out, Corpus(small_file), "bpe", 400, (0.5, 0.25, 0.25))
    meta4 = json.loads((out / "meta.json").read_text())
    assert meta4["characters"] == 50_000
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "splits", [(0.9, 0.05, 0.0), (0.0, 0.5, 0.5), (0.9, 0.2, -0.1), (0.95, 0.0, 0.05)]
)
def test_prepare_corpus_rejects_invalid_splits(tmp_path, small_file, splits):
    """Splits must sum to 1 with positive train and val fractions and no negative one."""
    with pytest.raises(PipelineError, match="splits"):
        prepare_corpus(tmp_path / "proc", Corpus(small_file), "char", None, splits)
    assert list(tmp_path.iterdir()) == [small_file]


def test_prepare_corpus_without_test_split(tmp_path, small_file):
    """A zero test fraction is allowed and gives an empty test.bin."""
    out = tmp_path / "proc"
    prepare_corpus(out, Corpus(small_file), "char", None, (0.9, 0.1, 0.0))
    assert json.loads((out / "meta.json").read_text())["tokens"]["test"] == 0


class _SaveFails:
    """A tokenizer whose save() fails: preparation breaks after the temp folder is written."""

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def save(self, path):
        raise OSError("disk full")


def encode_fails(job):
    raise RuntimeError("interrupted while encoding")


def test_failed_preparation_leaves_no_output(tmp_path, small_file, monkeypatch):
    """A failure while encoding or writing leaves no output; an interruption leaves the work
    folder that the next run resumes from (tests/test_corpus.py), a PipelineError nothing."""
    out = tmp_path / "proc" / "corpus"
    with monkeypatch.context() as m:
        m.setattr(chunks, "encode_chunk", encode_fails)
        with pytest.raises(RuntimeError, match="interrupted"):
            prepare_corpus(out, Corpus(small_file), "char", None, (0.9, 0.05, 0.05), num_proc=1)
    assert not out.exists()
    assert [p.name for p in leftovers(out.parent)] == [".corpus-work"]

    out = tmp_path / "proc" / "other"
    real_train = text.train_tokenizer
    monkeypatch.setattr(corpus, "train_tokenizer", lambda *a: _SaveFails(real_train(*a)))
    with pytest.raises(PipelineError, match="disk full"):
        prepare_corpus(out, Corpus(small_file), "char", None, (0.9, 0.05, 0.05))
    assert not out.exists()
    assert [p.name for p in leftovers(out.parent)] == [".corpus-work"]  # only the interrupted


def test_failed_rebuild_keeps_previous_output(tmp_path, small_file, monkeypatch):
    """A failed rebuild with new settings leaves the previous complete output intact."""
    out = tmp_path / "proc" / "corpus"
    prepare_corpus(out, Corpus(small_file), "char", None, (0.9, 0.05, 0.05))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with monkeypatch.context() as m:
        m.setattr(chunks, "encode_chunk", encode_fails)
        with pytest.raises(RuntimeError):
            prepare_corpus(out, Corpus(small_file), "char", None, (0.8, 0.1, 0.1), num_proc=1)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    real_train = text.train_tokenizer
    monkeypatch.setattr(corpus, "train_tokenizer", lambda *a: _SaveFails(real_train(*a)))
    with pytest.raises(PipelineError, match="disk full"):
        prepare_corpus(out, Corpus(small_file), "char", None, (0.7, 0.2, 0.1))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# --------------------------------------------------------------------------- windows


@pytest.fixture
def token_bin(tmp_path) -> tuple[Path, np.ndarray]:
    data = np.random.default_rng(0).integers(0, 60_000, size=1000).astype(np.uint16)
    path = tmp_path / "train.bin"
    data.tofile(path)
    return path, data


def test_token_windows_shift_by_one(token_bin):
    """A batch of windows gives int64 (B, T) x and y, y being x shifted by one token."""
    path, raw = token_bin
    block = 16
    ds = TokenWindows(path, "uint16", block)
    assert len(ds) == ds.n_starts == len(raw) - block
    offsets = [0, 7, 500, ds.n_starts - 1]
    x, y = ds.__getitems__(offsets)
    assert x.shape == y.shape == (len(offsets), block)
    assert x.dtype == y.dtype == torch.int64
    for row, o in enumerate(offsets):
        assert x[row].tolist() == raw[o : o + block].tolist()
        assert y[row].tolist() == raw[o + 1 : o + block + 1].tolist()
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert y[-1, -1].item() == raw[-1]  # the last offset reaches the last token
    x0, y0 = ds[7]
    assert torch.equal(x0, x[1]) and torch.equal(y0, y[1])


def test_token_windows_too_short(token_bin):
    """Fewer than block_size + 1 tokens give an empty dataset."""
    path, raw = token_bin
    assert len(TokenWindows(path, "uint16", len(raw) - 1)) == 1
    assert len(TokenWindows(path, "uint16", len(raw))) == 0
    assert len(TokenWindows(path, "uint16", len(raw) + 50)) == 0


def sampler(n: int, batches: int, batch_size: int, seed: int, done: int = 0, **kw):
    return RandomWindowSampler(n, batches, batch_size, seed, batches_done=lambda: done, **kw)


def test_random_window_sampler_is_deterministic_per_epoch():
    """Offsets depend only on (seed, epoch): reproducible, new each epoch, always in range."""
    n, batches, bs = 5000, 8, 32
    first = list(sampler(n, batches, bs, seed=3))
    assert len(sampler(n, batches, bs, seed=3)) == len(first) == batches * bs
    assert first == list(sampler(n, batches, bs, seed=3))
    assert all(0 <= o < n for o in first)
    # the default (no trainer) is epoch 0
    assert list(RandomWindowSampler(n, batches, bs, 3)) == first

    second = list(sampler(n, batches, bs, seed=3, done=batches))  # epoch 1
    assert second != first
    assert second == list(sampler(n, batches, bs, seed=3, done=batches))
    assert all(0 <= o < n for o in second)
    assert list(sampler(n, batches, bs, seed=4)) != first
    assert all(0 <= o < 3 for o in sampler(3, batches, bs, seed=0))


def test_random_window_sampler_resumes_mid_epoch():
    """After k batches of an epoch, iteration continues with that epoch's remaining batches."""
    n, batches, bs = 5000, 8, 4
    epoch2 = list(sampler(n, batches, bs, seed=1, done=2 * batches))
    resumed = list(sampler(n, batches, bs, seed=1, done=2 * batches + 3))
    assert resumed == epoch2[3 * bs :]


def test_random_window_sampler_shards_one_draw_across_ranks():
    """With world=2 the ranks take interleaved, complementary slices of the world=1 draw."""
    n, batches, bs = 10_000, 5, 20
    for done in (0, 5 * batches):  # epochs 0 and 5
        whole = list(sampler(n, 2 * batches, bs, seed=7, done=done * 2))
        r0, r1 = (
            list(sampler(n, batches, bs, seed=7, done=done, rank=r, world=2)) for r in range(2)
        )
        assert len(r0) == len(r1) == batches * bs
        assert r0 == whole[0::2] and r1 == whole[1::2]
        assert sorted(r0 + r1) == sorted(whole)


# --------------------------------------------------------------------------- data module


def make_dm(tmp_path: Path, corpus: Path | None, **kwargs) -> TextDataModule:
    args = dict(
        name="test",
        processed_dir=str(tmp_path / "processed"),
        path=None if corpus is None else str(corpus),
        tokenizer="char",
        block_size=32,
        batch_size=4,
        steps_per_epoch=3,
    )
    return TextDataModule(**{**args, **kwargs})


@pytest.fixture
def slice_200k(tmp_path, shakespeare_text) -> Path:
    f = tmp_path / "slice.txt"
    f.write_text(shakespeare_text[:200_000], encoding="utf-8")
    return f


def test_datamodule_end_to_end(tmp_path, slice_200k):
    """Train batches are random (4, 32) windows; validation covers its split block by block."""
    dm = make_dm(tmp_path, slice_200k)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.model_kwargs == {"vocab_size": dm.tokenizer.get_vocab_size()}
    assert dm.model_kwargs["vocab_size"] == len(SPECIAL_TOKENS) + len(set(slice_200k.read_text()))

    batches = list(dm.train_dataloader())
    assert len(batches) == 3
    for x, y in batches:
        assert x.shape == y.shape == (4, 32)
        assert x.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])

    val = np.fromfile(dm.processed_dir / "val.bin", dtype=dm.meta["dtype"])
    assert len(val) == dm.meta["tokens"]["val"]
    windows = [(x, y) for x, y in dm.val_dataloader()]
    xs = torch.cat([x for x, _ in windows])
    ys = torch.cat([y for _, y in windows])
    n_windows = (len(val) - 1) // 32
    assert xs.shape == (n_windows, 32)
    assert all(x.shape[0] == 4 for x, _ in windows[:-1])
    # consecutive, non-overlapping windows from the start of the split
    assert xs.flatten().tolist() == val[: n_windows * 32].tolist()
    assert ys.flatten().tolist() == val[1 : n_windows * 32 + 1].tolist()

    test_x = torch.cat([x for x, _ in dm.test_dataloader()])
    assert test_x.shape == ((dm.meta["tokens"]["test"] - 1) // 32, 32)

    # the same module, rebuilt, samples the same training data
    dm2 = make_dm(tmp_path, slice_200k)
    dm2.prepare_data()
    dm2.setup("fit")
    for (x1, _), (x2, _) in zip(batches, dm2.train_dataloader(), strict=True):
        assert torch.equal(x1, x2)


def test_datamodule_val_split_shorter_than_block(tmp_path, shakespeare_text):
    """A held-out split shorter than one block is a PipelineError that names the block size."""
    corpus = tmp_path / "tiny.txt"
    corpus.write_text(shakespeare_text[:400])  # 20 val tokens < 33
    dm = make_dm(tmp_path, corpus)
    dm.prepare_data()
    with pytest.raises(PipelineError, match="block"):
        dm.setup("fit")


def test_datamodule_without_test_split(tmp_path, slice_200k):
    """splits with no test part set up fine, and test_dataloader says why it cannot run."""
    dm = make_dm(tmp_path, slice_200k, splits=(0.9, 0.1, 0.0))
    dm.prepare_data()
    dm.setup()
    assert "test" not in dm.splits
    with pytest.raises(PipelineError, match="test"):
        dm.test_dataloader()


def test_datamodule_state_dict_carries_the_tokenizer(tmp_path, slice_200k, small_file):
    """The tokenizer round-trips through state_dict; another tokenizer is refused."""
    dm = make_dm(tmp_path, slice_200k)
    dm.prepare_data()
    state = dm.state_dict()
    assert load_tokenizer(state["tokenizer"]).to_str() == dm.tokenizer.to_str()

    same = make_dm(tmp_path, slice_200k)
    same.load_state_dict(state)

    other = make_dm(tmp_path, small_file, processed_dir=str(tmp_path / "other"))
    other.prepare_data()
    with pytest.raises(PipelineError, match="tokenizer"):
        other.load_state_dict(state)
    with pytest.raises(PipelineError, match="tokenizer"):
        other.load_state_dict({})


def test_shakespeare_config_fetches_its_dataset_once(tmp_path, shakespeare):
    """data=shakespeare names the registered dataset; its file is fetched once into raw_dir
    (here from the mirror), and a second preparation needs neither mirror nor network."""
    cfg = OmegaConf.load(ROOT / "conf" / "data" / "shakespeare.yaml")
    kw = dict(name=cfg.name, processed_dir=str(tmp_path / "processed" / "shakespeare-char"),
              dataset=cfg.dataset, raw_dir=str(tmp_path / "raw"), tokenizer=cfg.tokenizer,
              block_size=cfg.block_size, batch_size=4, steps_per_epoch=2)  # fmt: skip
    dm = TextDataModule(**kw, mirror=str(shakespeare.parents[1]))
    dm.prepare_data()
    raw = tmp_path / "raw" / "tinyshakespeare" / "input.txt"
    assert raw.read_bytes() == shakespeare.read_bytes()
    assert dm.meta["vocab_size"] == 71
    assert sum(dm.meta["tokens"].values()) == 1_115_394
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, cfg.block_size)

    dm2 = TextDataModule(**kw, mirror=None)
    dm2.prepare_data()
    assert dm2.meta == dm.meta
