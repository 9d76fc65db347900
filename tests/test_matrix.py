"""bench/matrix.py, the defaults matrix: a fast subset here (a pair that learns, a refused pair);
the whole matrix, every pair clearly above its trivial baseline, is `slow` (and a DVC stage)."""

from __future__ import annotations

import pytest

from bench.matrix import PAIRS, Pair, clearly_above, run
from tests.conftest import MIRROR


def test_a_plain_pair_learns_and_a_senseless_one_is_refused(tmp_path):
    learns = run(
        Pair("gcn", "karate", "test/acc", steps=60), tmp_path, [f"paths.data_dir={tmp_path}"]
    )
    assert learns["value"] > learns["baseline"] + 0.05, learns
    refused = run(Pair("egnn", "karate", "test/acc", steps=5), tmp_path)
    assert refused == {"refused": "error: egnn needs node positions (data.pos), e.g. data=esol"}


def test_clearly_above():
    assert clearly_above("test/acc", 0.75, 0.66) and not clearly_above("test/acc", 0.70, 0.66)
    assert clearly_above("test/rmse", 0.8, 2.0) and not clearly_above("test/rmse", 1.9, 2.0)
    assert clearly_above("test/loss", 2.0, 5.0) and not clearly_above("test/auroc", 0.55, 0.5)


@pytest.mark.slow
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p.label)
def test_every_pair_is_clearly_above_its_baseline_or_refused(tmp_path, pair):
    if not MIRROR.is_dir():
        pytest.skip(f"no data mirror at {MIRROR}")
    r = run(pair, tmp_path, [f"paths.data_dir={tmp_path}/data"])
    assert ("refused" in r) == pair.refused, r
    assert pair.refused or clearly_above(pair.metric, r["value"], r["baseline"]), r
