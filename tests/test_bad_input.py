"""Bad input, swept as one table: for each input kind (corpus, labelled CSV/JSONL, graph folder,
SMILES CSV, checkpoint, config override) its broken variants (empty, truncated, random bytes,
wrong encoding, wrong columns, NaN values, huge values, path traversal in names). Each run ends
with one `error: ...` line on stderr and exit 1, never a traceback and never exit 0, and loses
nothing written before: the corpus and labelled dataset prepared earlier under data/processed
(the very folders the bad corpus and CSV would replace) and other datasets there, a run
folder's checkpoints and metrics, all stay byte for byte, and no processed folder of the bad
input is left behind.

The entry points run in this process (`python -m` through runpy: a few hundred ms a row instead
of a subprocess's seconds of imports); the other tests cover what each error means in detail."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import runpy
import shutil
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.conftest import SHAKESPEARE

# a corpus of a few thousand characters: enough for a training window in every split
TEXT = (
    SHAKESPEARE.read_text(encoding="utf-8")[:20_000]
    if SHAKESPEARE.exists()
    else "".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400))
)
LABELLED = "text,label\n" + "".join(
    f"{w} {w} {w} number {i},{lab}\n"
    for i in range(24)
    for w, lab in [(("apple pear plum", "fruit"), ("red blue green", "colour"))[i % 2]]
)
RANDOM = bytes(range(256)) * 4  # not UTF-8, not a pickle, not a zip
LATIN1 = "text,label\ncafé crème,boisson\nthé,boisson\n".encode("latin-1")
# a GPT small enough to train two steps in a second, on the corpus above (character level)
TINY_GPT = [
    "data=text", "data.tokenizer=char", "data.block_size=32", "data.batch_size=4",
    "data.steps_per_epoch=2", "model.net.n_layer=1", "model.net.n_head=2", "model.net.d_model=16",
    "model.net.block_size=32", "model.generation.max_new_tokens=4", "trainer.limit_val_batches=1",
    "trainer.log_every_n_steps=1", "callbacks.progress_bar.refresh_rate=0", "logger=none",
    "test=false",
]  # fmt: skip


def run_entry(module: str, argv: list[str]) -> int | str:
    """`python -m module argv...` in this process: its exit code, or the exception that escaped
    (which a user would see as a traceback)."""
    with as_a_process(module, argv), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is imported already
        try:
            runpy.run_module(module, run_name="__main__")
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else 1
        except BaseException:
            return "Traceback (escaped):\n" + traceback.format_exc()
    return 0


@contextlib.contextmanager
def as_a_process(module: str, argv: list[str]):
    """What a run changes for the rest of its process, undone afterwards for the other tests of
    this worker: sys.argv, the environment (Lightning's PL_GLOBAL_SEED, ...), the logging setup
    (Hydra's job logging; src.sample's disables every logger) and Hydra's global state."""
    from hydra.core.singleton import Singleton

    env, hydra_state, old_argv = dict(os.environ), Singleton.get_state(), sys.argv
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]  # fmt: skip
    saved = [(lg, lg.handlers[:], lg.level, lg.disabled, lg.propagate) for lg in loggers]
    sys.argv = [module, *argv]
    try:
        yield
    finally:
        sys.argv = old_argv
        os.environ.clear()
        os.environ.update(env)
        Singleton.set_state(hydra_state)
        for lg, handlers, level, disabled, propagate in saved:
            for h in lg.handlers:
                if h not in handlers:
                    h.close()  # e.g. the run folder's train.log
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.disabled, lg.propagate = disabled, propagate


@pytest.fixture(scope="module")
def earlier(tmp_path_factory) -> Path:
    """What earlier runs wrote: a prepared corpus and labelled dataset under data/processed, and
    a run folder with checkpoints of a GPT trained two steps on that corpus."""
    base = tmp_path_factory.mktemp("earlier")
    (base / "corpus.txt").write_text(TEXT, encoding="utf-8")
    (base / "labelled.csv").write_text(LABELLED, encoding="utf-8")
    data = f"paths.data_dir={base / 'data'}"
    for argv in (
        ["data=text", "data.tokenizer=char", f"data.path={base / 'corpus.txt'}", data],
        ["data=text_cls", f"data.path={base / 'labelled.csv'}", "data.vocab_size=300", data],
    ):
        assert run_entry("src.prepare", argv) == 0, argv
    train = [*TINY_GPT, f"data.path={base / 'corpus.txt'}", data, f"hydra.run.dir={base / 'run'}"]
    assert run_entry("src.train", [*train, "trainer.max_steps=2"]) == 0
    assert (base / "run" / "checkpoints" / "last.ckpt").is_file()
    # datasets of the graph families beside those the bad graph rows would write (as bytes: the
    # rows never read them, and must neither touch nor remove them)
    for folder in ("tudataset/MUTAG", "moleculenet/freesolv"):
        _write(base / "data" / "processed" / folder / "processed" / "data.pt", RANDOM)
    for f in ("config.yaml", "config_tree.log", "train.log"):  # a resumed run rewrites them
        (base / "run" / f).unlink()
    shutil.rmtree(base / "run" / ".hydra")
    return base


# ---------------------------------------------------------------- how each kind is broken


def _write(path: Path, content: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def corpus(content: bytes | str, *extra: str) -> Callable:
    """A corpus file named as the earlier one, so that it would replace its prepared folder."""

    def make(tmp: Path, earlier: Path) -> list[str]:
        path = _write(tmp / "in" / "corpus.txt", content)
        return ["data=text", "data.tokenizer=char", f"data.path={path}", *extra]

    return make


def labelled(suffix: str, content: bytes | str, *extra: str) -> Callable:
    """A labelled CSV or JSONL named as the earlier one (same processed folder)."""

    def make(tmp: Path, earlier: Path) -> list[str]:
        path = _write(tmp / "in" / f"labelled.{suffix}", content)
        return ["data=text_cls", f"data.path={path}", "data.vocab_size=300", *extra]

    return make


def jsonl(*rows: str) -> str:
    return "".join(row + "\n" for row in rows)


TOY_A = "".join(f"{a}, {b}\n{b}, {a}\n" for a, b in [(1, 2), (2, 3), (3, 1), (4, 5), (5, 6),
                                                        (6, 4), (7, 8)])  # fmt: skip


def tu_folder(files: dict[str, bytes | str], *extra: str) -> Callable:
    """A TUDataset TOY in its raw home data/raw/TUDataset/TOY/raw/: two triangles and an edge
    (graph labels 0, 1, 0), with `files` replacing or adding `TOY_<part>.txt`."""
    good = {"A": TOY_A, "graph_indicator": "1\n1\n1\n2\n2\n2\n3\n3\n", "graph_labels": "0\n1\n0\n"}

    def make(tmp: Path, earlier: Path) -> list[str]:
        raw = tmp / "data" / "raw" / "TUDataset" / "TOY" / "raw"
        for part, content in {**good, **files}.items():
            _write(raw / f"TOY_{part}.txt", content)
        return ["data=tudataset", "data.name=TOY", "data.download=false", "data.num_folds=3",
                *extra]  # fmt: skip

    return make


def smiles_csv(content: bytes | str, *extra: str) -> Callable:
    """ESOL's csv in its raw home data/raw/esol/ (ESOL's layout: target second to last, SMILES
    last)."""

    def make(tmp: Path, earlier: Path) -> list[str]:
        _write(tmp / "data" / "raw" / "esol" / "delaney-processed.csv", content)
        return ["data=esol", "data.download=false", *extra]

    return make


# ten small molecules: enough for ESOL's 80/10/10 split to give each split one
ESOL_ROWS = "Compound ID,measured log solubility,smiles\n" + "".join(
    f"mol{i},{-i / 4},{smiles}\n"
    for i, smiles in enumerate(
        ["C", "CC", "CCC", "CCO", "CO", "CN", "CCN", "OCCO", "CCCl", "c1ccccc1"]
    )
)


def _real_ckpt(earlier: Path) -> dict:
    return torch.load(earlier / "run" / "checkpoints" / "last.ckpt", weights_only=True)


def ckpt_file(build: Callable[[Path], bytes | dict], entry: str = "src.train") -> Callable:
    """A checkpoint (bytes, or a dict built from the earlier run's last.ckpt) given to `entry`:
    ckpt_path=FILE of src.train (resuming the tiny GPT) or ckpt=FILE of src.sample."""

    def make(tmp: Path, earlier: Path) -> list[str]:
        path = tmp / "in" / "model.ckpt"
        content = build(earlier)
        if isinstance(content, dict):
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(content, path)
        else:
            _write(path, content)
        if entry == "src.sample":
            return [f"ckpt={path}"]
        return [*TINY_GPT, f"data.path={earlier / 'corpus.txt'}", "trainer.max_steps=4",
                f"ckpt_path={path}"]  # fmt: skip

    return make


def weights(value: float) -> Callable[[Path], dict]:
    """The earlier checkpoint with every weight set to `value` (1e308 becomes inf in float32)."""

    def build(earlier: Path) -> dict:
        ckpt = _real_ckpt(earlier)
        for v in ckpt["state_dict"].values():
            if v.is_floating_point():
                v.copy_(torch.tensor(value, dtype=torch.float64))
        return ckpt

    return build


def without(key: str) -> Callable[[Path], dict]:
    """The earlier checkpoint without `key`, or without the last tensor (key "tensor")."""

    def build(earlier: Path) -> dict:
        ckpt = _real_ckpt(earlier)
        if key == "tensor":
            del ckpt["state_dict"][next(reversed(ckpt["state_dict"]))]
        else:
            del ckpt[key]
        return ckpt

    return build


def bad_last(tmp: Path, earlier: Path) -> list[str]:
    """ckpt_path=last, the run folder's own last.ckpt cut in half (a disk that filled up)."""
    last = tmp / "run" / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    return [*TINY_GPT, f"data.path={earlier / 'corpus.txt'}", "trainer.max_steps=4",
            "ckpt_path=last"]  # fmt: skip


def config(*overrides: str, data: str = "text") -> Callable:
    """Overrides of src.prepare on the earlier corpus."""

    def make(tmp: Path, earlier: Path) -> list[str]:
        return [f"data={data}", f"data.path={earlier / 'corpus.txt'}", "data.tokenizer=char",
                *overrides]  # fmt: skip

    return make


def sample_config(*overrides: str) -> Callable:
    """Overrides of src.sample on the earlier run's last.ckpt."""

    def make(tmp: Path, earlier: Path) -> list[str]:
        return [f"ckpt={earlier / 'run' / 'checkpoints' / 'last.ckpt'}", *overrides]

    return make


@dataclass
class Bad:
    kind: str
    variant: str
    entry: str  # the module run: src.prepare, src.train or src.sample
    make: Callable[[Path, Path], list[str]]  # (tmp, earlier) -> command-line overrides
    message: str  # a fragment of the error line
    marks: tuple = ()

    def param(self):
        return pytest.param(self, id=f"{self.kind}-{self.variant}", marks=self.marks)


P, T, S = "src.prepare", "src.train", "src.sample"
# fmt: off
ROWS = [
    # -------- corpus: data=text data.path=FILE (named as the earlier corpus: same folder)
    Bad("corpus", "empty", P, corpus(""), "corpus is empty"),
    Bad("corpus", "truncated mid-character", P, corpus("Né".encode()[:-1]), "is not UTF-8 text"),
    Bad("corpus", "UTF-16", P, corpus("To be, or not to be".encode("utf-16")), "is not UTF-8"),
    Bad("corpus", "huge vocab_size", P, corpus(TEXT, "data.tokenizer=bpe", "data.vocab_size=1e308"),
        "data.vocab_size=1e+308 must be a positive integer"),
    Bad("corpus", "traversal in data.name", P, corpus(TEXT, "data.name=../../x"),
        "data.name='../../x' must name one folder"),
    # -------- labelled CSV / JSONL: data=text_cls data.path=FILE (named as the earlier one)
    Bad("labelled", "empty csv", P, labelled("csv", ""), "labelled data is empty"),
    Bad("labelled", "truncated csv", P, labelled("csv", 'text,label\nhello,a\n"bye wor'),
        "line 3 has no label"),
    Bad("labelled", "latin-1 csv", P, labelled("csv", LATIN1), "is not UTF-8 text"),
    Bad("labelled", "random bytes jsonl", P, labelled("jsonl", RANDOM), "is not UTF-8 text"),
    Bad("labelled", "wrong columns csv", P, labelled("csv", "sentence,class\nhi,a\n"),
        "lacks the column(s) text, label"),
    Bad("labelled", "NaN label jsonl", P,
        labelled("jsonl", jsonl('{"text": "a", "label": 1}', '{"text": "b", "label": NaN}')),
        "line 2: a label is NaN or infinite"),
    Bad("labelled", "huge field csv", P, labelled("csv", f"text,label\n{'x' * 200_000},a\n"),
        "line 2: field larger than field limit"),
    Bad("labelled", "traversal in data.name", P, labelled("csv", LABELLED, "data.name=../../x"),
        "data.name='../../x' must name one folder"),
    # -------- graph folder: data=tudataset data.name=TOY, raw files TOY_*.txt
    Bad("graph folder", "empty A", P, tu_folder({"A": ""}), "TOY_A.txt is empty"),
    Bad("graph folder", "truncated A", P, tu_folder({"A": TOY_A + "3,"}),
        "TOY_A.txt does not end with a newline"),
    Bad("graph folder", "random bytes", P, tu_folder({"A": RANDOM + b"\n"}), "can't decode byte"),
    Bad("graph folder", "wrong columns", P, tu_folder({"A": "1, 2, 3\n2, 1, 3\n"}),
        "cannot read TUDataset TOY"),
    Bad("graph folder", "NaN target", P, tu_folder({"graph_attributes": "0.5\nnan\n1.5\n"}),
        "TOY has targets that are not finite"),
    Bad("graph folder", "node index beyond the nodes", P, tu_folder({"A": TOY_A + "1, 999999\n"}),
        "an edge to its node 999999, but 3 nodes"),
    Bad("graph folder", "traversal in data.name", P, tu_folder({}, "data.name=../../x"),
        "data.name='../../x' must name one folder"),
    # -------- SMILES CSV: data=esol, ESOL's csv in data/raw/esol/
    Bad("smiles csv", "empty", P, smiles_csv(""), "holds no molecules"),
    Bad("smiles csv", "truncated", P, smiles_csv(ESOL_ROWS + "mol10,-0.7,CC("),
        "does not end with a newline"),
    Bad("smiles csv", "random bytes", P, smiles_csv(RANDOM), "is not UTF-8 text"),
    Bad("smiles csv", "NaN target", P, smiles_csv(ESOL_ROWS + "mol10,nan,CCCC\n"),
        "ESOL has targets that are not finite"),
    Bad("smiles csv", "huge target", P, smiles_csv(ESOL_ROWS + "mol10,1e999,CCCC\n"),
        "ESOL has targets that are not finite"),
    Bad("smiles csv", "traversal in data.name", P, smiles_csv(ESOL_ROWS, "data.name=../../x"),
        "unknown MoleculeNet dataset '../../x'"),
    # -------- checkpoint: ckpt_path=FILE of src.train, ckpt=FILE of src.sample
    Bad("checkpoint", "empty", T, ckpt_file(lambda e: b""), "cannot read checkpoint"),
    Bad("checkpoint", "random bytes", T, ckpt_file(lambda e: RANDOM), "cannot read checkpoint"),
    Bad("checkpoint", "truncated last.ckpt", T, bad_last, "cannot read checkpoint"),
    Bad("checkpoint", "pickled objects", T,
        ckpt_file(lambda e: {"state_dict": {}, "args": argparse.Namespace(lr=1)}),
        "Unsupported global"),
    Bad("checkpoint", "no state_dict", T, ckpt_file(without("state_dict")),
        "is not a checkpoint of this pipeline"),
    Bad("checkpoint", "missing tensor", T, ckpt_file(without("tensor")), "does not fit"),
    Bad("checkpoint", "NaN weights", T, ckpt_file(weights(float("nan"))),
        "training loss became nan"),
    Bad("checkpoint", "huge weights (sample)", S, ckpt_file(weights(1e308), S),
        "holds NaN or infinite weights"),
    Bad("checkpoint", "no tokenizer (sample)", S, ckpt_file(without("TextDataModule"), S),
        "carries no tokenizer"),
    # -------- config override (src.prepare composes src.train's config)
    Bad("config", "misspelt key", P, config("data.vocab_sise=100"),
        "Key 'vocab_sise' is not in struct"),
    Bad("config", "unknown option", P, config(data="nope"), "Could not find 'data/nope'"),
    Bad("config", "unparsable", P, config("data.splits=[0.9,"),
        "override 'data.splits=[0.9,': no viable alternative"),
    Bad("config", "wrong type", P, config("data.block_size=abc"),
        "data.block_size='abc' must be a positive integer"),
    Bad("config", "NaN", P, config("data.splits=[nan,0.5,0.5]"), "data.splits=[nan, 0.5, 0.5]"),
    Bad("config", "unresolvable", P, config("data.glob=${nope}"), "key 'nope' not found"),
    Bad("config", "missing value (sample)", S, lambda tmp, earlier: [], "Missing mandatory value"),
    Bad("config", "wrong type (sample)", S, sample_config("max_new_tokens=abc"),
        "max_new_tokens must be an integer, got 'abc'"),
]
# fmt: on


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under `root`, by relative path."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


# what a failed run may add: its config and log in the run folder, src.train's lock file
ALLOWED_NEW = ("run/.hydra", "run/config.yaml", "run/config_tree.log", "run/train.log",
               "data/.prepare.lock")  # fmt: skip


@pytest.mark.parametrize("bad", [row.param() for row in ROWS])
def test_bad_input_is_one_error_line_and_loses_nothing(bad, tmp_path, earlier, capfd, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # as a user runs it
    monkeypatch.setenv("WANDB_MODE", "offline")
    shutil.copytree(earlier / "data", tmp_path / "data")
    shutil.copytree(earlier / "run", tmp_path / "run")
    argv = bad.make(tmp_path, earlier)
    if bad.entry != "src.sample":
        argv += [f"paths.data_dir={tmp_path / 'data'}", f"hydra.run.dir={tmp_path / 'run'}"]
    before = snapshot(tmp_path)
    capfd.readouterr()

    code = run_entry(bad.entry, argv)
    out, err = capfd.readouterr()
    assert code == 1, f"exit {code}\n{out[-2000:]}\n{err[-3000:]}"
    assert "Traceback" not in out + err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert err.rstrip().splitlines()[-1] == errors[0], err[-3000:]  # it ends the output
    assert bad.message in errors[0], errors[0]

    after = snapshot(tmp_path)
    changed = [p for p, content in before.items() if after.get(p, b"gone") != content]
    assert not changed, f"changed or lost: {changed}"
    new = [p for p in after if p not in before and not p.startswith(ALLOWED_NEW)]
    assert not new, f"written by the failed run: {new}"
