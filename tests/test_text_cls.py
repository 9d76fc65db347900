"""Labelled text (src/data/text_cls.py): Shakespeare's speakers, the user's CSV / JSONL, the
held-out-free pre-training corpus, padded batches, tokenizer reuse, and token tagging."""

from __future__ import annotations

import json
import keyword
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from src.data import text_cls
from src.data.text_cls import (
    IGNORE,
    PY_TAGS,
    TextClsDataModule,
    shakespeare_speakers,
    split_ids,
    without_spans,
)
from src.utils.errors import PipelineError
from tests.conftest import MIRROR

ROOT = Path(__file__).resolve().parents[1]
CLS_ID, PAD_ID = 3, 2


def make_dm(out: Path, **kw) -> TextClsDataModule:
    raw = {"raw_dir": str(out.parent / "raw"), "mirror": str(MIRROR)}  # tiny Shakespeare's copy
    kw = {"vocab_size": 300, "batch_size": 8, "block_size": 32, **raw, **kw}
    dm = TextClsDataModule(processed_dir=str(out), **kw)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def speeches_by_line(text: str) -> Counter:
    """An independent count of speeches: a 'NAME:' line after a blank line (or at the start)
    followed by a non-blank line."""
    lines = text.split("\n")
    return Counter(
        ln[:-1]
        for i, ln in enumerate(lines[:-1])
        if ln.endswith(":") and (i == 0 or lines[i - 1] == "") and lines[i + 1].strip()
    )


@pytest.fixture(scope="module")
def speakers(tmp_path_factory, shakespeare) -> TextClsDataModule:
    out = tmp_path_factory.mktemp("speakers") / "processed"
    return make_dm(out, vocab_size=1024)


@pytest.fixture(scope="module")
def raw_text(shakespeare) -> str:
    return shakespeare.read_text(encoding="utf-8")


def write_csv(path: Path, rows: list[dict]) -> Path:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def toy_rows(n: int = 60, split: bool = False) -> list[dict]:
    """Three classes that differ in vocabulary; integer labels 2, 10, 7 (numeric order matters)."""
    words = {2: "apple pear plum", 10: "red blue green", 7: "cat dog, bird"}
    rows = []
    for i in range(n):
        label = [2, 10, 7][i % 3]
        row = {"text": f"{words[label]} number {i}\nsecond line", "label": label}
        if split:
            row["split"] = ["train", "train", "train", "val", "test"][i % 5]
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- Shakespeare


def test_speech_parser_on_a_small_play():
    """Speeches start with 'NAME:' after a blank line; empty speeches and in-speech colons are
    handled; the spans cover name and speech."""
    text = (
        "ROMEO:\nBut soft:\nwhat light?\n\nJULIET:\nAy me.\n\nTITUS:\n\n"
        "ROMEO:\nShe speaks.\n\nJULIET:\nO Romeo.\n\nROMEO:\nI take thee.\n"
    )
    ex = shakespeare_speakers(text, 2)
    assert ex.names == ["JULIET", "ROMEO"]
    assert ex.y == ["ROMEO", "JULIET", "ROMEO", "JULIET", "ROMEO"]
    assert ex.x[0] == "But soft:\nwhat light?"
    assert [text[a:b] for a, b in ex.spans][1] == "JULIET:\nAy me.\n"
    assert without_spans(text, ex.spans) == "TITUS:\n\n"
    with pytest.raises(PipelineError, match="num_classes"):
        shakespeare_speakers(text, 3)


def test_shakespeare_speakers_real_file(speakers, raw_text):
    """The 8 speakers with most speeches, every one of their speeches once, labels in range."""
    meta = speakers.meta
    by_line = speeches_by_line(raw_text)
    top = sorted(by_line, key=lambda s: (-by_line[s], s))[:8]
    assert speakers.label_names == sorted(top)
    assert speakers.model_kwargs == {"vocab_size": meta["vocab_size"], "num_classes": 8}
    assert 900 <= meta["vocab_size"] <= 1024
    total = Counter()
    for split in ("train", "val", "test"):
        for name, n in meta["counts"][split].items():
            total[name] += n
        labels = speakers.labels(split)
        assert len(labels) == len(speakers.texts(split)) == meta["examples"][split]
        assert set(labels) <= set(range(8))
    assert total == {s: by_line[s] for s in top}
    assert sum(total.values()) == 1288
    # stratified 80 / 10 / 10
    for name in top:
        n = total[name]
        assert meta["counts"]["val"][name] == meta["counts"]["test"][name] == round(0.1 * n)
    assert all(not t.endswith("\n") and t for t in speakers.texts("train"))


def test_corpus_holds_no_held_out_speech(speakers, raw_text):
    """corpus.txt is the raw text without the val/test speeches (and keeps every other line)."""
    corpus = (speakers.processed_dir / "corpus.txt").read_text(encoding="utf-8")
    held_out = speakers.texts("val") + speakers.texts("test")
    long = [t for t in held_out if len(t) > 80]
    assert len(long) > 50
    for t in long:
        assert t not in corpus, t[:80]
    for t in speakers.texts("train"):
        assert t in corpus
    removed = sum(len(t) for t in held_out)
    assert len(raw_text) - len(corpus) > removed
    assert corpus.count("\n\n\n") == raw_text.count("\n\n\n")  # no blank lines added


def test_splits_are_seeded_partitions(tmp_path, speakers, shakespeare):
    """The same split seed gives the same split; another one another split; split_ids partitions
    every stratum by the fractions."""
    again = make_dm(tmp_path / "again", vocab_size=1024)
    for split in ("train", "val", "test"):
        assert again.texts(split) == speakers.texts(split)
    other = make_dm(tmp_path / "other", vocab_size=1024, split_seed=1)
    assert other.texts("test") != speakers.texts("test")
    assert other.meta["counts"] == speakers.meta["counts"]  # stratified: same sizes

    strata = np.repeat([0, 1, 2], [50, 30, 20])
    part = split_ids(strata, (0.8, 0.1, 0.1), seed=3)
    assert np.array_equal(part, split_ids(strata, (0.8, 0.1, 0.1), seed=3))
    for s, n in zip((0, 1, 2), (50, 30, 20), strict=True):
        assert np.bincount(part[strata == s], minlength=3).tolist() == [
            n - 2 * round(0.1 * n),
            round(0.1 * n),
            round(0.1 * n),
        ]


def test_second_prepare_is_skipped_and_settings_rebuild(tmp_path, shakespeare, monkeypatch):
    """A matching fingerprint skips all work; another vocabulary size rebuilds."""
    out = tmp_path / "p"
    make_dm(out)
    before = (out / "meta.json").read_text()

    def boom(*a, **k):
        raise AssertionError("prepared again")

    monkeypatch.setattr(text_cls, "train_tokenizer", boom)
    make_dm(out)
    assert (out / "meta.json").read_text() == before
    monkeypatch.undo()
    bigger = make_dm(out, vocab_size=400)
    assert bigger.meta["vocab_size"] == 400 != json.loads(before)["vocab_size"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_shakespeare_fetched_once(tmp_path, shakespeare):
    """The speeches' text is fetched once into raw_dir/tinyshakespeare/; later runs need no
    mirror (nor network)."""
    dm = make_dm(tmp_path / "p", num_classes=2)
    raw = tmp_path / "raw" / "tinyshakespeare" / "input.txt"
    assert raw.read_bytes() == shakespeare.read_bytes()
    assert dm.label_names == ["DUKE VINCENTIO", "GLOUCESTER"]
    again = make_dm(tmp_path / "q", num_classes=2, mirror=None)
    assert again.label_names == dm.label_names


# --------------------------------------------------------------------------- batches


def test_batches_cls_first_pad_after(speakers):
    """input_ids (B, T<=block): CLS first, each example's ids then PAD; labels (B,)."""
    ds = speakers.splits["val"]
    batch = next(iter(speakers.val_dataloader()))
    x, y = batch["input_ids"], batch["labels"]
    assert set(batch) == {"input_ids", "labels"}
    assert x.dtype == y.dtype == torch.long
    assert x.shape[0] == y.shape[0] == 8 and x.shape[1] <= 32
    assert (x[:, 0] == CLS_ID).all()
    lengths = []
    for i in range(8):
        ids, label = ds[i]
        lengths.append(len(ids))
        assert torch.equal(x[i, : len(ids)], torch.from_numpy(ids.astype(np.int64)))
        assert (x[i, len(ids) :] == PAD_ID).all()
        assert y[i] == label == speakers.labels("val")[i]
    assert x.shape[1] == max(lengths)  # padded to the batch's longest only
    # the first tokens decode to the speech's beginning
    text = speakers.tokenizer.decode(x[0, 1 : lengths[0]].tolist())
    assert speakers.texts("val")[0].startswith(text[:20])


def test_train_loader_is_shuffled_by_seed(speakers):
    def first(dm):
        return next(iter(dm.train_dataloader()))["labels"]

    a, b = first(speakers), first(speakers)
    assert torch.equal(a, b)
    unshuffled = torch.tensor(speakers.labels("train")[:8])
    assert not torch.equal(a, unshuffled)


# --------------------------------------------------------------------------- user data


def test_csv_without_split_integer_labels(tmp_path):
    """Integer labels sort numerically; the split is stratified; corpus.txt = train texts."""
    f = write_csv(tmp_path / "toy.csv", toy_rows(60))
    dm = make_dm(tmp_path / "p", path=str(f))
    assert dm.label_names == [2, 7, 10]
    assert dm.meta["examples"] == {"train": 48, "val": 6, "test": 6}
    assert dm.meta["counts"]["val"] == {"2": 2, "7": 2, "10": 2}
    assert dm.model_kwargs["num_classes"] == 3
    for text, label in zip(dm.texts("train"), dm.labels("train"), strict=True):
        assert {"apple": 0, "cat": 1, "red": 2}[text.split()[0]] == label
        assert "\nsecond line" in text  # quoted newlines survive
    corpus = (dm.processed_dir / "corpus.txt").read_text()
    assert corpus == "\n\n".join(dm.texts("train")) + "\n"
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] == 8 and (batch["input_ids"][:, 0] == CLS_ID).all()


def test_jsonl_with_split_string_labels(tmp_path):
    """A split key is obeyed; string labels get ids in sorted order."""
    rows = [{**r, "label": {2: "fruit", 10: "colour", 7: "animal"}[r["label"]]}
            for r in toy_rows(40, split=True)]  # fmt: skip
    f = tmp_path / "toy.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    dm = make_dm(tmp_path / "p", path=str(f))
    assert dm.label_names == ["animal", "colour", "fruit"]
    assert dm.meta["examples"] == {"train": 24, "val": 8, "test": 8}
    assert dm.texts("test") == [r["text"] for r in rows if r["split"] == "test"]
    assert dm.labels("test") == [
        ["animal", "colour", "fruit"].index(r["label"]) for r in rows if r["split"] == "test"
    ]
    csv_dm = make_dm(tmp_path / "c", path=str(write_csv(tmp_path / "toy.csv", rows)))
    assert csv_dm.texts("val") == dm.texts("val")


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "not found"),
        ("", "empty"),
        ("text,category\nhello,a\n", "lacks the column"),
        ("text,label\nhello,\n", "has no label"),
        ("text,label,split\nhello,a,train\nbye,b,train\n", "val split .* has no examples"),
        ("text,label,split\nhello,a,train\nbye,b,dev\n", "split 'dev' is none of"),
    ],
)
def test_bad_csv_is_one_clear_error(tmp_path, content, message):
    f = tmp_path / "bad.csv"
    if content is not None:
        f.write_text(content)
    with pytest.raises(PipelineError, match=message) as e:
        make_dm(tmp_path / "p", path=str(f))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"text": "a"}\n', "line 1 lacks the key"),
        ('{"text": "a", "label": 1}\nnot json\n', "line 2 is not JSON"),
        ("\n\n", "empty"),
    ],
)
def test_bad_jsonl_is_one_clear_error(tmp_path, content, message):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(PipelineError, match=message):
        make_dm(tmp_path / "p", path=str(f))


def test_tokenizer_file_is_reused_and_checked(tmp_path, speakers):
    """tokenizer_file: the given tokenizer, not a new one; the checkpoint state checks it."""
    f = write_csv(tmp_path / "toy.csv", toy_rows(30))
    tok_file = speakers.processed_dir / "tokenizer.json"
    dm = make_dm(tmp_path / "p", path=str(f), tokenizer_file=str(tok_file))
    assert dm.tokenizer.to_str() == speakers.tokenizer.to_str()
    assert dm.model_kwargs["vocab_size"] == speakers.model_kwargs["vocab_size"]
    own = make_dm(tmp_path / "own", path=str(f))
    state = dm.state_dict()
    assert state["labels"] == [2, 7, 10]
    dm.load_state_dict(state)
    with pytest.raises(PipelineError, match="tokenizer"):
        own.load_state_dict(state)
    with pytest.raises(PipelineError, match="not found"):
        make_dm(tmp_path / "q", path=str(f), tokenizer_file=str(tmp_path / "none.json"))


def test_config_composes_and_prepares(tmp_path, shakespeare):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from src.utils.config import register_resolvers

    register_resolvers()
    overrides = ["data=text_cls", f"paths.data_dir={tmp_path}",
                 "data.vocab_size=300", "data.num_classes=3"]  # fmt: skip
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
        tag = compose("train", overrides=["data=text_tag"])
    assert cfg.data.processed_dir.endswith("processed/shakespeare_speakers-cls-bpe300")
    assert (tag.data.task, tag.data.source) == ("tag", "python_tokens")
    dm = instantiate(cfg.data, _convert_="all")
    dm.prepare_data()
    assert dm.model_kwargs == {"vocab_size": 300, "num_classes": 3}

    # bench/bert_speakers.py's first row, naive Bayes, composes the same data on its own
    from bench.bert_speakers import naive_bayes

    nb = naive_bayes(overrides[1:])
    assert nb["acc"] > nb["majority_acc"] > 0


# --------------------------------------------------------------------------- tagging


def labelled_starts(labels: torch.Tensor) -> list[int]:
    return [i for i, v in enumerate(labels.tolist()) if v != IGNORE]


def test_tags_on_first_sub_tokens(tmp_path):
    """Each word's tag sits on its first sub-token; the word's tokens decode to ' ' + word."""
    rng = np.random.default_rng(0)
    vocab = ["the", "cat", "sat", "on", "mat", "Antidisestablishment", "42", "!", "naïve"]
    rows = []
    for i in range(40):
        words = [str(w) for w in rng.choice(vocab, size=rng.integers(1, 9))]
        tags = ["LONG" if len(w) > 3 else "SHORT" for w in words]
        rows.append({"tokens": words, "tags": tags, "split": ["train", "val"][i % 2]})
    f = tmp_path / "tags.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    dm = make_dm(tmp_path / "p", path=str(f), task="tag", vocab_size=280, block_size=128)
    assert dm.label_names == ["LONG", "SHORT"]
    assert dm.meta["examples"] == {"train": 20, "val": 20, "test": 0}
    batch = next(iter(dm.val_dataloader()))
    x, y = batch["input_ids"], batch["labels"]
    assert x.shape == y.shape and (x[:, 0] == CLS_ID).all() and (y[:, 0] == IGNORE).all()
    assert (y[x == PAD_ID] == IGNORE).all()
    val_rows = [r for r in rows if r["split"] == "val"]
    for i, row in enumerate(val_rows[:8]):
        starts = labelled_starts(y[i])
        assert len(starts) == len(row["tokens"])
        ends = [*starts[1:], int((x[i] != PAD_ID).sum())]
        for k, (a, b) in enumerate(zip(starts, ends, strict=True)):
            word = dm.tokenizer.decode(x[i, a:b].tolist())
            assert word == (" " if k else "") + row["tokens"][k]
            assert dm.label_names[int(y[i, a])] == row["tags"][k]
    with pytest.raises(PipelineError, match="no test split"):
        dm.test_dataloader()


def test_tag_truncation_keeps_alignment(tmp_path):
    words = [f"w{i}" for i in range(30)]
    rows = [{"tokens": words, "tags": ["A", "B"] * 15, "split": s} for s in ("train", "val")]
    f = tmp_path / "tags.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    dm = make_dm(tmp_path / "p", path=str(f), task="tag", block_size=10)
    batch = next(iter(dm.val_dataloader()))
    assert batch["input_ids"].shape == batch["labels"].shape == (1, 10)
    first = labelled_starts(batch["labels"][0])
    assert first[0] == 1 and batch["labels"][0, first[0]] == 0


def test_bad_tag_rows(tmp_path):
    f = tmp_path / "tags.jsonl"
    f.write_text(json.dumps({"tokens": ["a", "b"], "tags": ["X"]}))
    with pytest.raises(PipelineError, match="equal-length"):
        make_dm(tmp_path / "p", path=str(f), task="tag")
    with pytest.raises(PipelineError, match="does not fit task"):
        TextClsDataModule(processed_dir=str(tmp_path), task="tag", source="shakespeare_speakers")


def test_python_tokens_builtin(tmp_path):
    """Stdlib chunks tagged by Python's tokenize: keywords are keywords, numbers parse, names
    are identifiers; batches (B, T) with -100 on CLS and padding."""
    dm = make_dm(tmp_path / "p", task="tag", python_files=3, chunk_lines=6)
    assert dm.label_names == list(PY_TAGS)
    assert dm.model_kwargs["num_classes"] == 6
    seen = Counter()
    for words, tags in zip(dm.texts("train"), dm.labels("train"), strict=True):
        assert len(words) == len(tags) > 0
        for w, t in zip(words, tags, strict=True):
            name = PY_TAGS[t]
            seen[name] += 1
            if name == "KEYWORD":
                assert keyword.iskeyword(w)
            elif name == "NAME":
                assert w.isidentifier() and not keyword.iskeyword(w)
            elif name == "NUMBER":
                assert re.match(r"[0-9.]", w)
            elif name == "COMMENT":
                assert w.startswith("#")
    assert {"NAME", "KEYWORD", "OP", "STRING"} <= set(seen)
    batch = next(iter(dm.train_dataloader()))
    x, y = batch["input_ids"], batch["labels"]
    assert x.shape == y.shape and x.shape[1] <= 32
    assert (y[:, 0] == IGNORE).all() and (y[x == PAD_ID] == IGNORE).all()
    assert ((y >= 0) & (y < 6) | (y == IGNORE)).all()


def test_trivial_targets_are_the_splits_labels(speakers):
    """What the trivial-baseline callback reads: one label per train / val speech."""
    train, val = speakers.trivial_targets("val")
    assert (len(train), len(val)) == (len(speakers.splits["train"]), len(speakers.splits["val"]))
    assert train.dtype == torch.long and int(train.max()) == len(speakers.label_names) - 1
