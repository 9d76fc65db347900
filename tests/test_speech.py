"""Speech as tokens (src/data/speech.py), the data side of issue 20's text-to-speech: frames
stacked into vectors and back, the sequence layout, prompts by the same speaker, and the
codebook fitted on the training split only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from src.data import vq
from src.data.speech import (
    CODE_OFFSET,
    SEP_ID,
    SpeechPrompts,
    frame_vectors,
    sequence,
    spoken_word,
    vector_frames,
    word_ids,
)
from src.data.translation import EOS_ID, IGNORE
from tests.test_audio import FSDD, fsdd, module  # noqa: F401 (fsdd is a fixture)


def test_frames_stack_into_vectors_in_time_order_and_back():
    x = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8)  # (N, n_mels, T)
    v = frame_vectors(x, 2)
    assert v.shape == (2, 4, 6)
    assert np.array_equal(v[0, 1], np.concatenate([x[0, :, 2], x[0, :, 3]]))  # frames 2 and 3
    assert torch.equal(vector_frames(torch.from_numpy(v), 3), torch.from_numpy(x))


def test_a_sequence_is_word_prompt_target_with_separators():
    prompt, target = np.array([0, 5]), np.array([7, 7, 1])
    ids = sequence("two", prompt, target)
    assert ids == [EOS_ID, *word_ids("two"), SEP_ID, CODE_OFFSET, CODE_OFFSET + 5, SEP_ID,
                   CODE_OFFSET + 7, CODE_OFFSET + 7, CODE_OFFSET + 1, EOS_ID]  # fmt: skip
    assert sequence("two", prompt) == ids[:-4]  # what sampling continues
    assert spoken_word("7") == "seven" and spoken_word("Yes") == "yes"
    with pytest.raises(ValueError, match="letters"):
        word_ids("7")


def test_only_the_target_is_predicted_and_prompts_come_from_the_same_speaker():
    codes = np.arange(5)[:, None] * np.ones((5, 3), dtype=np.int64)  # recording i: codes i
    speakers = np.array(["a", "a", "b", "b", "b"])
    data = SpeechPrompts(codes, ["one"] * 5, speakers, train=True, seed=0)
    for _ in range(20):
        x, y = data[2]
        prompt = x[1 + 3 + 1 : 1 + 3 + 1 + 3] - CODE_OFFSET
        assert len(set(prompt.tolist())) == 1 and prompt[0].item() in (3, 4)  # speaker b, not 2
        assert (y[: 3 + 1 + 3 + 1] == IGNORE).all()  # the word, the prompt and the separators
        assert y[-4:].tolist() == [CODE_OFFSET + 2] * 3 + [EOS_ID] and len(x) == len(y)
    fixed = SpeechPrompts(codes, ["one"] * 5, speakers, train=False, seed=0)
    assert torch.equal(fixed[0][0], fixed[0][0]) and fixed[0][0][5].item() == CODE_OFFSET + 1


def test_speech_codes_are_fitted_on_the_training_split_and_travel_in_checkpoints(fsdd, tmp_path):  # noqa: F811
    dm = module(fsdd, tmp_path, pattern=FSDD, split="speaker", test_speakers=["theo"],
                codes=16, stack=2)  # fmt: skip
    train_rows = dm.split_rows()["train"]
    x = np.load(tmp_path / "processed" / "features.npy")
    expected = vq.fit_codebook(frame_vectors(x[train_rows], 2).reshape(-1, 128), 16, seed=0)
    assert np.allclose(dm.codebook(), expected)
    x_batch, y_batch = next(iter(dm.train_dataloader()))
    assert x_batch.shape == y_batch.shape and x_batch.shape[1] <= dm.model_kwargs["block_size"]
    assert dm.model_kwargs["vocab_size"] == CODE_OFFSET + 16
    state = dm.state_dict()
    assert np.allclose(state["codebook"], expected) and state["stack"] == 2


def test_tts_trains_through_the_entry_point_and_says_test_words_as_wavs(fsdd, tmp_path):  # noqa: F811
    import json

    import soundfile as sf

    from src.models.speech import Listener
    from tests.conftest import assert_ok, assert_one_error_line, run_module

    # a voice judge: the AST on the speakers (data.target=speaker), all three in training
    voices = tmp_path / "voices"
    proc = run_module("src.train", "model=ast", "data=fsdd", f"data.root={fsdd}",
                      "data.target=speaker", "model.net.n_layer=1", "model.net.d_model=32",
                      "trainer.max_steps=10", "logger=csv", "callbacks.progress_bar.refresh_rate=0",
                      f"paths.data_dir={tmp_path / 'd'}", f"hydra.run.dir={voices}")  # fmt: skip
    assert_ok(proc)
    judge = next((voices / "checkpoints").glob("best-*.ckpt"))
    heard = Listener(str(judge))([sf.read(fsdd / "3_theo_0.wav", dtype="float32")[0]])
    assert heard[0] in ("george", "jackson", "theo")  # heard through its own mel settings

    run = tmp_path / "run"
    proc = run_module("src.train", "experiment=tts_fsdd", f"data.root={fsdd}", "data.fold=2",
                      f"model.voice_judge={judge}", "model.judged=8",
                      "model.codes=16", "model.net.n_layer=1", "model.net.d_model=32",
                      "model.samples=2", "model.optim.warmup_steps=10", "trainer.max_steps=40",
                      "data.batch_size=16", "logger=csv", "callbacks.progress_bar.refresh_rate=0",
                      f"paths.data_dir={tmp_path / 'd'}", f"hydra.run.dir={run}")  # fmt: skip
    assert_ok(proc)
    rows = [r.split(",") for r in (run / "csv" / "metrics.csv").read_text().splitlines()]
    head = rows[0].index("train/loss")
    losses = [float(r[head]) for r in rows[1:] if r[head]]
    assert losses[-1] < losses[0]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test/loss"] > 0
    for kind in ("speech", "rebuilt", "real"):  # theo's first 8 words, said, rebuilt, as recorded
        assert 0 <= metrics[f"test/{kind}_voice_acc"] <= 1
    assert 0 <= metrics["test/seen_speech_voice_acc"] <= 1  # val: the speakers trained on
    assert "test/speech_digit_acc" not in metrics  # no digit judge given
    wavs = sorted((run / "samples").glob("*.wav"))
    assert len(wavs) == 2
    y, rate = sf.read(wavs[0])
    assert rate == 8000 and len(y) > 4000 and abs(y).max() > 0.5  # a second of sound
    assert (run / "speech.png").stat().st_size > 5_000

    # the sampling command: a word in the voice of a recording, into WAVs
    ckpt = run / "checkpoints" / "last.ckpt"
    voice = fsdd / "1_theo_3.wav"
    said = run_module("src.sample", f"ckpt={ckpt}", "prompt=seven", f"voice={voice}",
                      "num_samples=2", "top_k=20", f"out={tmp_path / 'seven.wav'}")  # fmt: skip
    assert_ok(said)
    for i in range(2):
        y, rate = sf.read(tmp_path / f"seven_{i}.wav")
        assert rate == 8000 and abs(len(y) - 8000) <= 80 and abs(y).max() > 0.5
    assert_one_error_line(
        run_module("src.sample", f"ckpt={ckpt}", "prompt=seven"), "voice=RECORDING"
    )
