"""Text-to-speech in Vall-E's manner, small (Bishop, Deep Learning, sec. 12.4.4): GPT over
speech tokens. The audio data module with data.codes=K (src.data.speech) turns each recording
into codes of its log-mel frames and lays out [word letters] [a prompt by the same speaker]
[the target]; the model learns p(target codes | word, prompt) and at sampling time says a word in
the voice of a few seconds of someone's speech, decoded to audio through the codebook's frames
and Griffin-Lim (src.data.audio.mel_to_audio).

    python -m src.train experiment=tts_fsdd

At the end of testing, the first `samples` test recordings are said again from their word and
their fixed prompt: `samples/<n>_<word>.wav` and `speech.png` (rows: the prompts, the generated
and the real log-mels, through the codebook; columns: the recordings) in the run folder, the
picture logged. bench/generation_multimodal.py
scores intelligibility and voice with the project's classifiers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from src.data.speech import CODE_OFFSET, sequence, vector_frames
from src.models.gpt import GPTLitModule
from src.utils.callbacks import log_image, plot_image_rows


class SpeechGPT(GPTLitModule):
    """GPT on the speech-token sequences of src.data.speech; `codes` K, `stack` frames a code."""

    def __init__(self, net: dict, optim: dict, vocab_size: int, block_size: int, codes: int,
                 stack: int = 2, generation: dict | None = None, compile: bool = False,
                 embedding: dict | None = None, samples: int = 6):  # fmt: skip
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
        if self.trainer.is_global_zero and self.hparams.samples:
            self._say_samples()

    def _say_samples(self) -> None:
        import soundfile as sf

        from src.data.audio import mel_to_audio

        data, n = self.trainer.datamodule, self.hparams.samples
        test = data.splits["test"]
        n = min(n, len(test))
        prompts = np.stack([test.codes[test.fixed[i]] for i in range(n)])
        was_training = self.training
        self.eval()
        g = torch.Generator(self.device).manual_seed(0)
        said = self.speak(test.words[:n], prompts, test.codes.shape[1], g)
        self.train(was_training)
        book = torch.from_numpy(data.codebook())
        n_mels = data.hparams.n_mels

        def frames(codes: np.ndarray) -> Tensor:  # (B, T') -> log-mels (B, n_mels, T)
            return vector_frames(book[torch.from_numpy(codes)], n_mels)

        run = Path(self.trainer.default_root_dir)
        (run / "samples").mkdir(exist_ok=True)
        settings = dict(data.hparams)
        for i, mel in enumerate(frames(said)):
            wav = mel_to_audio(mel.numpy(), settings)
            sf.write(run / "samples" / f"{i}_{test.words[i]}.wav", wav, settings["sample_rate"])
        top = settings["top_db"]  # dB below the peak -> [0, 1], the lowest band at the bottom
        rows = [((frames(c) + top) / top).clamp(0, 1).flip(1)[:, None]
                for c in (prompts, said, test.codes[:n])]  # fmt: skip
        path = run / "speech.png"
        plot_image_rows(rows, ["prompt", "generated", "real (codes)"], path)
        log_image(self.trainer, "test/speech", path)
