"""Corpora of any size (src/data/corpus.py): the presets' bytes unchanged by streaming, pieces and
processes; bounded pieces and chunks in flight; resuming; JSONL, Parquet and saved datasets; the
document split; bounded validation; progress lines in a log."""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from src.data import chunks, corpus
from src.data.corpus import Corpus, prepare_corpus
from src.data.parallel import Progress
from src.data.text import SPLITS, TextDataModule
from src.utils.errors import PipelineError
from tests.conftest import assert_ok, run_module

PARTS = (0.9, 0.05, 0.05)
FILES = ("train.bin", "val.bin", "test.bin", "tokenizer.json")
# SHA-256 of the files prepared by the code before streaming (2026-12-04) from tiny Shakespeare:
# data=shakespeare (char), data.tokenizer=bpe data.vocab_size=4096, data.tokenizer=word
# data.vocab_size=null; and the default corpus (the stdlib of Python 3.11.7, bpe 4096)
RECORDED = {
    "char": ("0cc584f33f1cd02463a23d92835f95060e923e5d57b744ff8d87e86b98c7727a",
             "b2d43dd997de2f5b61f51a43fa26c283a12ee0505fe28a616ae6ff90f8b529b9",
             "5f6cef0c9085acfa47556bd9ab97bd8ea77069ea36109a188ed52cfe074ace58",
             "217be7c879d420b0ff8855653665a617f415f84d8986f4e1dd97e89de67742eb"),
    "bpe": ("59bd6b3245c3f0805df7c85cac8de35004b6eb397bcdbb73408dcfdaf4a027c9",
            "1cb78d239f0c8db523c8348b406019f446ef45f124bd1b757b510f9ede17ee0d",
            "7a108ed5d87b123061a1a92fcfcf7a3f4e74a98cb97449ac6220b83dcaec3293",
            "8e74eaa56ebf3a1b59bc6a324ff5440b547dd6b443cee8f4abbc4f3f00909b68"),
    "word": ("0cbb59d034394852dd7ce293896f23ef24a88cb40f1716e609dedbd73eb87622",
             "bb7fb8d9040af119f8c335e11ed37a6c20ef671a5f6c3eab3a4975632705607f",
             "6ea86360e143d9cb4a5489b73ac66d28ad8c6ca7cf7ea443109f8babcb4c909e",
             "4279e5658eff225c39428551dc10e83ffae5018853fc6fbfb174e40010b69143"),
    "stdlib": ("19b96f599434f967f4ee6e0151e87d8d5d9078faa71024c29b0cc8bd5096ca51",
               "228b59b7fb27386ccf37f5f43f059b440eeec57bf63911383a299416924e721d",
               "02bb3493a497cc6e2c4f02b73e8b752a7941c253ce74c6408c301a17a1c1511b",
               "180d0029bed3a722c4a8dc919c68efb062d85b7c86a66d0c6a3159cdbf2b52dc"),
}  # fmt: skip
VOCAB = {"char": None, "bpe": 4096, "word": None, "stdlib": 4096}


def digests(out: Path) -> tuple[str, ...]:
    return tuple(hashlib.sha256((out / f).read_bytes()).hexdigest() for f in FILES)


def stream(out: Path) -> np.ndarray:
    meta = json.loads((out / "meta.json").read_text())
    return np.concatenate([np.fromfile(out / f"{s}.bin", dtype=meta["dtype"]) for s in SPLITS])


@pytest.fixture
def small_pieces(monkeypatch):
    """Pieces of ~20,000 characters: tiny Shakespeare is cut 50 times."""
    monkeypatch.setattr(corpus, "PIECE", 20_000)


@pytest.mark.parametrize("kind", ["char", "bpe", "word"])
def test_the_presets_bytes_are_unchanged_by_pieces_chunks_and_processes(
    tmp_path, shakespeare, small_pieces, kind
):
    out = tmp_path / kind
    prepare_corpus(out, Corpus(shakespeare), kind, VOCAB[kind], PARTS, num_proc=2, chunk_mb=0.1)
    assert digests(out) == RECORDED[kind]


@pytest.mark.slow
@pytest.mark.skipif(sys.version[:6] != "3.11.7", reason="the stdlib of Python 3.11.7 was recorded")
def test_the_default_corpus_is_unchanged(tmp_path):
    prepare_corpus(tmp_path / "stdlib", Corpus(), "bpe", 4096, PARTS)
    assert digests(tmp_path / "stdlib") == RECORDED["stdlib"]


# --------------------------------------------------------------------------- bounded memory


def test_a_long_file_comes_in_pieces_cut_between_lines(tmp_path, shakespeare, small_pieces):
    text = shakespeare.read_text()
    pieces = list(Corpus(shakespeare).pieces())
    assert "".join(p for p, _, _ in pieces) == text
    assert [ends for _, ends, _ in pieces] == [False] * (len(pieces) - 1) + [True]
    assert len(pieces) > 40 and max(len(p) for p, _, _ in pieces) <= 20_000
    for p, _, _ in pieces[:-1]:  # a line break with a non-space character on either side
        assert p[-1] == "\n" and not p[-2].isspace()
    assert sum(size for _, _, size in pieces) == shakespeare.stat().st_size


def one_line(n_words: int = 60_000, seed: int = 0) -> str:
    """text8-like text: lowercase words and single spaces, no line break."""
    rng = np.random.default_rng(seed)
    words = ["the", "of", "and", "anarchism", "originated", "as", "a", "term", "abuse",
             "first", "used", "against", "early", "working", "class", "radicals",
             "including", "diggers"]  # fmt: skip
    return " " + " ".join(rng.choice(words, n_words, p=np.r_[[0.2, 0.1], [0.7 / 16] * 16]))


@pytest.mark.parametrize("kind", ["char", "bpe", "word"])
def test_text_without_line_breaks_is_cut_before_a_word_and_encodes_as_one_piece(
    tmp_path, monkeypatch, kind
):
    (tmp_path / "text8").write_text(one_line())
    prepare_corpus(tmp_path / "whole", Corpus(tmp_path / "text8"), kind, 256, PARTS)
    monkeypatch.setattr(corpus, "PIECE", 20_000)
    pieces = [p for p, _, _ in Corpus(tmp_path / "text8").pieces()]
    assert len(pieces) > 10 and "".join(pieces) == (tmp_path / "text8").read_text()
    assert all(p[-1] != " " and q[:1] == " " and q[1].isalpha() for p, q in pairwise(pieces))
    prepare_corpus(tmp_path / "cut", Corpus(tmp_path / "text8"), kind, 256, PARTS, num_proc=2,
                   chunk_mb=0.05)  # fmt: skip
    assert digests(tmp_path / "cut") == digests(tmp_path / "whole")


def test_a_gzipped_head_and_the_same_head_of_the_whole_file_are_one_corpus(tmp_path, monkeypatch):
    import gzip

    monkeypatch.setattr(corpus, "PIECE", 20_000)
    text = one_line()
    (tmp_path / "text8").write_text(text)
    head = text[:123_457]
    with gzip.open(tmp_path / "head.txt.gz", "wt") as f:
        f.write(head)
    zipped = Corpus(tmp_path / "head.txt.gz")
    assert zipped.size() == len(head) and "".join(p for p, _, _ in zipped.pieces()) == head
    cut = Corpus(tmp_path / "text8", max_chars=len(head))
    assert cut.size() == len(head) and "".join(p for p, _, _ in cut.pieces()) == head
    prepare_corpus(tmp_path / "a", zipped, "word", None, PARTS)
    prepare_corpus(tmp_path / "b", cut, "word", None, PARTS)
    assert digests(tmp_path / "a") == digests(tmp_path / "b")
    with pytest.raises(PipelineError, match=r"data\.max_chars=0"):
        Corpus(tmp_path / "text8", max_chars=0)


def test_at_most_two_chunks_a_process_wait_in_memory(tmp_path):
    """The reader runs ahead of the encoders by at most 2 x num_proc chunks, however long the
    corpus: memory is set by chunk_mb and num_proc."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "<unk>": 1}, unk_token="<unk>"))
    read, ahead = [], []

    def jobs():
        for index in range(30):
            read.append(index)
            yield str(tmp_path), index, "uint16", [("a b c", True, 5)]

    for done, index in enumerate(corpus._in_order(jobs(), 2, tok.to_str())):
        assert index == done  # in corpus order
        ahead.append(len(read) - done)
    assert max(ahead) <= 2 * 2 + 1 and len(read) == 30


# --------------------------------------------------------------------------- resuming


def test_a_killed_preparation_resumes_at_its_first_unfinished_chunk(
    tmp_path, shakespeare, small_pieces, monkeypatch
):
    encode, calls, kill = chunks.encode_chunk, [], [4]

    def killed_at_the_fifth(job):
        calls.append(job[1])
        if job[1] in kill:
            kill.clear()
            raise KeyboardInterrupt  # as a kill between two chunks
        return encode(job)

    monkeypatch.setattr(chunks, "encode_chunk", killed_at_the_fifth)
    args = (Corpus(shakespeare), "char", None, PARTS)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus(tmp_path / "out", *args, num_proc=1, chunk_mb=0.1)
    assert not (tmp_path / "out").exists()
    assert len(list((tmp_path / ".out-work/chunks").glob("*.json"))) == 4
    calls.clear()
    prepare_corpus(tmp_path / "out", *args, num_proc=1, chunk_mb=0.1)
    resumed = list(calls)
    calls.clear()
    prepare_corpus(tmp_path / "clean", *args, num_proc=1, chunk_mb=0.1)
    assert resumed == calls[4:] and len(calls) == 10  # 1.1 MB in chunks of >= 0.1 MB
    assert digests(tmp_path / "out") == digests(tmp_path / "clean")
    assert not (tmp_path / ".out-work").exists()


def test_other_settings_start_the_work_anew(tmp_path, shakespeare, monkeypatch):
    monkeypatch.setattr(chunks, "encode_chunk", lambda job: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        prepare_corpus(tmp_path / "out", Corpus(shakespeare), "char", None, PARTS, num_proc=1)
    monkeypatch.undo()
    prepare_corpus(tmp_path / "out", Corpus(shakespeare), "char", None, (0.8, 0.1, 0.1))
    assert json.loads((tmp_path / "out/meta.json").read_text())["settings"]["splits"][0] == 0.8


# --------------------------------------------------------------------------- sources


DOCS = ["The first document.\nTwo lines.", "A second one, longer:\n" + "words " * 200,
        "   ", "Third.", "Fourth and last."]  # fmt: skip


@pytest.fixture
def tables(tmp_path) -> dict[str, Path]:
    """The same documents as a folder of text files, JSONL, Parquet and a saved dataset."""
    import datasets

    folder = tmp_path / "texts"
    folder.mkdir()
    for i, d in enumerate(DOCS):
        (folder / f"{i}.txt").write_text(d)
    ds = datasets.Dataset.from_dict({"id": list(range(len(DOCS))), "content": DOCS})
    (tmp_path / "jsonl").mkdir()
    ds.to_json(tmp_path / "jsonl/docs.jsonl")
    (tmp_path / "parquet").mkdir()
    ds.select(range(2)).to_parquet(tmp_path / "parquet/a.parquet")
    ds.select(range(2, 5)).to_parquet(tmp_path / "parquet/b.parquet")
    ds.save_to_disk(tmp_path / "saved")
    return {"files": folder, "json": tmp_path / "jsonl/docs.jsonl", "parquet": tmp_path / "parquet",
            "saved": tmp_path / "saved"}  # fmt: skip


@pytest.mark.parametrize("kind", ["json", "parquet", "saved", "hub"])
def test_jsonl_parquet_and_saved_datasets_give_the_text_files_stream(tmp_path, tables, kind):
    plain = tmp_path / "plain"
    prepare_corpus(plain, Corpus(tables["files"]), "char", None, (0.6, 0.2, 0.2), num_proc=1)
    if kind == "hub":  # datasets' load_dataset by name, here a local folder of JSONL
        source = Corpus(hub=str(tables["json"].parent), text_column="content",
                        hub_config=None, streaming=True)  # fmt: skip
    else:
        source = Corpus(tables[kind], text_column="content")
        assert source.kind == kind
    out = tmp_path / kind
    prepare_corpus(out, source, "char", None, (0.6, 0.2, 0.2))
    assert np.array_equal(stream(out), stream(plain))
    assert json.loads((out / "meta.json").read_text())["documents"] == 4  # the blank one left out


def test_a_missing_text_column_is_one_clear_error(tables):
    with pytest.raises(PipelineError, match=r"data.text_column='text' is not a column.*content"):
        list(Corpus(tables["json"]).pieces())


def test_the_entry_point_prepares_jsonl_in_two_processes(tmp_path, tables):
    proc = run_module("src.prepare", "data=text", f"data.path={tables['json']}",
                      "data.text_column=content", "data.tokenizer=char", "data.num_proc=2",
                      f"paths.data_dir={tmp_path / 'data'}")  # fmt: skip
    assert_ok(proc)
    meta = json.loads((tmp_path / "data/processed/docs-char/meta.json").read_text())
    assert meta["documents"] == 4 and sum(meta["tokens"].values()) > 1000


# --------------------------------------------------------------------------- splits


def test_the_document_split_is_seeded_by_document_not_by_position(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    docs = [f"document {i:03d} " + "x" * (i % 7) for i in range(300)]
    for i, d in enumerate(docs):
        (folder / f"{i:03d}.txt").write_text(d)

    def parts(seed: int, out: str) -> dict[str, list[str]]:
        prepare_corpus(tmp_path / out, Corpus(folder), "char", None, (0.8, 0.1, 0.1),
                       split_by="document", split_seed=seed, chunk_mb=0.001)  # fmt: skip
        from src.data.text import load_tokenizer

        tok = load_tokenizer((tmp_path / out / "tokenizer.json").read_text())
        return {s: tok.decode(np.fromfile(tmp_path / out / f"{s}.bin", "uint16").tolist(),
                              skip_special_tokens=False).split("<|endoftext|>")[:-1]
                for s in SPLITS}  # fmt: skip

    a, again, other = parts(0, "a"), parts(0, "again"), parts(1, "other")
    assert a == again and a != other
    assert sorted(d for s in SPLITS for d in a[s]) == docs  # each document once, whole
    assert 20 <= len(a["val"]) <= 40 and 20 <= len(a["test"]) <= 40
    assert max(a["val"]) > "document 200"  # not the last files: drawn from all of them


def test_validation_reads_at_most_val_tokens(tmp_path, shakespeare):
    kw = dict(name="s", processed_dir=str(tmp_path / "p"), path=str(shakespeare), tokenizer="char",
              block_size=64, num_proc=1)  # fmt: skip
    full, bounded = TextDataModule(**kw), TextDataModule(**kw, val_tokens=1000)
    for dm in (full, bounded):
        dm.prepare_data()
        dm.setup()
    assert len(bounded.val_dataloader().sampler) == 16  # windows starting at 0, 64, ..., 960
    assert len(full.val_dataloader().sampler) == (55770 - 64 + 63) // 64
    assert len(bounded.test_dataloader().sampler) == len(full.test_dataloader().sampler)


# --------------------------------------------------------------------------- progress


def test_progress_in_a_log_says_mb_done_rate_and_time_left(caplog):
    progress = Progress(total=10_000_000, every=0)
    with caplog.at_level(logging.INFO, logger="src.data.parallel"):
        progress.update(2_500_000)
    assert progress.bar is None  # pytest's output is not a terminal
    line = caplog.messages[-1]
    assert line.startswith("tokenising 2.5 of 10.0 MB (25 %), ") and "MB/s" in line
    assert line.endswith(" left")
    images = Progress(total=400, verb="decoding images", unit="images", scale=1, every=0)
    with caplog.at_level(logging.INFO, logger="src.data.parallel"):
        images.update(100)
    assert caplog.messages[-1].startswith("decoding images 100 of 400 images (25 %), ")
