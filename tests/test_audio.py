"""Audio (sec. 12.4.3): the mel stage, the splits by speaker, SpecAugment, bad audio files, and the
audio spectrogram Transformer and the CNN through the entry point, on FSDD recordings from the
data mirror."""

from __future__ import annotations

import csv
import json
import logging
import shutil
import tracemalloc

import numpy as np
import pytest
import torch

from src.data.audio import AudioDataModule
from src.data.mels import load_audio, log_mel, mel_to_audio
from src.nn.patch import PatchEmbedding
from src.utils.errors import PipelineError
from tests.conftest import MIRROR, assert_ok, assert_one_error_line, run_module

RECORDINGS = MIRROR / "fsdd" / "recordings"
FSDD = r"(?P<label>\d)_(?P<speaker>[a-z]+)_(?P<take>\d+)\.wav"
SETTINGS = dict(sample_rate=8000, duration=1.0, fit="pad", n_mels=64, n_fft=512, win_length=200,
                hop_length=80, f_min=0.0, f_max=None, top_db=80.0)  # fmt: skip


@pytest.fixture(scope="module")
def fsdd(tmp_path_factory):
    """10 takes of every digit by 3 of FSDD's speakers: 300 real recordings."""
    if not RECORDINGS.is_dir():
        pytest.skip(f"dataset missing in the mirror: {RECORDINGS}")
    root = tmp_path_factory.mktemp("fsdd")
    for speaker in ("george", "jackson", "theo"):
        for digit in range(10):
            for take in range(10):
                name = f"{digit}_{speaker}_{take}.wav"
                shutil.copy(RECORDINGS / name, root / name)
    return root


def module(root, tmp_path, **kw) -> AudioDataModule:
    dm = AudioDataModule(processed_dir=str(tmp_path / "processed"), root=str(root), **kw)
    dm.prepare_data()
    dm.setup()
    return dm


# ---------------------------------------------------------------- the mel stage


@pytest.mark.parametrize(
    "changes, shape",
    [({}, (64, 100)), ({"duration": 0.5}, (64, 50)), ({"n_mels": 40, "hop_length": 160}, (40, 50)),
     ({"sample_rate": 16000, "hop_length": 160, "duration": 2.0}, (64, 200)),
     ({"fit": "stretch"}, (64, 100)), ({"fit": "stretch", "duration": 0.5}, (64, 50))],
)  # fmt: skip
def test_log_mels_have_n_mels_bands_and_duration_over_hop_frames(changes, shape):
    s = {**SETTINGS, **changes}
    short = np.random.default_rng(0).standard_normal(1000).astype(np.float32)  # padded
    long = np.random.default_rng(0).standard_normal(5 * s["sample_rate"]).astype(np.float32)
    assert log_mel(short, s).shape == log_mel(long, s).shape == shape


def test_a_sine_tone_peaks_in_the_mel_band_of_its_frequency():
    import librosa

    t = np.arange(8000) / 8000
    tone = np.sin(2 * np.pi * 1000 * t).astype(np.float32)  # 1 kHz for a second
    mel = log_mel(tone, SETTINGS)  # (64, 100)
    centres = librosa.mel_frequencies(64 + 2, fmin=0, fmax=4000)[1:-1]
    assert int(mel.mean(1).argmax()) == int(np.abs(centres - 1000).argmin())


def test_a_log_mel_goes_back_to_audio_with_the_same_pitch_and_length():
    import librosa

    band = 18
    hz = librosa.mel_frequencies(64 + 2, fmin=0, fmax=4000)[1 + band]  # at a band's centre
    tone = np.sin(2 * np.pi * hz * np.arange(8000) / 8000).astype(np.float32)
    mel = log_mel(tone, SETTINGS)
    y = mel_to_audio(mel, SETTINGS)  # 100 frames of 10 ms
    assert abs(len(y) - 8000) <= SETTINGS["hop_length"] and np.abs(y).max() == pytest.approx(0.9)
    spectrum = np.abs(np.fft.rfft(y))
    assert abs(np.fft.rfftfreq(len(y), 1 / 8000)[spectrum.argmax()] - hz) < 60  # a mel band
    assert int(log_mel(y, SETTINGS).mean(1).argmax()) == int(mel.mean(1).argmax()) == band
    np.testing.assert_array_equal(y, mel_to_audio(mel, SETTINGS))  # Griffin-Lim seeded


def test_log_mels_are_in_db_below_the_peak_so_a_quieter_take_gives_the_same_image():
    y = np.random.default_rng(0).standard_normal(6000).astype(np.float32)
    loud, quiet = log_mel(y, SETTINGS), log_mel(0.01 * y, SETTINGS)
    heard = loud > -60  # below, float32 rounding noise of the STFT, which does not scale
    np.testing.assert_allclose(loud[heard], quiet[heard], atol=1e-3)
    assert loud.max() == 0 and loud.min() == -SETTINGS["top_db"]  # the padding sits on the floor


def test_stretch_fills_the_window_with_the_word_whatever_its_pace():
    import librosa

    word = librosa.chirp(fmin=300, fmax=3000, sr=8000, duration=0.4).astype(np.float32)
    slow = librosa.chirp(fmin=300, fmax=3000, sr=8000, duration=0.8).astype(np.float32)
    s = {**SETTINGS, "fit": "stretch"}
    peak = [log_mel(y, s).argmax(0) for y in (word, slow)]  # the loudest band of each frame
    assert np.abs(peak[0] - peak[1]).mean() < 2  # the same sweep over the same 100 frames
    padded = log_mel(word, SETTINGS)
    assert (padded[:, 50:] == -SETTINGS["top_db"]).all()  # pad: 0.4 s of sweep, then silence


def test_trim_cuts_the_quiet_ends_so_a_stretched_word_fills_the_window_alike():
    import librosa

    word = librosa.chirp(fmin=300, fmax=3000, sr=8000, duration=0.4).astype(np.float32)
    noise = 1e-3 * np.random.default_rng(0).standard_normal(2400).astype(np.float32)  # -60 dB
    padded = np.concatenate([noise[:1600], word, noise[1600:]])  # 0.2 s before, 0.1 s after
    s = {**SETTINGS, "fit": "stretch"}
    trimmed = log_mel(padded, {**s, "trim_db": 40})
    assert np.abs(trimmed.argmax(0) - log_mel(word, s).argmax(0)).mean() < 2  # the same sweep
    # untrimmed, the sweep is squeezed into the middle 57 % and the quiet ends fill the rest
    assert np.abs(log_mel(padded, s).argmax(0) - log_mel(word, s).argmax(0)).mean() > 5


def test_rescale_moves_a_band_up_by_the_factor():
    from src.data.audio import rescale

    x = torch.zeros(64, 100)
    x[20] = 1.0
    assert int(rescale(x, 0, 1.5).sum(1).argmax()) == 30  # band 20 read at 20 x 1.5
    assert int(rescale(x, 0, 0.5).sum(1).argmax()) == 10
    assert torch.equal(rescale(x, 1, 1.0), x)


def test_the_stage_writes_features_and_manifest_once_and_again_when_n_mels_changes(fsdd, tmp_path):
    dm = module(fsdd, tmp_path, pattern=FSDD)
    features = tmp_path / "processed" / "features.npy"
    assert np.load(features, mmap_mode="r").shape == (300, 64, 100)
    manifest = (tmp_path / "processed" / "manifest.tsv").read_text().splitlines()
    rows = list(csv.DictReader(manifest, delimiter="\t"))
    assert rows[0] == {"file": "0_george_0.wav", "label": "0", "speaker": "george", "take": "0"}
    stamp = features.stat().st_mtime_ns
    dm.prepare_data()  # same settings: nothing to do
    assert features.stat().st_mtime_ns == stamp
    module(fsdd, tmp_path, pattern=FSDD, n_mels=32)
    assert np.load(features, mmap_mode="r").shape == (300, 32, 100)


def noise_folder(root, n: int, seconds: float = 0.3):
    """n recordings of noise at 8 kHz named as FSDD's, the k-th file k / n of a second longer."""
    import soundfile as sf

    root.mkdir(parents=True)
    rng = np.random.default_rng(n)
    for k in range(n):
        y = 0.1 * rng.standard_normal(int((seconds + k / n) * 8000)).astype(np.float32)
        sf.write(root / f"{k % 10}_{'ab'[k % 2]}_{k}.wav", y, 8000)
    return root


def prepared(root, out, **kw) -> AudioDataModule:
    dm = AudioDataModule(processed_dir=str(out), root=str(root), pattern=FSDD, **kw)
    dm.prepare_data()
    return dm


def test_processes_write_the_files_one_process_writes_and_num_proc_is_no_setting(tmp_path, caplog):
    root = noise_folder(tmp_path / "audio", 20)
    one = prepared(root, tmp_path / "one", num_proc=1, chunk=3)
    with caplog.at_level(logging.INFO, logger="src.data.audio"):
        two = prepared(root, tmp_path / "two", num_proc=2, chunk=3)  # 7 jobs, the last of 2
    assert "with 2 process(es)" in caplog.messages[-1]
    for name in ("features.npy", "manifest.tsv"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    assert one.meta == two.meta and one.meta["image_size"] == [64, 100]
    x = np.load(tmp_path / "two" / "features.npy")  # (20, 64, 100)
    mels = [log_mel(load_audio(root / r[0], 8000), SETTINGS) for r in two._rows()]
    np.testing.assert_array_equal(x, mels)
    stamp = (tmp_path / "one" / "features.npy").stat().st_mtime_ns
    prepared(root, tmp_path / "one", num_proc=2, chunk=5)  # same settings: nothing to do
    assert (tmp_path / "one" / "features.npy").stat().st_mtime_ns == stamp


def test_processes_skip_a_bad_file_in_a_chunk_and_keep_the_others_rows_in_order(tmp_path):
    root = noise_folder(tmp_path / "audio", 12)
    files = sorted(root.iterdir())
    files[4].write_bytes(b"RIFF\x00\x01\x00\x00WAVEfmt " + bytes(40))  # the 2nd of job 2
    with pytest.raises(PipelineError, match=f"{files[4].name}: not a readable audio file"):
        prepared(root, tmp_path / "processed", num_proc=2, chunk=3)
    assert not (tmp_path / "processed").exists()
    dm = prepared(root, tmp_path / "processed", num_proc=2, chunk=3, skip_bad=True)
    good = files[:4] + files[5:]
    assert dm.meta["files"] == 11 and dm.meta["skipped"] == 1
    assert [r[0] for r in dm._rows()] == [f.name for f in good]
    x = np.load(tmp_path / "processed" / "features.npy")  # (11, 64, 100)
    np.testing.assert_array_equal(x, [log_mel(load_audio(f, 8000), SETTINGS) for f in good])
    assert sorted(p.name for p in (tmp_path / "processed").iterdir()) == [
        "features.npy", "manifest.tsv", "meta.json"]  # fmt: skip


def test_preparation_memory_is_set_by_the_chunk_not_the_number_of_files(tmp_path):
    """The peak of memory traced (numpy's arrays included) while preparing 4 x as many files
    stays within 30 %: stacking every spectrogram at the end would triple it here."""
    small, large = noise_folder(tmp_path / "small", 24), noise_folder(tmp_path / "large", 96)
    peaks = []
    for k, root in enumerate((small, small, large)):  # the first loads librosa's modules
        dm = AudioDataModule(processed_dir=str(tmp_path / f"processed{k}"), root=str(root),
                             pattern=FSDD, num_proc=1, chunk=4)  # fmt: skip
        tracemalloc.start()
        dm.prepare_data()
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert dm.meta["files"] == 96
    assert peaks[2] < 1.3 * peaks[1], peaks


# ---------------------------------------------------------------- splits and batches


def test_normalisation_statistics_come_from_the_training_split_only(fsdd, tmp_path):
    dm = module(fsdd, tmp_path, pattern=FSDD, split="speaker", test_speakers=["theo"])
    features = np.load(tmp_path / "processed" / "features.npy")
    train_rows = dm.split_rows()["train"]
    train = dm.splits["train"]
    assert train.mean == pytest.approx(float(features[train_rows].mean()), rel=1e-5)
    assert train.std == pytest.approx(float(features[train_rows].std()), rel=1e-4)
    assert dm.splits["test"].mean == train.mean  # test spectrograms use the train statistics
    assert abs(float(features.mean()) - train.mean) > 1e-3  # all rows would give another


@pytest.mark.parametrize("scale", [False, True])
def test_speaker_norm_centres_each_voice_per_mel_band_with_its_own_recordings(scale):
    from src.data.audio import speaker_normalised

    rng = np.random.default_rng(0)
    speakers = np.array(["ann", "bob", "ann", "bob", "bob"])
    voices = {"ann": rng.normal(3, 2, (4, 1)), "bob": rng.normal(-1, 5, (4, 1))}  # per band
    x = rng.normal(size=(5, 4, 6)) + np.stack([voices[s] for s in speakers])
    out = speaker_normalised(x, speakers, scale=scale)
    for speaker in voices:
        voice = out[speakers == speaker]
        np.testing.assert_allclose(voice.mean(axis=(0, 2)), 0, atol=1e-5)
        if scale:
            np.testing.assert_allclose(voice.std(axis=(0, 2)), 1, atol=1e-4)
    # a band's course over time in one recording (the word) is only shifted and scaled
    band_std = x[speakers == "ann"].std(axis=(0, 2))[:, None] if scale else 1.0
    np.testing.assert_allclose(np.diff(out[0], axis=1), np.diff(x[0], axis=1) / band_std, atol=1e-4)
    with pytest.raises(PipelineError, match="speaker"):
        speaker_normalised(x, np.array(["ann", "", "ann", "bob", "bob"]), scale=scale)


def test_speaker_norm_in_the_data_module_uses_the_unheard_speakers_own_statistics(fsdd, tmp_path):
    dm = module(fsdd, tmp_path, pattern=FSDD, split="speaker", test_speakers=["theo"],
                speaker_norm="meanvar")  # fmt: skip
    test = torch.stack([dm.splits["test"][i][0][0] for i in range(len(dm.splits["test"]))])
    bands = test.permute(1, 0, 2).flatten(1)  # (n_mels, recordings x frames)
    assert bands.std(1).std() < 1e-3  # every band of theo's alike, after the global scaling
    with pytest.raises(PipelineError, match="speaker_norm"):
        AudioDataModule(processed_dir=str(tmp_path), speaker_norm="cmvn")


@pytest.mark.parametrize("fold", [0, 1, 2])
def test_the_speaker_split_never_puts_one_speaker_on_both_sides(fsdd, tmp_path, fold):
    dm = module(fsdd, tmp_path, pattern=FSDD, split="speaker", fold=fold)
    _, speakers, _ = dm.manifest()
    rows = dm.split_rows()
    held_out = ["george", "jackson", "theo"][fold]
    assert set(speakers[rows["test"]]) == {held_out}
    assert held_out not in set(speakers[rows["train"]]) | set(speakers[rows["val"]])
    assert sum(len(r) for r in rows.values()) == 300


def test_the_official_split_tests_takes_0_to_4(fsdd, tmp_path):
    dm = module(fsdd, tmp_path, pattern=FSDD, split="official")
    _, _, takes = dm.manifest()
    rows = dm.split_rows()
    assert (takes[rows["test"]] < 5).all() and len(rows["test"]) == 150
    assert (takes[np.concatenate([rows["train"], rows["val"]])] >= 5).all()


def test_target_speaker_classifies_voices_over_the_same_spectrograms(fsdd, tmp_path):
    dm = module(fsdd, tmp_path, pattern=FSDD, target="speaker")
    y, speakers, _ = dm.manifest()
    assert dm.classes == ["george", "jackson", "theo"] and dm.model_kwargs["num_classes"] == 3
    assert [dm.classes[i] for i in y] == speakers.tolist()
    _, target = dm.splits["test"][0]
    assert dm.classes[target] == speakers[dm.split_rows()["test"][0]]
    with pytest.raises(PipelineError, match="classifies voices"):
        module(fsdd, tmp_path, pattern=FSDD, target="speaker", split="speaker", fold=0)


def test_specaugment_masks_up_to_the_configured_widths_only_in_training(fsdd, tmp_path):
    dm = module(fsdd, tmp_path, pattern=FSDD, freq_mask=8, time_mask=20)

    def masked(x: torch.Tensor) -> tuple[int, int]:  # (bands, frames) entirely zero
        zero = x[0] == 0
        return int(zero.all(1).sum()), int(zero.all(0).sum())

    train = [masked(dm.splits["train"][i][0]) for i in range(50)]
    assert max(b for b, _ in train) <= 8 and max(f for _, f in train) <= 20
    assert sum(b for b, _ in train) > 0 and sum(f for _, f in train) > 0
    assert all(masked(dm.splits["val"][i][0]) == (0, 0) for i in range(20))


def test_warps_change_only_the_training_spectrograms(fsdd, tmp_path):
    plain = module(fsdd, tmp_path / "a", pattern=FSDD)
    warped = module(fsdd, tmp_path / "b", pattern=FSDD, freq_warp=0.15, time_warp=0.15)
    for split, same in (("train", False), ("val", True), ("test", True)):
        pairs = [(plain.splits[split][i][0], warped.splits[split][i][0]) for i in range(10)]
        assert all(torch.equal(a, b) for a, b in pairs) == same


def test_labels_come_from_class_folders_without_a_pattern(fsdd, tmp_path):
    root = tmp_path / "commands"
    for word, digit in (("yes", 1), ("no", 2)):
        (root / word).mkdir(parents=True)
        for take in range(5):
            shutil.copy(fsdd / f"{digit}_george_{take}.wav", root / word / f"{take}.wav")
    dm = module(root, tmp_path)
    assert dm.classes == ["no", "yes"] and dm.model_kwargs == {
        "image_size": [64, 100], "channels": 1, "num_classes": 2}  # fmt: skip


# ---------------------------------------------------------------- bad audio


def bad_folder(fsdd, tmp_path, kind: str):
    """A folder of three good recordings and one bad file named 9_george_0.wav."""
    import soundfile as sf

    root = tmp_path / "audio"
    root.mkdir()
    for take in range(3):
        shutil.copy(fsdd / f"1_george_{take}.wav", root)
    bad = root / "9_george_0.wav"
    if kind == "corrupt":
        bad.write_bytes(b"RIFF\x00\x01\x00\x00WAVEfmt " + bytes(40))
    else:  # a well-formed WAV of no samples
        sf.write(bad, np.zeros(0, np.float32), 8000)
    return root


@pytest.mark.parametrize("kind, match", [("corrupt", "not a readable audio file"),
                                         ("empty", "an empty audio file")])  # fmt: skip
def test_a_bad_file_is_named_and_the_stage_leaves_nothing_behind(fsdd, tmp_path, kind, match):
    root = bad_folder(fsdd, tmp_path, kind)
    with pytest.raises(PipelineError, match=f"9_george_0.wav: {match}"):
        module(root, tmp_path, pattern=FSDD)
    assert not (tmp_path / "processed").exists()
    dm = module(root, tmp_path, pattern=FSDD, skip_bad=True, splits=[0.34, 0.33, 0.33])
    assert dm.meta["files"] == 3 and dm.meta["skipped"] == 1


def test_a_bad_audio_file_is_one_error_line_through_the_entry_point(fsdd, tmp_path):
    root = bad_folder(fsdd, tmp_path, "corrupt")
    data, run = tmp_path / "data", tmp_path / "run"
    proc = run_module("src.train", "model=ast", "data=fsdd", f"data.root={root}",
                      f"paths.data_dir={data}", f"hydra.run.dir={run}")  # fmt: skip
    assert_one_error_line(proc, "9_george_0.wav", "not a readable audio file")


def test_a_model_made_for_other_data_is_one_error_line(fsdd, tmp_path):
    # ImageGPT's model.codes turns the recordings into speech tokens, which it cannot read
    data, run = tmp_path / "data", tmp_path / "run"
    proc = run_module("src.train", "model=imagegpt", "data=fsdd", f"data.root={fsdd}",
                      f"paths.data_dir={data}", f"hydra.run.dir={run}")  # fmt: skip
    assert_one_error_line(proc, "ImageGPT does not train on AudioDataModule's data",
                          "block_size")  # fmt: skip


def test_a_teacher_trained_on_differently_prepared_data_is_one_error_line(fsdd, tmp_path):
    common = [f"data.root={fsdd}", "trainer.max_steps=2", "logger=csv",
              f"paths.data_dir={tmp_path / 'data'}"]  # fmt: skip
    proc = run_module("src.train", "experiment=cnn_fsdd", "data.speaker_norm=none", *common,
                      f"hydra.run.dir={tmp_path / 'cnn'}")  # fmt: skip
    assert_ok(proc)
    teacher = tmp_path / "cnn" / "checkpoints" / "last.ckpt"
    proc = run_module("src.train", "experiment=ast_fsdd", f"model.teacher={teacher}", *common,
                      f"hydra.run.dir={tmp_path / 'ast'}")  # fmt: skip
    assert_one_error_line(proc, "was trained on data prepared otherwise",
                          "data.speaker_norm=none (here meanvar)")  # fmt: skip


# ---------------------------------------------------------------- models through the entry point


def test_ast_patches_overlap_and_tile_the_log_mels():
    emb = PatchEmbedding((64, 100), 1, patch=16, d_model=8, stride=12)  # conf/model/ast.yaml
    assert emb.grid == (5, 8) and emb.num_patches == 40


@pytest.mark.parametrize("recipe", [["model=ast", "data=fsdd"], ["experiment=ast_fsdd"],
                                    ["experiment=cnn_fsdd"]])  # fmt: skip
def test_ast_and_cnn_learn_spoken_digits_through_the_entry_point(fsdd, tmp_path, recipe):
    """The plain defaults (64 x 100 log-mels) and bench/audio.py's recipes (20 x 20)."""
    run, model = tmp_path / "run", "cnn" if "cnn" in recipe[0] else "ast"
    proc = run_module("src.train", *recipe, f"data.root={fsdd}", "trainer.max_steps=40",
                      "trainer.log_every_n_steps=5", "logger=csv",
                      "callbacks.progress_bar.refresh_rate=0",
                      f"paths.data_dir={tmp_path / 'data'}", f"hydra.run.dir={run}")  # fmt: skip
    assert_ok(proc)
    rows = list(csv.DictReader((run / "csv" / "metrics.csv").read_text().splitlines()))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert losses[-1] < losses[0]
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"test/acc", "test/f1", "test/acc_majority"} <= metrics.keys()
    assert (run / "confusion.png").stat().st_size > 10_000
    assert (run / "attention.png").exists() == (model == "ast")
    if "experiment=ast_fsdd" in recipe:
        ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
        assert ckpt["state_dict"]["net.pos"].shape[1] == 1 + 36  # 6 x 6 patches of 20 x 20
    if "experiment=cnn_fsdd" in recipe:  # data=fsdd_small's speaker_norm needs many takes
        from src.models.speech import Listener

        with pytest.raises(PipelineError, match="cannot judge single recordings"):
            Listener(str(run / "checkpoints" / "last.ckpt"))
