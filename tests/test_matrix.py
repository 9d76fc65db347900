"""bench/matrix.py, the defaults matrix: a fast subset here (a pair that learns, a refused pair);
the whole matrix, every pair clearly above its trivial baseline, is `slow` (and a DVC stage)."""

from __future__ import annotations

import csv
import math

import pytest

from bench.matrix import (
    BENCHED,
    PAIRS,
    Benched,
    Pair,
    clearly_above,
    folder,
    run,
    trails,
    user_files,
)
from tests.conftest import MIRROR, ROOT


def test_a_plain_pair_learns_and_a_senseless_one_is_refused(tmp_path):
    learns = run(
        Pair("gcn", "karate", "test/acc", steps=60), tmp_path, [f"paths.data_dir={tmp_path}"]
    )
    assert learns["value"] > learns["baseline"] + 0.05, learns
    refused = run(Pair("egnn", "karate", "test/acc", steps=5), tmp_path)
    assert refused == {"refused": "error: egnn needs node positions (data.pos), e.g. data=esol"}


def test_every_pair_has_its_own_label_and_folder():
    assert len({folder(p.label) for p in PAIRS}) == len(PAIRS)


def test_clearly_above():
    assert clearly_above("test/acc", 0.75, 0.66) and not clearly_above("test/acc", 0.70, 0.66)
    assert clearly_above("test/rmse", 0.8, 2.0) and not clearly_above("test/rmse", 1.9, 2.0)
    assert clearly_above("test/loss", 2.0, 5.0) and not clearly_above("test/auroc", 0.55, 0.5)
    assert clearly_above("test/chrf", 45.0, 30.0) and not clearly_above("test/chrf", 35.0, 30.0)


def test_the_stricter_column_fails_a_command_that_trails_its_bench_by_more_than_the_margin():
    acc, loss = Benched(0.989, 0.02, [], ""), Benched(1.90, 0.05, [], "")
    assert not trails("test/acc", 0.975, acc) and trails("test/acc", 0.965, acc)
    assert not trails("test/loss", 1.99, loss) and trails("test/loss", 2.0, loss)


@pytest.mark.parametrize("label", sorted(BENCHED))
def test_each_benched_pair_is_in_the_matrix_and_its_readme_command_composes(label):
    from hydra import compose, initialize_config_dir

    pair = next(p for p in PAIRS if p.label == label)
    overrides = [f"model={pair.model}", f"data={pair.data}", *pair.overrides,
                 *BENCHED[label].command]  # fmt: skip
    overrides = [o.format(runs="/runs", user="/user", split="fold0") for o in overrides]
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
        assert cfg.data._target_ and cfg.model._target_ and cfg.trainer.max_steps
        if BENCHED[label].prepare:  # the data step the README runs first
            assert compose("prepare", overrides=BENCHED[label].prepare).data._target_
    assert (ROOT / BENCHED[label].source).is_file()


def test_a_pair_that_reads_another_readme_run_runs_after_it():
    labels = [p.label for p in PAIRS]
    for label, bench in BENCHED.items():
        if bench.after:  # the AST taught by its split's CNN, BERT fine-tuned from its pre-training
            assert labels.index(bench.after) < labels.index(label)
            split = "{split}/" if BENCHED[bench.after].splits else ""
            assert f"{{runs}}/{folder(bench.after)}-README/{split}" in " ".join(bench.command)


def test_a_users_files_are_a_text_and_a_csv_of_other_speeches(tmp_path, shakespeare):
    # two speakers of tests/data's ten takes (the bench: 50 takes of jackson and nicolas)
    user_files(tmp_path / "user", tmp_path / "raw", ("george", "jackson"), takes=10)
    corpus = (tmp_path / "user/corpus.txt").read_text(encoding="utf-8")
    with open(tmp_path / "user/speakers.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len({r["label"] for r in rows}) == 2 and len(rows) > 100
    assert not any(r["text"] in corpus for r in rows if len(r["text"]) > 200)  # other speeches
    assert sorted(d.name for d in (tmp_path / "user/pics").iterdir()) == [str(k) for k in range(10)]
    sounds = sorted((tmp_path / "user/sounds").rglob("*.flac"))
    assert len(sounds) == 5 * 2 * 10 and {f.parent.name for f in sounds} == {
        "zero", "one", "two", "three", "four"}  # fmt: skip
    import soundfile as sf

    info = sf.info(sounds[0])
    assert (info.samplerate, info.channels, info.format) == (16000, 2, "FLAC")
    import datasets

    hub = datasets.Dataset.from_parquet(str(tmp_path / "user/pics.parquet"))
    assert len(hub) == 1797 and hub.features["label"].names == [str(k) for k in range(10)]
    commands = tmp_path / "user/commands"
    words = sorted(d.name for d in commands.iterdir() if d.is_dir())
    assert words == ["_background_noise_", "four", "one", "three", "two", "zero"]
    tests = (commands / "testing_list.txt").read_text().split()
    assert len(tests) == 5 * 2 and all((commands / name).is_file() for name in tests)
    assert sf.info(commands / tests[0]).channels == 1


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """One folder for the whole matrix: the fine-tuning pairs read the pre-training run's."""
    out = tmp_path_factory.mktemp("matrix")
    user_files(out / "user", raw_dir=out / "data/raw")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p.label)
def test_every_pair_is_clearly_above_its_baseline_or_refused(out, pair):
    if not MIRROR.is_dir():
        pytest.skip(f"no data mirror at {MIRROR}")
    r = run(pair, out, [f"paths.data_dir={out}/data"])
    assert ("refused" in r) == pair.refused, r
    assert pair.refused or clearly_above(pair.metric, r["value"], r["baseline"]), r


def test_a_pair_on_splits_averages_them(tmp_path):
    splits = ("data.fold=0", "data.fold=1")
    pair = Pair("gcn", "tudataset", "test/acc", steps=5, name="gcn/tudataset", splits=splits)
    # as the stricter column runs a README command: in a folder of its own, no baseline
    r = run(pair, tmp_path, [f"paths.data_dir={tmp_path}"], name="readme", scored=False)
    assert len(r["splits"]) == 2 and r["value"] == pytest.approx(sum(r["splits"]) / 2), r
    assert r["baseline"] is None
    for k in (0, 1):
        assert (tmp_path / f"readme/fold{k}/metrics.json").is_file()


def test_imagegpts_baseline_is_the_unigram_of_the_patch_stages_codes(tmp_path):
    r = run(Pair("imagegpt", "digits", "test/loss", steps=2), tmp_path,
            [f"paths.data_dir={tmp_path}", "model.codes=4"])  # fmt: skip
    assert 0 < r["baseline"] <= math.log(4) and r["value"] > 0, r
