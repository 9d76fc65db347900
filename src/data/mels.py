"""Recordings <-> log-mel spectrograms (Bishop 12.4.3), for the audio data module
(src/data/audio.py), its preparation workers (mel_chunk, a chunk of files at a time) and the models
that hear or speak new recordings (src.models.speech, src.sample). Kept free of torch, so that a
worker starts in a fraction of a second and holds only its chunk."""

from __future__ import annotations

import io
from pathlib import Path

import librosa  # its submodules load on first use
import numpy as np
import soundfile as sf

from src.data.hub_media import blob_name
from src.utils.errors import PipelineError


def load_audio(item: Path | dict, sample_rate: int) -> np.ndarray:
    """A file's samples, or an encoded recording's of a dataset ({"bytes", "path"}), mono, at
    sample_rate: float32 (S,)."""
    source = item
    if isinstance(item, dict):
        source = io.BytesIO(item["bytes"]) if item.get("bytes") else item["path"]
    try:
        y, sr = sf.read(source, dtype="float32", always_2d=True)  # (S, channels)
    except (sf.LibsndfileError, RuntimeError, OSError) as e:
        raise PipelineError(f"{blob_name(item)}: not a readable audio file ({e})") from None
    if len(y) == 0:
        raise PipelineError(f"{blob_name(item)}: an empty audio file (no samples)")
    y = y.mean(axis=1)
    return librosa.resample(y, orig_sr=sr, target_sr=sample_rate) if sr != sample_rate else y


def mel_shape(s: dict) -> tuple[int, int]:
    """(n_mels, frames) of every log_mel with settings s, whatever the recording's length (with
    fit="full", the most frames)."""
    return s["n_mels"], round(s["duration"] * s["sample_rate"]) // s["hop_length"]


def log_mel(y: np.ndarray, s: dict) -> np.ndarray:
    """Samples at s["sample_rate"] -> log-mel spectrogram (n_mels, frames) in dB below the
    recording's loudest bin, floored at -s["top_db"], frames = duration x sample_rate / hop_length.
    fit="pad": longer recordings are cut, shorter padded with silence; fit="stretch": the whole
    recording's spectrogram is resampled to the frames (an isolated word then fills the window
    whatever the speaking rate); fit="full": longer recordings are cut, shorter ones keep their
    own frames (batched by length and padded per batch, with a mask)."""
    frames = mel_shape(s)[1]
    if s.get("trim_db"):  # the recording's quiet ends cut: a word starts and ends alike for all
        y = librosa.effects.trim(y, top_db=s["trim_db"], frame_length=s["win_length"],
                                 hop_length=s["hop_length"])[0]  # fmt: skip
    if s["fit"] != "stretch":
        samples = frames * s["hop_length"]
        y = y[:samples]
        if s["fit"] == "pad":
            y = np.pad(y, (0, samples - len(y)))
    mel = librosa.feature.melspectrogram(
        y=y, sr=s["sample_rate"], n_fft=s["n_fft"], win_length=s["win_length"],
        hop_length=s["hop_length"], n_mels=s["n_mels"], fmin=s["f_min"], fmax=s["f_max"],
    )  # fmt: skip
    # relative to the peak: the recording's gain (microphone, distance) does not change the image
    db = librosa.power_to_db(mel, ref=np.max, amin=1e-10, top_db=s["top_db"])
    if s["fit"] == "stretch":
        t = np.linspace(0, db.shape[1] - 1, frames)
        db = np.stack([np.interp(t, np.arange(db.shape[1]), band) for band in db])
    db = db[:, :frames]
    if s.get("cmn"):
        db = db - db.mean(axis=1, keepdims=True)
    return db.astype(np.float32)


def mel_chunk(
    job: tuple[str | None, list, dict, bool],
) -> tuple[list[np.ndarray], list[tuple[int, str]]]:
    """A preparation worker's job (root, files relative to it or a dataset's encoded
    recordings, mel settings, skip_bad) -> the float32 log-mels (n_mels, frames) of its good
    files, in order, and (index in the job, error) of each bad one. A bad file without skip_bad
    raises its PipelineError, named."""
    root, files, s, skip_bad = job
    mels, bad = [], []
    for i, f in enumerate(files):
        try:
            item = f if isinstance(f, dict) else Path(root) / f
            mels.append(log_mel(load_audio(item, s["sample_rate"]), s))
        except PipelineError as e:
            if not skip_bad:
                raise
            bad.append((i, str(e)))
    return mels, bad


def mel_to_audio(db: np.ndarray, s: dict, n_iter: int = 32) -> np.ndarray:
    """A log-mel spectrogram (n_mels, frames) in dB below its peak, as log_mel makes it without
    `cmn`, back to samples at s["sample_rate"]: the mel filter bank inverted (librosa's
    non-negative least squares) and the phase estimated by Griffin-Lim, peak-normalised to 0.9.
    The way back from generated speech tokens (their centroids' frames) to a WAV."""
    power = librosa.db_to_power(db)  # the recording's peak at 1
    stft = librosa.feature.inverse.mel_to_stft(
        power, sr=s["sample_rate"], n_fft=s["n_fft"], fmin=s["f_min"], fmax=s["f_max"]
    )  # fmt: skip
    # Griffin-Lim's first phase is random: seeded, the same tokens always give the same WAV
    y = librosa.griffinlim(stft, n_iter=n_iter, hop_length=s["hop_length"],
                           win_length=s["win_length"], n_fft=s["n_fft"],
                           random_state=0)  # fmt: skip
    return (0.9 * y / max(float(np.abs(y).max()), 1e-8)).astype(np.float32)
