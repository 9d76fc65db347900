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
from tests.conftest import MIRROR, ROOT, assert_ok, assert_one_error_line, run_module

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
    from src.data.spectrograms import rescale

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


def close(got, want) -> None:
    """Log-mels (dB) computed in a worker process against this one's: equal to float rounding."""
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)


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
    # a worker process's BLAS may sum in another order than this one's (its own thread count):
    # the same log-mels to float rounding, not always the same bytes
    one_dir, two_dir = tmp_path / "one", tmp_path / "two"
    assert (one_dir / "manifest.tsv").read_bytes() == (two_dir / "manifest.tsv").read_bytes()
    x = np.load(two_dir / "features.npy")  # (20, 64, 100)
    close(np.load(one_dir / "features.npy"), x)
    assert one.meta == two.meta and one.meta["image_size"] == [64, 100]
    mels = [log_mel(load_audio(root / r[0], 8000), SETTINGS) for r in two._rows()]
    close(x, mels)
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
    close(x, [log_mel(load_audio(f, 8000), SETTINGS) for f in good])
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
    assert dm.mean == pytest.approx(float(features[train_rows].mean()), rel=1e-5)
    assert dm.std == pytest.approx(float(features[train_rows].std()), rel=1e-4)
    x, _ = dm.splits["test"][0]  # test spectrograms use the train statistics
    expected = (features[dm.split_rows()["test"][0]] - dm.mean) / dm.std
    np.testing.assert_allclose(x[0].numpy(), expected, atol=1e-5)
    assert abs(float(features.mean()) - dm.mean) > 1e-3  # all rows would give another


@pytest.mark.parametrize("scale", [False, True])
def test_speaker_norm_centres_each_voice_per_mel_band_with_its_own_recordings(tmp_path, scale):
    from src.data.arrays import Rows, Spans
    from src.data.spectrograms import as_bands, band_statistics

    rng = np.random.default_rng(0)
    speakers = np.array(["ann", "bob", "ann", "bob", "bob"])
    voice = (speakers == "bob").astype(int)
    voices = {"ann": rng.normal(3, 2, (4, 1)), "bob": rng.normal(-1, 5, (4, 1))}  # per band
    x = (rng.normal(size=(5, 4, 6)) + np.stack([voices[s] for s in speakers])).astype(np.float32)
    np.save(tmp_path / "rows.npy", x)
    # the same recordings as spans of frames, of lengths 6 each
    np.save(tmp_path / "frames.npy", np.ascontiguousarray(np.concatenate(x.transpose(0, 2, 1))))
    train = np.array([True, True, False, True, False])
    kind = "meanvar" if scale else "mean"
    for mels in (Rows(tmp_path / "rows.npy"), Spans(tmp_path / "frames.npy", np.arange(6) * 6)):
        shift, spread, _, std = band_statistics(mels, voice, train, 2, kind)
        out = np.stack([(as_bands(mels, i) - shift[v][:, None]) / spread[v][:, None]
                        for i, v in enumerate(voice)])  # fmt: skip
        # the train split: mean 0 and std 1 over every value
        assert abs(out[train].mean()) < 1e-5 and out[train].std() == pytest.approx(1, abs=1e-4)
        for v in range(2):  # each voice's bands alike (shifted by the global mean)
            bands = out[voice == v].mean(axis=(0, 2))
            np.testing.assert_allclose(bands, bands[0], atol=1e-4)
            if scale:
                spread_v = out[voice == v].std(axis=(0, 2))
                np.testing.assert_allclose(spread_v, spread_v[0], rtol=1e-3)
        # a band's course over time in one recording (the word) is only shifted and scaled
        band_std = x[speakers == "ann"].std(axis=(0, 2))[:, None] if scale else 1.0
        np.testing.assert_allclose(np.diff(out[0], axis=1), np.diff(x[0], axis=1) / band_std / std,
                                   atol=1e-4)  # fmt: skip


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


def test_a_noise_floor_lifts_only_the_quiet_bins_of_training_spectrograms(fsdd, tmp_path):
    """Noise 20-30 dB below the peak added in power: bins near the peak keep their level, bins
    below the floor rise to it; val and test are untouched; not with cmn."""
    plain = module(fsdd, tmp_path / "a", pattern=FSDD)
    noisy = module(fsdd, tmp_path / "b", pattern=FSDD, noise_db=[20, 30])
    for i in range(10):
        a, b = plain.splits["train"][i][0], noisy.splits["train"][i][0]
        db_a, db_b = (x * plain.std + plain.mean for x in (a, b))  # back to dB below the peak
        assert (db_b >= db_a - 1e-3).all() and db_b.min() >= -30.01
        loud = db_a > -3
        assert torch.allclose(db_a[loud], db_b[loud], atol=0.1)
    assert torch.equal(plain.splits["val"][0][0], noisy.splits["val"][0][0])
    with pytest.raises(PipelineError, match="noise_db"):
        module(fsdd, tmp_path / "c", pattern=FSDD, noise_db=[20, 30], cmn=True)
    with pytest.raises(PipelineError, match="noise_db"):
        module(fsdd, tmp_path / "c", pattern=FSDD, noise_db=[30, 20])


def test_labels_come_from_class_folders_without_a_pattern(fsdd, tmp_path):
    root = tmp_path / "commands"
    for word, digit in (("yes", 1), ("no", 2)):
        (root / word).mkdir(parents=True)
        for take in range(5):
            shutil.copy(fsdd / f"{digit}_george_{take}.wav", root / word / f"{take}.wav")
    dm = module(root, tmp_path)
    assert dm.classes == ["no", "yes"] and dm.model_kwargs == {
        "image_size": [64, 100], "channels": 1, "num_classes": 2}  # fmt: skip


def test_the_speech_commands_layout_its_speakers_lists_and_noise_folder(fsdd, tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from src.utils.config import register_resolvers

    register_resolvers()
    root = tmp_path / "speech_commands"
    files = {}
    for word, digit in (("yes", 1), ("no", 2)):
        (root / word).mkdir(parents=True)
        for k, speaker in enumerate(("0a7c2a8d", "bd76a7fd", "c1d39ce8")):
            for take in range(2):
                name = f"{word}/{speaker}_nohash_{take}.wav"
                shutil.copy(fsdd / f"{digit}_george_{2 * k + take}.wav", root / name)
                files.setdefault(speaker, []).append(name)
    (root / "_background_noise_").mkdir()
    shutil.copy(fsdd / "0_theo_0.wav", root / "_background_noise_" / "white_noise.wav")
    (root / "testing_list.txt").write_text("\n".join(files["0a7c2a8d"]) + "\n")
    (root / "validation_list.txt").write_text("\n".join(files["bd76a7fd"]) + "\n")
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["data=speech_commands", f"data.root={root}",
                                          f"paths.data_dir={tmp_path / 'data'}"])  # fmt: skip
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup()
    assert dm.classes == ["no", "yes"] and dm.meta["files"] == 12  # no noise class
    _, speakers, _ = dm.manifest()
    rows = dm.split_rows()
    assert set(speakers[rows["test"]]) == {"0a7c2a8d"} and set(speakers[rows["val"]]) == {
        "bd76a7fd"} and set(speakers[rows["train"]]) == {"c1d39ce8"}  # fmt: skip
    assert dm.model_kwargs["image_size"] == [64, 100]  # a second at 16 kHz, 10 ms hops


# ---------------------------------------------------------------- recordings of any length


def clips_folder(root, n: int = 48, classes: int = 4):
    """Speech-like clips of 0.3 to 3 s at 8 kHz in class folders (the Speech Commands layout),
    the label in the vowels they say (bench/loaders.py's speech_like)."""
    import soundfile as sf

    from bench.loaders import speech_like

    rng = np.random.default_rng(0)
    for i in range(n):
        label, seconds = i % classes, float(rng.uniform(0.3, 3.0))
        (root / f"w{label}").mkdir(parents=True, exist_ok=True)
        sf.write(root / f"w{label}" / f"{i:03d}.wav", speech_like(seconds, label, i % 3, rng, 8000),
                 8000)  # fmt: skip
    return root


FULL = dict(fit="full", duration=2.2, batch_size=8)  # 220 frames at most: AST's patches tile them


def test_full_fit_keeps_each_recordings_own_frames_written_one_after_another(tmp_path):
    root = clips_folder(tmp_path / "clips")
    dm = AudioDataModule(processed_dir=str(tmp_path / "p"), root=str(root), num_proc=2, chunk=8,
                         **FULL)  # fmt: skip
    dm.prepare_data()
    dm.setup()
    lengths = np.load(tmp_path / "p" / "lengths.npy")
    frames = np.load(tmp_path / "p" / "features.npy")  # (sum of L_i, n_mels)
    assert frames.shape == (lengths.sum(), 64) and dm.meta["image_size"] == [64, 220]
    assert lengths.min() < 60 and lengths.max() == 220  # the shortest kept short, the longest cut
    first = sorted(root.rglob("*.wav"))[0]  # manifest order: the files sorted
    expected = log_mel(load_audio(first, 8000), dm.mel_settings())
    close(frames[: lengths[0]].T, expected)
    # one process writes the same files
    one = AudioDataModule(processed_dir=str(tmp_path / "p1"), root=str(root), num_proc=1, **FULL)
    one.prepare_data()
    for name in ("lengths.npy", "manifest.tsv"):
        assert (tmp_path / "p" / name).read_bytes() == (tmp_path / "p1" / name).read_bytes()
    close(np.load(tmp_path / "p" / "features.npy"), np.load(tmp_path / "p1" / "features.npy"))
    # a batch is padded to its longest, with the lengths; training batches have like lengths
    x, y, got = next(iter(dm.train_dataloader()))
    assert x.shape[:3] == (8, 1, 64) and x.shape[3] == int(got.max()) and y.shape == (8,)
    short = int(got.argmin())
    assert (x[short, 0, :, int(got[short]) :] == 0).all()  # the padding is the mean
    heard = np.concatenate([b[2].numpy() for b in dm.test_dataloader()])
    assert (np.diff(heard) >= 0).all()  # evaluation batches: sorted by length
    with pytest.raises(PipelineError, match="one length"):
        AudioDataModule(processed_dir=str(tmp_path), fit="full", codes=64)


def test_length_grouped_batches_cover_every_example_once_with_like_lengths():
    from src.data.text import LengthGroupedSampler

    lengths = np.random.default_rng(0).integers(10, 1000, 1000)
    sampler = LengthGroupedSampler(lengths, batch_size=16, seed=3)
    first, second = list(sampler), list(sampler)
    assert sorted(first) == list(range(1000)) and first != second  # a new order every epoch
    assert first == list(LengthGroupedSampler(lengths, 16, seed=3))  # the same on every rank
    spread = np.mean([np.ptp(lengths[first[i : i + 16]]) for i in range(0, 1000, 16)])
    shuffled = np.random.default_rng(1).permutation(1000)
    assert spread < 0.1 * np.mean(
        [np.ptp(lengths[shuffled[i : i + 16]]) for i in range(0, 1000, 16)]
    )


def test_under_ddp_each_rank_reads_its_own_share_in_batches_of_like_lengths():
    """Lightning wraps the sampler in a DistributedSamplerWrapper (shuffle off: the loader set
    none); rank r reads every W-th index of the same order, its runs as long as the global
    batch."""
    from lightning_fabric.utilities.distributed import DistributedSamplerWrapper

    from src.data.text import LengthGroupedSampler

    lengths = np.random.default_rng(0).integers(10, 1000, 1000)
    shares = [list(DistributedSamplerWrapper(LengthGroupedSampler(lengths, 2 * 16, seed=3),
                                             num_replicas=2, rank=r, shuffle=False))
              for r in range(2)]  # fmt: skip
    assert sorted(shares[0] + shares[1]) == list(range(1000))
    spread = np.mean([np.ptp(lengths[shares[0][i : i + 16]]) for i in range(0, 500, 16)])
    assert spread < 0.1 * np.ptp(lengths)


@pytest.mark.parametrize("arch", ["vit", "cnn"])
def test_a_recording_is_heard_alike_alone_and_padded_in_a_batch(arch):
    from src.models.image import build_net

    torch.manual_seed(0)
    net = {"arch": "cnn"} if arch == "cnn" else {"n_layer": 2, "n_head": 2, "d_model": 32,
                                                  "patch_size": 16, "patch_stride": 12}  # fmt: skip
    model = build_net(net, image_size=(64, 220), channels=1, num_classes=4).eval()
    x = torch.randn(1, 1, 64, 96)  # 96 frames, in a batch whose longest has 200
    batch = torch.cat([torch.nn.functional.pad(x, (0, 104)), torch.randn(1, 1, 64, 200)])
    alone = model(x, torch.tensor([96]))
    padded = model(batch, torch.tensor([96, 200]))[:1]
    unmasked = model(batch)[:1]  # the padding heard
    if arch == "vit":  # exactly: the padding's patches are masked out of attention
        torch.testing.assert_close(alone, padded, atol=1e-5, rtol=1e-4)
        assert not torch.allclose(unmasked, alone, atol=1e-3)
    else:  # the average leaves the padding out; convolutions still see its edge
        assert (padded - alone).abs().max() < 0.5 * (unmasked - alone).abs().max()


@pytest.mark.parametrize("model", ["ast", "cnn"])
def test_recordings_of_any_length_train_through_the_entry_point(tmp_path, model):
    root, run = clips_folder(tmp_path / "clips"), tmp_path / "run"
    proc = run_module("src.train", f"model={model}", "data=audio", f"data.root={root}",
                      "data.fit=full", "data.duration=2.2", "data.batch_size=8",
                      "trainer.max_steps=12", "trainer.log_every_n_steps=2", "logger=csv",
                      "callbacks.progress_bar.refresh_rate=0", f"paths.data_dir={tmp_path / 'd'}",
                      f"hydra.run.dir={run}")  # fmt: skip
    assert_ok(proc)
    metrics = json.loads((run / "metrics.json").read_text())
    assert "test/acc" in metrics and (run / "confusion.png").exists()
    assert (run / "attention.png").exists() == (model == "ast")


# ---------------------------------------------------------------- bad audio


def as_audio_dataset(root, files: list[str], speakers: bool = True):
    """Files under root as rows of a Hugging Face dataset: encoded audio, the label as a string
    (its folder) and the speaker, as Hub audio datasets hold them."""
    import datasets

    table = datasets.Dataset.from_dict({
        "audio": [{"bytes": (root / f).read_bytes(), "path": f} for f in files],
        "word": [f.split("/")[0] for f in files],
        **({"who": [f"s{i % 3}" for i in range(len(files))]} if speakers else {}),
    })  # fmt: skip
    return table.cast_column("audio", datasets.Audio(decode=False))


def test_a_datasets_audio_column_is_prepared_as_the_same_files_in_a_folder_are(tmp_path):
    root = clips_folder(tmp_path / "clips", n=24)
    files = [str(f.relative_to(root)) for f in sorted(root.rglob("*.wav"))]  # listed_audio's order
    as_audio_dataset(root, files).save_to_disk(str(tmp_path / "saved"))
    kw = dict(num_proc=2, chunk=5, **FULL)
    folder = AudioDataModule(processed_dir=str(tmp_path / "a"), root=str(root), **kw)
    hub = AudioDataModule(processed_dir=str(tmp_path / "b"), hub=str(tmp_path / "saved"),
                          label_column="word", speaker_column="who", **kw)  # fmt: skip
    for dm in (folder, hub):
        dm.prepare_data()
    for name in ("features.npy", "lengths.npy"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert hub.classes == folder.classes == ["w0", "w1", "w2", "w3"]
    rows = hub._rows()
    assert rows[0] == ("train/0", "w0", "s0", "-1") and rows[4][2] == "s1"
    assert np.allclose(hub.recordings("train", 2)[1], folder.recordings("train", 2)[1])


def test_a_datasets_own_test_and_validation_splits_are_the_official_split(tmp_path):
    import datasets

    root = clips_folder(tmp_path / "clips", n=24)
    files = [str(f.relative_to(root)) for f in sorted(root.rglob("*.wav"))]
    parts = {"train": files[::2], "validation": files[1::4], "test": files[3::4]}
    datasets.DatasetDict({s: as_audio_dataset(root, f, speakers=False) for s, f in parts.items()}
                         ).save_to_disk(str(tmp_path / "saved"))  # fmt: skip
    dm = AudioDataModule(processed_dir=str(tmp_path / "p"), hub=str(tmp_path / "saved"),
                         label_column="word", split="official", **FULL)  # fmt: skip
    dm.prepare_data()
    dm.setup()
    assert {s: len(r) for s, r in dm.split_rows().items()} == {"train": 12, "val": 6, "test": 6}
    x, y, lengths = next(iter(dm.test_dataloader()))
    assert x.shape[:3] == (6, 1, 64) and len(y) == len(lengths) == 6
    with pytest.raises(PipelineError, match=r"no column 'sound'.*data\.audio_column"):
        AudioDataModule(processed_dir=str(tmp_path / "q"), hub=str(tmp_path / "saved"),
                        audio_column="sound", **FULL).prepare_data()  # fmt: skip


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


def test_the_bench_scores_each_held_out_speaker_and_trains_on_fewer_voices(fsdd, tmp_path):
    """bench/audio.py's voices curve: k neighbouring speakers in training, the rest tested, each
    held-out speaker's accuracy from the run's best checkpoint (their mean, weighted by their
    recordings, is the run's test accuracy)."""
    from bench.audio import SPEAKERS, run_name, speaker_accuracies, voices_splits

    splits = voices_splits(2)
    assert len(splits) == 5 and splits[0][1] == "data.test_speakers=[nicolas,theo,yweweler]"
    assert run_name(splits[0]) == "speaker-nicolas+theo+yweweler"  # a folder Hydra accepts
    assert splits[4][1] == "data.test_speakers=[jackson,nicolas,theo]"  # yweweler and george
    held_out = ["data.split=speaker", "data.test_speakers=[jackson,theo]"]  # tests/data: 3 voices
    run = tmp_path / run_name(held_out)
    proc = run_module("src.train", "experiment=cnn_fsdd", *held_out, f"data.root={fsdd}",
                      "trainer.max_steps=20", "logger=csv", "callbacks.progress_bar.refresh_rate=0",
                      f"paths.data_dir={tmp_path / 'data'}", f"hydra.run.dir={run}")  # fmt: skip
    assert_ok(proc)
    acc = speaker_accuracies(run)
    assert list(acc) == ["jackson", "theo"] and set(acc) < set(SPEAKERS)
    metrics = json.loads((run / "metrics.json").read_text())
    assert abs(np.mean(list(acc.values())) - metrics["test/acc"]) < 1e-4  # equal takes each


def test_the_bench_repeats_every_run_by_seed_two_at_a_time(fsdd, tmp_path):
    """--seeds: every run once a seed, the AST taught by the CNN of its own seed; --jobs 2 trains
    two at a time. The figures are the seeds' mean, each seed's beside it."""
    from omegaconf import OmegaConf

    out = tmp_path / "bench"
    proc = run_module("bench.audio", "--models", "cnn", "ast", "--splits", "random", "--seeds",
                      "1", "2", "--jobs", "2", "--cnn-steps", "3", "--ast-steps", "3", "--out",
                      str(out), f"data.root={fsdd}")  # fmt: skip
    assert_ok(proc)
    result = json.loads(proc.stdout.strip().splitlines()[-1])["models"]
    for model in ("cnn", "ast"):
        entry = result[model]["random"]
        assert len(entry["runs"]) == 2 and set(entry["seeds"]) == {"1", "2"}
        assert entry["acc"] == pytest.approx(np.mean([r["acc"] for r in entry["runs"]]))
    for seed in (1, 2):
        cfg = OmegaConf.load(out / "ast" / f"random-seed{seed}" / "config.yaml")
        assert cfg.seed == seed and f"/cnn/random-seed{seed}/" in cfg.model.teacher
