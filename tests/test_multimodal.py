"""Text <-> image on digits (issue 20's Parti, captioner and CM3Leon-style models): captions
from measured strokes, the shared vocabulary's pairs in both directions, and each model trained
through `python -m src.train`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from src.data.captions import CaptionPairs, CaptionVocab, caption, ink_terciles
from src.data.images import ImageDataModule, fit_codebook
from tests.conftest import assert_ok, run_module

TINY = ["data=digits", "model.codes=32", "model.patch=2", "model.net.n_layer=1",
        "model.net.d_model=32", "model.samples_per_prompt=2", "model.val_sentences=50",
        "model.optim.warmup_steps=10", "trainer.max_steps=60", "trainer.val_check_interval=30",
        "data.batch_size=32", "logger=csv", "callbacks.progress_bar.refresh_rate=0"]  # fmt: skip


def test_captions_say_thick_and_thin_by_the_digits_own_ink_terciles():
    ink = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.4, 0.5, 0.6])
    images = np.repeat(ink[:, None, None, None], 4, axis=3).reshape(9, 1, 2, 2)
    labels = np.array([7] * 6 + [1] * 3)
    terciles = ink_terciles(images, labels)
    assert caption(7, 0.15, terciles) == "a thin seven"
    assert caption(7, 0.35, terciles) == "a seven"
    assert caption(7, 0.55, terciles) == "a thick seven"
    assert caption(1, 0.5, terciles) == "a one"  # 0.5 is thick for a seven, not for these ones


def test_pairs_of_both_directions_are_the_same_pairs_swapped_after_the_task_token():
    vocab = CaptionVocab(codes=16)
    codes = np.array([[3, 0, 15], [1, 2, 3]])
    pairs = CaptionPairs(codes, ["a thick seven", "a two"], vocab, "both")
    assert len(pairs) == 4
    src, tgt = pairs[0]  # text -> image: [<image>, words], [codes]
    assert src[0] == vocab.task("text2image") and vocab.decode_text(src[1:]) == "a thick seven"
    assert np.array_equal(vocab.image_codes(tgt), codes[0]) and tgt.min() >= vocab.code_offset
    back_src, back_tgt = pairs[2]  # the same image, image -> text
    assert back_src[0] == vocab.task("image2text")
    assert np.array_equal(back_src[1:], tgt) and np.array_equal(back_tgt, src[1:])
    one_way = CaptionPairs(codes, ["a thick seven", "a two"], vocab, "image2text")
    assert len(one_way) == 2 and np.array_equal(one_way[1][0], pairs[3][0])


def test_the_patch_codebook_is_fitted_on_the_training_split_only(tmp_path):
    data = ImageDataModule(str(tmp_path / "digits"), codes=16, patch=2, captions="text2image")
    data.prepare_data()
    train = np.load(tmp_path / "digits" / "train_x.npy")
    assert np.allclose(data.codebook.numpy(), fit_codebook(train, 16, seed=0, patch=2))
    data.setup()
    assert data.model_kwargs["vocab_size"] == len(CaptionVocab(16))
    batch = next(iter(data.train_dataloader()))
    assert batch["input_ids"].shape[1] <= 5 and batch["labels"].shape[1] == 16 + 1  # + EOS


@pytest.mark.parametrize("model", ["parti", "captioner", "cm3leon"])
def test_each_direction_trains_through_the_entry_point_and_its_loss_falls(tmp_path, model):
    run = tmp_path / "run"
    proc = run_module("src.train", f"model={model}", *TINY, f"paths.data_dir={tmp_path / 'd'}",
                      f"hydra.run.dir={run}")  # fmt: skip
    assert_ok(proc)
    metrics = json.loads((run / "metrics.json").read_text())
    rows = [r.split(",") for r in (run / "csv" / "metrics.csv").read_text().splitlines()]
    head = rows[0].index("train/loss")
    losses = [float(r[head]) for r in rows[1:] if r[head]]
    assert losses[-1] < losses[0]
    if model != "captioner":  # images drawn for every caption, and a grid of them saved
        assert 0 < metrics["test/image_distinct"] <= 1 and 0 <= metrics["test/stroke_auc"] <= 1
        assert (run / "samples.png").stat().st_size > 5_000
    if model != "parti":
        assert 0 <= metrics["test/caption_exact"] <= metrics["test/caption_digit_acc"] <= 1
    ckpt = run / "checkpoints" / "last.ckpt"
    if model == "captioner":  # a PNG of a digit in, a caption out
        from PIL import Image

        from src.data.image_files import read_digits

        Image.fromarray(read_digits().images[0, 0]).save(tmp_path / "digit.png")
        said = run_module("src.sample", f"ckpt={ckpt}", f"image={tmp_path / 'digit.png'}")
        assert_ok(said)
        assert said.stdout.split()[0] == "a"
    else:  # a prompt in, a PNG of its samples out
        from PIL import Image

        drawn = run_module("src.sample", f"ckpt={ckpt}", "prompt=a thick seven",
                           f"out={tmp_path / 'seven.png'}", "num_samples=4")  # fmt: skip
        assert_ok(drawn)
        assert Image.open(tmp_path / "seven.png").size[0] > 100
