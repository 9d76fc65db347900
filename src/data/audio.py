"""Labelled audio for the audio spectrogram Transformer (Bishop, Deep Learning, sec. 12.4.3): a
recording becomes a log-mel spectrogram, an image of one channel over (mel band x time) that the
vision models read as they read pictures (src.nn.patch, src.models.image).

Files: every audio file (WAV, FLAC, OGG, read with soundfile) under `root`, recursively, or,
without `root`, the registered dataset `dataset` (FSDD), fetched once. The label and speaker come
from the file's name through `pattern`, a regex with the named groups `label` and optionally
`speaker` and `take` (FSDD's `{digit}_{speaker}_{take}.wav` is the preset `data=fsdd`), or, when
`pattern` (or its `label` group) is null, the label is the name of the file's folder (the Speech
Commands layout; folders named _like_this, its _background_noise_, are not classes). Or `hub`: a
Hugging Face dataset with an audio column (a Hub name, a saved dataset's folder, Parquet / JSON
Lines files; `audio_column`, `label_column`, optionally `speaker_column`), its recordings read a
chunk at a time from its Arrow files (src.data.hub_media); `split=official` keeps its splits.

Preparation (the DVC stage `prepare_audio`, or the first run; skipped while the settings
fingerprint in meta.json matches): each file mixed to mono, resampled to `sample_rate` (librosa,
soxr), turned into a log-mel spectrogram (librosa: `n_mels` bands between `f_min` and `f_max`,
windows of `win_length` samples every `hop_length`, in decibels below the recording's peak down to
`top_db`) of `duration` x sample_rate / hop_length frames, the recording cut or padded with
silence (`fit=pad`) or its spectrogram resampled to them (`fit=stretch`), or, with `fit=full`,
of its own frames up to those (src.data.mels). The files go `chunk` at a time to `num_proc`
processes, and each chunk's spectrograms are written as they come (memory set by chunk x
num_proc, not by the number of files) atomically into `processed_dir`:

    features.npy    float32 log-mels (N, n_mels, frames); fit=full: every recording's frames
                    one after another (sum of L_i, n_mels), with lengths.npy (N,) the L_i
    manifest.tsv    file, label, speaker, take of each row
    meta.json       settings, classes, spectrogram shape, files skipped

A bad file (unreadable, corrupt, empty) stops the stage with its name, leaving nothing behind,
or with `skip_bad=true` is skipped and counted.

Splits (at set-up, from the manifest, so that changing them does not recompute spectrograms):
`split=random` stratified by label (`splits`, seeded); `split=speaker` holds out
`test_speakers` (or, with `fold=K`, the K-th speaker in sorted order: leave-one-speaker-out),
never seen in training, and val is a stratified share of the other speakers' files;
`split=official` is FSDD's (takes 0-4 of every speaker are test) or, with Speech Commands'
testing_list.txt and validation_list.txt in `root`, theirs. Batches are (x, y), y the label
or, with `target=speaker`, the speaker (a voice classifier, split at random or officially), x
(B, 1, n_mels, frames) read from disk a recording at a time and normalised with the mean and std
of the train split's spectrograms (with `speaker_norm`, each speaker's bands first brought to
mean 0, and std 1, over their recordings; both computed in one pass, band_statistics);
training spectrograms get SpecAugment's masks: one band of up to `freq_mask` mel bands and one of
up to `time_mask` frames set to the mean. With `fit=full` the batches are (x, y, lengths): x
padded with the mean to the batch's longest recording, and recordings of like lengths batched
together (LengthGroupedSampler; evaluation in order of length), so little of a batch is padding;
the models mask it (src.models.image).

With `codes=K` (set by model=tts) the recordings are speech tokens instead (src.data.speech):
their frames, `stack` at a time, quantised by a k-means codebook fitted on the train split's
frames (cached per split as `codebook{K}-s{stack}-<split key>.npy`), each recording's codes laid
out after its word and a prompt by the same speaker, batched as (x, y) next-token pairs.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset

from src.data import vq
from src.data.arrays import NpyWriter, Rows, Spans
from src.data.hub_media import blobs, media_labels, open_media
from src.data.images import stratified_split
from src.data.mels import load_audio, mel_chunk, mel_shape, mel_to_audio
from src.data.parallel import Progress, in_order
from src.data.sources import data_root
from src.data.spectrograms import Spectrograms, band_statistics, collate_lengths
from src.data.speech import (
    CODE_OFFSET,
    SpeechPrompts,
    collate_sequences,
    frame_vectors,
    spoken_word,
    vector_frames,
)
from src.data.text import SPLITS, LengthGroupedSampler, SplitLoaders
from src.utils.errors import PipelineError
from src.utils.files import atomic_dir

log = logging.getLogger(__name__)

FORMAT = 2  # bump when the processed layout changes
AUDIO_SUFFIXES = {".wav", ".flac", ".ogg"}
MEL_KEYS = ("sample_rate", "duration", "fit", "n_mels", "n_fft", "win_length", "hop_length",
            "f_min", "f_max", "top_db", "cmn", "trim_db")  # fmt: skip


# --------------------------------------------------------------------------- the mel stage


def codes_to_frames(codes: np.ndarray, codebook: np.ndarray, n_mels: int) -> np.ndarray:
    """Speech codes (B, T') -> log-mels (B, n_mels, T): each code's centroid, as its frames."""
    return vector_frames(torch.from_numpy(codebook)[torch.from_numpy(codes)], n_mels).numpy()


def codes_to_audio(codes: np.ndarray, codebook: np.ndarray, s: dict) -> list[np.ndarray]:
    """Speech codes (B, T') -> B recordings: each code's centroid frames, then mel_to_audio."""
    return [mel_to_audio(m, s) for m in codes_to_frames(codes, codebook, s["n_mels"])]


def label_of(path: Path, root: Path, pattern: re.Pattern | None) -> tuple[str, str, int]:
    """(label, speaker, take) of a file: from its name through `pattern`; the label, without a
    `label` group in it, is the name of the file's folder."""
    groups = {}
    if pattern is not None:
        m = pattern.fullmatch(path.name)
        if m is None:
            raise PipelineError(f"{path}: its name does not match data.pattern={pattern.pattern!r}")
        groups = m.groupdict()
    if not groups.get("label") and path.parent == root:
        raise PipelineError(f"{path}: not in a class folder (root/<label>/<file>); or set "
                            "data.pattern to read the label from file names")  # fmt: skip
    take = groups.get("take")
    return (groups.get("label") or path.parent.name, groups.get("speaker") or "",
            int(take) if take else -1)  # fmt: skip


def listed_audio(root: Path) -> list[Path]:
    """The audio files under root, sorted, but those in folders named _like_this (Speech
    Commands' _background_noise_: long recordings of noise, not a class)."""
    return sorted(
        f for f in root.rglob("*")
        if f.suffix.lower() in AUDIO_SUFFIXES
        and not any(p.startswith("_") for p in f.relative_to(root).parts[:-1])
    )  # fmt: skip


# --------------------------------------------------------------------------- the data module


class AudioDataModule(SplitLoaders, pl.LightningDataModule):
    """Labelled recordings as log-mel spectrograms (see the module docstring)."""

    origin = "lower"  # plots draw the lowest mel band at the bottom, as spectrograms are drawn

    def __init__(
        self,
        processed_dir: str,
        root: str | None = None,
        dataset: str | None = "fsdd",
        name: str | None = None,
        raw_dir: str = "data/raw",
        mirror: str | None = None,
        pattern: str | None = None,
        hub: str | None = None,
        hub_config: str | None = None,
        audio_column: str = "audio",
        label_column: str = "label",
        speaker_column: str | None = None,
        sample_rate: int = 8000,
        duration: float = 1.0,
        fit: str = "pad",
        n_mels: int = 64,
        n_fft: int = 512,
        win_length: int = 200,
        hop_length: int = 80,
        f_min: float = 0.0,
        f_max: float | None = None,
        top_db: float = 80.0,
        cmn: bool = False,
        trim_db: float | None = None,
        skip_bad: bool = False,
        num_proc: int | None = None,
        chunk: int = 256,
        target: str = "label",
        split: str = "random",
        test_speakers: list[str] | None = None,
        fold: int | None = None,
        splits: tuple[float, float, float] = (0.8, 0.1, 0.1),
        split_seed: int = 0,
        freq_mask: int = 0,
        time_mask: int = 0,
        freq_warp: float = 0.0,
        time_warp: float = 0.0,
        noise_db: list[float] | None = None,
        speaker_norm: str = "none",
        codes: int | None = None,
        stack: int = 2,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__()
        if fit not in ("pad", "stretch", "full"):
            raise PipelineError(f"data.fit={fit!r}: choose pad, stretch or full")
        if fit == "full" and codes:
            raise PipelineError("data.codes (speech tokens) needs recordings of one length: "
                                "data.fit=pad or stretch")  # fmt: skip
        if split not in ("random", "speaker", "official"):
            raise PipelineError(f"data.split={split!r}: choose random, speaker or official")
        if target not in ("label", "speaker"):
            raise PipelineError(f"data.target={target!r}: choose label or speaker")
        if target == "speaker" and (split == "speaker" or codes):
            raise PipelineError(
                "data.target=speaker classifies voices: it needs the speakers "
                "in training (data.split=random or official), no data.codes"
            )
        if speaker_norm not in ("none", "mean", "meanvar"):
            raise PipelineError(f"data.speaker_norm={speaker_norm!r}: choose none, mean or meanvar")
        if speaker_norm != "none" and (codes or target == "speaker"):
            raise PipelineError("data.speaker_norm removes the voice: it is for word classifiers, "
                                "not data.target=speaker or data.codes")  # fmt: skip
        if split == "speaker" and not test_speakers and fold is None:
            raise PipelineError("data.split=speaker needs data.test_speakers=[...] or data.fold=K")
        if root is None and dataset is None and hub is None:
            raise PipelineError("no audio: set data.root=<folder of audio files> or data.hub")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as e:
                raise PipelineError(f"data.pattern={pattern!r}: not a regex ({e})") from None
        if chunk < 1:
            raise PipelineError(f"data.chunk={chunk}: choose at least 1 file per job")
        if noise_db is not None:
            if len(noise_db) != 2 or not 0 < noise_db[0] <= noise_db[1]:
                raise PipelineError(f"data.noise_db={list(noise_db)}: [lo, hi], 0 < lo <= hi "
                                    "(dB below the recording's peak)")  # fmt: skip
            if cmn:
                raise PipelineError("data.noise_db adds noise to log-mels in dB below the "
                                    "peak; data.cmn removes their band means")  # fmt: skip
        if abs(sum(splits) - 1) > 1e-6 or min(splits) <= 0:
            raise PipelineError(f"data.splits={list(splits)} must be positive and sum to 1")
        self.save_hyperparameters(logger=False)
        self.processed_dir = Path(processed_dir)
        self.splits: dict[str, Dataset] = {}

    # -- preparation
    def mel_settings(self) -> dict:
        """What log_mel needs to make this data's spectrograms from any recording."""
        return {k: self.hparams[k] for k in MEL_KEYS}

    def _settings(self) -> dict:
        hp = self.hparams
        root = str(Path(hp.root).expanduser().resolve()) if hp.root else None
        hub = None
        if hp.hub:
            local = Path(hp.hub).expanduser()
            hub = [str(local.resolve()) if local.exists() else hp.hub, hp.hub_config,
                   hp.audio_column, hp.label_column, hp.speaker_column]  # fmt: skip
        return {"format": FORMAT, "root": root, "dataset": hp.dataset, "hub": hub,
                "pattern": hp.pattern, "skip_bad": hp.skip_bad, **self.mel_settings()}  # fmt: skip

    @functools.cached_property
    def hub_parts(self) -> dict:
        """data.hub's splits, their audio column left encoded."""
        hp = self.hparams
        return open_media(hp.hub, hp.hub_config, hp.audio_column, "audio")

    def _listing(self) -> tuple[Path | None, list[tuple]]:
        """Where the files are (None: in data.hub) and (file, label, speaker, take) of each
        recording; a dataset's rows are named <split>/<row>."""
        hp = self.hparams
        if hp.hub:
            parts = self.hub_parts
            labels, classes = media_labels(parts, hp.label_column)
            listed = []
            for split, table in parts.items():
                speakers = [""] * len(table)
                if hp.speaker_column:
                    ids, names = media_labels({split: table}, hp.speaker_column)
                    speakers = [names[i] for i in ids[split]]
                listed += [(f"{split}/{i}", classes[k], speakers[i], -1)
                           for i, k in enumerate(labels[split])]  # fmt: skip
            return None, listed
        root = data_root(hp.root, hp.dataset, hp.raw_dir, hp.mirror)
        files = listed_audio(root)
        if not files:
            raise PipelineError(f"{root}: no audio files ({', '.join(sorted(AUDIO_SUFFIXES))})")
        pattern = re.compile(hp.pattern) if hp.pattern else None
        # a misnamed file stops the stage before any spectrogram
        return root, [(str(f.relative_to(root)), *label_of(f, root, pattern)) for f in files]

    def _items(self, root: Path | None, files: list[str]) -> list:
        """What load_audio reads for manifest files: paths under root, or data.hub's encoded
        recordings (<split>/<row>), read from its Arrow files."""
        if root is not None:
            return files
        items = []
        for split, group in itertools.groupby(files, key=lambda f: f.split("/")[0]):
            rows = [int(f.split("/")[1]) for f in group]
            items += blobs(self.hub_parts[split], self.hparams.audio_column, rows)
        return items

    def prepare_data(self) -> None:
        settings = self._settings()
        meta_file = self.processed_dir / "meta.json"
        if not meta_file.exists() or json.loads(meta_file.read_text()).get("settings") != settings:
            self._prepare(settings)

    def _prepare(self, s: dict) -> None:
        """The log-mels of `chunk` files at a time, made by num_proc processes and written as
        they come: memory is set by chunk and num_proc, not by the number of files."""
        hp = self.hparams
        root, listed = self._listing()  # (file, label, speaker, take) of each recording
        files = [r[0] for r in listed]
        num_proc = hp.num_proc or os.cpu_count() or 1
        if len(files) < 2 * hp.chunk:
            num_proc = 1  # too few files to pay for starting processes
        jobs = ((root and str(root), self._items(root, files[i : i + hp.chunk]), s, hp.skip_bad)
                for i in range(0, len(files), hp.chunk))  # fmt: skip
        shape = mel_shape(s)  # (n_mels, frames): every recording's, or with fit=full the most
        full = s["fit"] == "full"
        rows, bad, lengths = [], [], []  # the good files' manifest rows and frames; bad: errors
        with atomic_dir(self.processed_dir) as tmp:
            # fixed length: (N, n_mels, frames); full: each recording's frames after the last's,
            # (sum of L_i, n_mels), with lengths.npy
            out = NpyWriter(tmp / "features.npy", np.float32, (None, shape[0]) if full
                            else (None, *shape))  # fmt: skip
            progress = Progress(len(files), "log-mel spectrograms", "files", 1)
            results = in_order(mel_chunk, jobs, num_proc, preload="src.data.mels")
            with out:
                try:
                    for k, (mels, skipped) in enumerate(results):
                        if mels:
                            out.write(np.concatenate([m.T for m in mels]) if full
                                      else np.stack(mels))  # fmt: skip
                            lengths += [m.shape[1] for m in mels]
                        gone = {i for i, _ in skipped}
                        start = k * hp.chunk
                        part = listed[start : start + len(mels) + len(skipped)]
                        rows += [r for i, r in enumerate(part) if i not in gone]
                        bad += [e for _, e in skipped]
                        progress.update(len(part))
                finally:
                    progress.close()
            if bad:
                log.warning("skipped %d bad audio files (data.skip_bad=true), the first: %s",
                            len(bad), bad[0])  # fmt: skip
                if not rows:
                    raise PipelineError(f"{root or hp.hub}: no readable audio files")
            if full:
                np.save(tmp / "lengths.npy", np.array(lengths, np.int64))
            for name in ("testing_list.txt", "validation_list.txt"):  # Speech Commands' splits
                if root is not None and (root / name).exists():
                    shutil.copy(root / name, tmp / name)
            if root is None and "test" in self.hub_parts:  # the dataset's own, as those lists
                for name, split in (("testing_list.txt", "test"), ("validation_list.txt", "val")):
                    listed_rows = [r[0] for r in rows if r[0].startswith(f"{split}/")]
                    (tmp / name).write_text("".join(f"{f}\n" for f in listed_rows))
            lines = ["file\tlabel\tspeaker\ttake", *("\t".join(map(str, r)) for r in rows)]
            (tmp / "manifest.tsv").write_text("\n".join(lines) + "\n")
            meta = {"settings": s, "classes": sorted({r[1] for r in rows}),
                    "image_size": list(shape), "files": len(rows), "skipped": len(bad)}  # fmt: skip
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        log.info("prepared %d recordings (%d skipped) as %dx%d log-mels with %d process(es) -> %s",
                 len(rows), len(bad), *shape, num_proc, self.processed_dir)  # fmt: skip

    @property
    def meta(self) -> dict:
        return json.loads((self.processed_dir / "meta.json").read_text())

    @property
    def classes(self) -> list[str]:
        """The names of the targets: labels, or speakers with data.target=speaker."""
        if self.hparams.target == "speaker":
            speakers = sorted({r[2] for r in self._rows()})
            if speakers == [""]:
                raise PipelineError("data.target=speaker: no speakers in the file names "
                                    "(data.pattern needs a (?P<speaker>...) group)")  # fmt: skip
            return speakers
        return self.meta["classes"]

    def _rows(self) -> list[tuple[str, ...]]:
        """The manifest's rows: (file, label, speaker, take)."""
        lines = (self.processed_dir / "manifest.tsv").read_text().splitlines()[1:]
        return [tuple(line.split("\t")) for line in lines]

    def manifest(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(target index, speaker, take) of every row of the features."""
        rows = self._rows()
        index = {c: i for i, c in enumerate(self.classes)}
        column = 2 if self.hparams.target == "speaker" else 1
        return (np.array([index[r[column]] for r in rows]), np.array([r[2] for r in rows]),
                np.array([int(r[3]) for r in rows]))  # fmt: skip

    def split_rows(self) -> dict[str, np.ndarray]:
        """The rows of each split, by data.split."""
        hp = self.hparams
        y, speakers, takes = self.manifest()
        if hp.split == "random":
            return dict(zip(SPLITS, stratified_split(y, hp.splits, hp.split_seed), strict=True))
        if hp.split == "speaker":
            known = sorted(set(speakers))
            if hp.fold is not None:
                if not 0 <= hp.fold < len(known):
                    raise PipelineError(f"data.fold={hp.fold}: choose 0-{len(known) - 1} "
                                        f"({', '.join(known)})")  # fmt: skip
                held_out = [known[hp.fold]]
            else:
                held_out = list(hp.test_speakers)
            if unknown := sorted(set(held_out) - set(known)):
                raise PipelineError(f"data.test_speakers: no recordings of {', '.join(unknown)}"
                                    f" (speakers: {', '.join(known)})")  # fmt: skip
            test = np.isin(speakers, held_out)
        else:  # official: Speech Commands' lists of files, or FSDD's takes
            listed = {n: self.processed_dir / f"{n}_list.txt" for n in ("testing", "validation")}
            if listed["testing"].exists():
                files = np.array([r[0] for r in self._rows()])
                test, val = (np.isin(files, p.read_text().split()) for p in listed.values())
                return {"train": np.flatnonzero(~test & ~val), "val": np.flatnonzero(val),
                        "test": np.flatnonzero(test)}  # fmt: skip
            if (takes < 0).all():
                raise PipelineError(
                    "data.split=official needs the take in data.pattern, or "
                    "testing_list.txt and validation_list.txt in data.root"
                )
            test = takes < 5
        rest = np.flatnonzero(~test)
        share = hp.splits[1] / (hp.splits[0] + hp.splits[1])
        fit, val = stratified_split(y[rest], (1 - share, share), hp.split_seed)
        return {"train": rest[fit], "val": rest[val], "test": np.flatnonzero(test)}

    @property
    def model_kwargs(self) -> dict:
        image_size, classes = self.meta["image_size"], self.classes
        if self.hparams.codes:  # the longest sequence: a 5-letter word, prompt and target
            steps = image_size[1] // self.hparams.stack
            return {"vocab_size": CODE_OFFSET + self.hparams.codes, "block_size": 2 * steps + 8}
        return {"image_size": image_size, "channels": 1, "num_classes": len(classes)}

    def trivial_targets(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The labels of the train split and of `split` (for the majority-class baseline)."""
        y, rows = torch.from_numpy(self.manifest()[0]), self.split_rows()
        return y[rows["train"]], y[rows[split]]

    # -- speech tokens (data.codes=K, set by model=tts)
    def _codebook_file(self) -> Path:
        hp = self.hparams
        split = {k: hp[k] for k in ("split", "test_speakers", "fold", "splits", "split_seed")}
        key = hashlib.sha1(json.dumps(split, sort_keys=True, default=list).encode()).hexdigest()[:8]
        return self.processed_dir / f"codebook{hp.codes}-s{hp.stack}-{key}.npy"

    def codebook(self, train_vectors: np.ndarray | None = None) -> np.ndarray:
        """(K, n_mels stack) centroids of the training split's frame vectors, fitted once per
        split and cached beside the features."""
        path = self._codebook_file()
        if not path.exists():
            flat = train_vectors.reshape(-1, train_vectors.shape[-1])
            book = vq.fit_codebook(flat, self.hparams.codes, self.hparams.split_seed)
            np.save(path.with_suffix(".tmp.npy"), book)
            path.with_suffix(".tmp.npy").replace(path)  # whole or absent
        return np.load(path)

    def _setup_speech(self, x: np.ndarray, rows: dict[str, np.ndarray]) -> None:
        hp = self.hparams
        labels, speakers, _ = self.manifest()
        vectors = frame_vectors(x, hp.stack)  # (N, T / stack, n_mels stack)
        codes = vq.encode(vectors, self.codebook(vectors[rows["train"]]))  # (N, T / stack)
        words = [spoken_word(self.classes[i]) for i in labels]
        for split, r in rows.items():
            self.splits[split] = SpeechPrompts(codes[r], [words[i] for i in r], speakers[r],
                                               train=split == "train", seed=hp.seed)  # fmt: skip
        self.collate = collate_sequences

    def sampler(self, split: str) -> Iterable[int] | None:
        """With fit=full, batches of like lengths, so that padding to a batch's longest wastes
        little: training's shuffled in pools (LengthGroupedSampler), the others' sorted."""
        if self.hparams.fit != "full":
            return None
        lengths = self.splits[split].lengths
        if split == "train":  # under DDP, runs of like lengths as long as the global batch
            ranks = self.trainer.world_size if self.trainer is not None else 1
            return LengthGroupedSampler(lengths, self.hparams.batch_size * ranks, self.hparams.seed)
        return np.argsort(lengths, kind="stable").tolist()

    def state_dict(self) -> dict:
        """What a checkpoint needs to hear new recordings as this data did: the mel settings and
        the train split's mean and std with the class names (a classifier; see
        src.models.speech.Listener), or the codebook that turns codes back into audio."""
        if self.hparams.codes:
            return {**self.mel_settings(), "stack": self.hparams.stack,
                    "codebook": np.load(self._codebook_file()).tolist()}  # fmt: skip
        return {**self.mel_settings(), "mean": self.mean, "std": self.std, "classes": self.classes,
                "speaker_norm": self.hparams.speaker_norm}  # fmt: skip

    def recordings(self, split: str, n: int | None = None) -> list[np.ndarray]:
        """The samples of a split's (first n) recordings, as read for the spectrograms."""
        hp = self.hparams
        root = None if hp.hub else data_root(hp.root, hp.dataset, hp.raw_dir, hp.mirror)
        rows = self._rows()
        files = [rows[i][0] for i in self.split_rows()[split][:n]]
        items = [root / f for f in files] if root else self._items(None, files)
        return [load_audio(item, hp.sample_rate) for item in items]

    # -- loading
    def features(self) -> Rows | Spans:
        """The log-mels, read from disk a recording at a time: rows (n_mels, frames), or with
        fit=full spans of frames (L_i, n_mels)."""
        path = self.processed_dir / "features.npy"
        if self.hparams.fit == "full":
            lengths = np.load(self.processed_dir / "lengths.npy")
            return Spans(path, np.concatenate([[0], np.cumsum(lengths)]))
        return Rows(path)

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        y, speakers, _ = self.manifest()
        rows = self.split_rows()
        if hp.codes:
            self._setup_speech(np.load(self.processed_dir / "features.npy", mmap_mode="r"), rows)
            return
        if hp.speaker_norm != "none" and (speakers == "").any():
            raise PipelineError("data.speaker_norm needs the speaker of every file "
                                "(data.pattern with a (?P<speaker>...) group)")  # fmt: skip
        voices, voice = np.unique(speakers, return_inverse=True)
        if hp.speaker_norm == "none":
            voices, voice = voices[:1], np.zeros_like(voice)
        mels, train = self.features(), np.zeros(len(y), bool)
        train[rows["train"]] = True
        shift, scale, self.mean, self.std = band_statistics(mels, voice, train, len(voices),
                                                            hp.speaker_norm)  # fmt: skip
        for split in SPLITS:
            fit, r = split == "train", rows[split]
            self.splits[split] = Spectrograms(
                mels.subset(r), y[r], voice[r], shift, scale, seed=hp.seed,
                masks=(hp.freq_mask, hp.time_mask) if fit else (0, 0),
                warps=(hp.freq_warp, hp.time_warp) if fit else (0.0, 0.0),
                noise=tuple(hp.noise_db) if fit and hp.noise_db else None,
            )  # fmt: skip
        if hp.fit == "full":
            self.collate = collate_lengths
        log.info("audio splits (%s): %s", hp.split, {s: len(r) for s, r in rows.items()})
