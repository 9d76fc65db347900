"""Text-to-speech in Vall-E's manner, small (Bishop, Deep Learning, sec. 12.4.4): GPT over
speech tokens. The audio data module with data.codes=K (src.data.speech) turns each recording
into codes of its log-mel frames and lays out [word letters] [a prompt by the same speaker]
[the target]; the model learns p(target codes | word, prompt) and at sampling time says a word in
the voice of a few seconds of someone's speech, decoded to audio through the codebook's frames
and Griffin-Lim (src.data.mels.mel_to_audio).

    python -m src.train experiment=tts_fsdd

At the end of testing, every test recording (at most `judged`) is said again from its word and
its fixed prompt (another recording by its speaker) and, with `judge` (a digit classifier's
checkpoint, model=ast | cnn on the same kind of audio) and `voice_judge` (one trained with
data.target=speaker), heard as audio: test/speech_digit_acc (the word recognised) and
test/speech_voice_acc (the prompt's speaker recognised), beside the same judges on the real
recordings (test/real_*) and on them rebuilt from their own codes (test/rebuilt_*: the ceiling
of anything said in codes); and the same for the val split's recordings (test/seen_speech_*),
whose speakers TTS was trained on. The first `samples` become `samples/<n>_<word>.wav`, and
`speech.png` (rows: the prompts, the generated and the real log-mels through the codebook;
columns: the recordings), logged.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from src.data.audio import codes_to_audio, codes_to_frames
from src.data.mels import log_mel
from src.data.spectrograms import collate_lengths
from src.data.speech import CODE_OFFSET, sequence, spoken_word
from src.models.gpt import GPTLitModule
from src.utils.callbacks import log_image, plot_image_rows
from src.utils.errors import PipelineError


class Listener:
    """An audio classifier's checkpoint (model=ast | cnn on data=audio | fsdd) as a judge of
    recordings, each heard through the checkpoint's own mel settings and normalisation."""

    def __init__(self, path: str):
        from src.models.image import load_classifier
        from src.utils.checkpoint import load_checkpoint

        self.net = load_classifier(path)
        self.state = load_checkpoint(path).get("AudioDataModule", {})
        if "mean" not in self.state:
            raise PipelineError(f"{path}: not an audio classifier (model=ast | cnn, data=audio)")
        if self.state.get("speaker_norm", "none") != "none":  # it needs many takes of a voice
            raise PipelineError(f"{path}: trained with data.speaker_norm, it cannot judge "
                                "single recordings; train the judge without it")  # fmt: skip

    @torch.no_grad()
    def __call__(self, waves: list[np.ndarray]) -> list[str]:
        """Recordings at the checkpoint's sample rate -> the class names it hears."""
        s = self.state
        heard = [((torch.from_numpy(log_mel(w, s)) - s["mean"]) / s["std"])[None] for w in waves]
        logits = []
        for i in range(0, len(heard), 256):  # (1, n_mels, L_i) each, padded as in training
            x, _, lengths = collate_lengths([(h, 0) for h in heard[i : i + 256]])
            logits.append(self.net(x, lengths if s["fit"] == "full" else None))
        return [s["classes"][i] for i in torch.cat(logits).argmax(-1).tolist()]


class SpeechGPT(GPTLitModule):
    """GPT on the speech-token sequences of src.data.speech; `codes` K, `stack` frames a code."""

    def __init__(self, net: dict, optim: dict, vocab_size: int, block_size: int, codes: int,
                 stack: int = 2, generation: dict | None = None, compile: bool = False,
                 embedding: dict | None = None, samples: int = 6, judge: str | None = None,
                 voice_judge: str | None = None, judged: int = 500):  # fmt: skip
        super().__init__({**net, "block_size": block_size}, optim, vocab_size, generation,
                         compile, embedding)  # fmt: skip
        # a target is codes and nothing else: the letters, separators and EOS never sampled
        self.generation = dataclasses.replace(self.generation, eos_id=None,
                                              suppress_ids=tuple(range(CODE_OFFSET)))  # fmt: skip

    @torch.no_grad()
    def speak(self, words: list[str], prompts: np.ndarray, steps: int,
              generator: torch.Generator | None = None) -> np.ndarray:  # fmt: skip
        """Words and prompt codes (B, T') -> generated codes (B, steps), one word length (one
        prefix length) at a time."""
        out = np.zeros((len(words), steps), dtype=np.int64)
        cfg = dataclasses.replace(self.generation, max_new_tokens=steps)
        for length in sorted({len(w) for w in words}):
            rows = [i for i, w in enumerate(words) if len(w) == length]
            prefix = torch.tensor(
                [sequence(words[i], prompts[i]) for i in rows], device=self.device
            )
            codes = self.generate(prefix, cfg, generator=generator)[:, prefix.size(1) :]
            out[rows] = codes.cpu().numpy() - CODE_OFFSET
        return out

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        if self.trainer.is_global_zero:
            self._say_test_words()

    def _say(self, split: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """Recordings (rows) of a split said again from their word and fixed prompt:
        (prompt codes, generated codes, generated audio)."""
        data = self.trainer.datamodule
        d = data.splits[split]
        prompts = np.stack([d.codes[d.fixed[i]] for i in rows])
        was_training = self.training
        self.eval()
        g = torch.Generator(self.device).manual_seed(0)
        said = self.speak([d.words[i] for i in rows], prompts, d.codes.shape[1], g)
        self.train(was_training)
        return prompts, said, codes_to_audio(said, data.codebook(), data.mel_settings())

    def frames(self, codes: np.ndarray) -> np.ndarray:
        """Codes (B, T') -> log-mels (B, n_mels, T): the codebook's frames."""
        data = self.trainer.datamodule
        return codes_to_frames(codes, data.codebook(), data.hparams.n_mels)

    def _judge(self, listeners: dict, split: str, waves: list[np.ndarray], prefix: str) -> None:
        """Logs how often each listener hears the right word / speaker in the generated audio of
        a split's first recordings, and, for the held-out split, in the real recordings and in
        them rebuilt from codes."""
        data, n = self.trainer.datamodule, len(waves)
        d = data.splits[split]
        heard = {"speech": waves}
        if split == "test":
            heard["rebuilt"] = codes_to_audio(d.codes[:n], data.codebook(), data.mel_settings())
            heard["real"] = data.recordings(split, n)
        truth = {"digit": d.words[:n], "voice": list(d.speakers[:n])}
        for name, listener in listeners.items():
            for kind, w in heard.items():
                said = listener(w)
                if name == "digit":  # class labels ("7") as the words said ("seven")
                    said = [spoken_word(c) for c in said]
                acc = np.mean([a == b for a, b in zip(said, truth[name], strict=True)])
                self.log(f"{prefix}{kind}_{name}_acc", float(acc))

    def _say_test_words(self) -> None:
        import soundfile as sf

        hp, data = self.hparams, self.trainer.datamodule
        # read at test time only: the judges are not trained, nor saved with this model
        listeners = {k: Listener(p) for k, p in (("digit", hp.judge), ("voice", hp.voice_judge))
                     if p}  # fmt: skip
        test = data.splits["test"]
        n = min(len(test), hp.judged) if listeners else len(test)
        # the samples spread over the split (files sorted by word: every word, not ten zeros)
        picks = np.unique(np.linspace(0, n - 1, min(n, hp.samples)).astype(int))
        if listeners:
            prompts, said, waves = self._say("test", np.arange(n))
            self._judge(listeners, "test", waves, "test/")
            # the speakers TTS was trained on, in recordings it was not: does the prompt lead?
            seen = np.arange(min(len(data.splits["val"]), hp.judged))
            self._judge(listeners, "val", self._say("val", seen)[2], "test/seen_")
            prompts, said, waves = prompts[picks], said[picks], [waves[i] for i in picks]
        elif len(picks):
            prompts, said, waves = self._say("test", picks)
        else:
            return
        run = Path(self.trainer.default_root_dir)
        (run / "samples").mkdir(exist_ok=True)
        for i, (row, wave) in enumerate(zip(picks, waves, strict=True)):
            sf.write(run / "samples" / f"{i}_{test.words[row]}.wav", wave,
                     data.hparams.sample_rate)  # fmt: skip
        top = data.hparams.top_db  # dB below the peak -> [0, 1], the lowest band at the bottom
        pictures = [torch.from_numpy((self.frames(c) + top) / top).clamp(0, 1).flip(1)[:, None]
                    for c in (prompts, said, test.codes[picks])]  # fmt: skip
        path = run / "speech.png"
        plot_image_rows(pictures, ["prompt", "generated", "real (codes)"], path,
                        [test.words[row] for row in picks])  # fmt: skip
        log_image(self.trainer, "test/speech", path)
