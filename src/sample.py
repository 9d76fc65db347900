"""Generate text from a trained GPT checkpoint; samples go to stdout. A text <-> image
checkpoint (model=parti | captioner | cm3leon) draws the prompt's images into a PNG, or captions
an image; a text-to-speech checkpoint (model=tts) says the prompt's word in the voice of a
recording, into WAVs.

python -m src.sample ckpt=outputs/runs/<run>/checkpoints/last.ckpt prompt="ROMEO:"
python -m src.sample ckpt=... strategy=greedy max_new_tokens=100
python -m src.sample ckpt=... strategy=sample temperature=0.8 top_k=40 top_p=0.95
python -m src.sample ckpt=... strategy=beam beam_width=8 length_penalty=0.7
python -m src.sample ckpt=<parti run>/checkpoints/last.ckpt prompt="a thick seven" out=7.png
python -m src.sample ckpt=<captioner run>/checkpoints/last.ckpt image=digit.png
python -m src.sample ckpt=<tts run>/checkpoints/last.ckpt prompt=seven voice=me.wav out=7.wav
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from src.utils.config import config_errors, register_resolvers

register_resolvers()
# the models that generate text: checkpoint class -> name
LANGUAGE_MODELS = {
    "src.models.gpt.GPTLitModule": "GPT",
    "src.models.rnn_lm.RNNLMLitModule": "RNN",
    "src.models.ngram.NGramLitModule": "n-gram",
}


def sample(cfg: DictConfig) -> list[str]:
    import torch
    from hydra.utils import get_class

    from src.data.text import EOS, checkpoint_tokenizer, load_tokenizer
    from src.models.generation import GenerationConfig
    from src.utils.checkpoint import check_same_model, load_checkpoint
    from src.utils.errors import PipelineError

    ckpt = load_checkpoint(cfg.ckpt)
    found = ckpt.get("model_class")
    if found == "src.models.multimodal.ImageTextSeq2Seq":
        return draw_or_caption(cfg)
    if found == "src.models.speech.SpeechGPT":
        return say(cfg, ckpt)
    if found not in LANGUAGE_MODELS:
        raise PipelineError(f"checkpoint {cfg.ckpt} holds a {found or 'foreign model'}, not a "
                            f"language model ({', '.join(LANGUAGE_MODELS.values())})")  # fmt: skip
    tokenizer_json = checkpoint_tokenizer(ckpt)
    if tokenizer_json is None:
        raise PipelineError(f"the checkpoint {cfg.ckpt} carries no tokenizer")
    # a run that diverged saves NaN weights, which would sample from NaN probabilities
    weights = [v for v in ckpt["state_dict"].values() if v.is_floating_point()]
    if not all(v.isfinite().all() for v in weights):
        raise PipelineError(
            f"the checkpoint {cfg.ckpt} holds NaN or infinite weights; sample from an earlier one"
        )
    model = get_class(ckpt["model_class"])(**ckpt["hyper_parameters"])
    check_same_model(ckpt, model, cfg.ckpt)
    model.load_state_dict(ckpt["state_dict"])
    model.to(cfg.device).eval()
    tokenizer = load_tokenizer(tokenizer_json)

    eos = tokenizer.token_to_id(EOS) if cfg.stop_at_eos else None
    gen = GenerationConfig.from_settings(cfg, eos_id=eos)
    prompt = torch.tensor([tokenizer.encode(cfg.prompt).ids], device=cfg.device)
    if prompt.numel() == 0:
        raise PipelineError(f"the prompt {cfg.prompt!r} encodes to no tokens")
    g = torch.Generator(cfg.device).manual_seed(cfg.seed)
    # sampling draws num_samples different continuations; greedy and beam search are deterministic
    n = cfg.num_samples if cfg.strategy == "sample" else 1
    out = model.generate(prompt.expand(n, -1), gen, generator=g)
    return [cfg.prompt + tokenizer.decode(row[prompt.size(1) :].tolist()) for row in out]


def draw_or_caption(cfg: DictConfig) -> list[str]:
    """A text <-> image checkpoint: with image=PNG, its caption; otherwise num_samples images of
    the prompt drawn into out (a PNG)."""
    from pathlib import Path

    import numpy as np
    import torch

    from src.data.captions import WORDS
    from src.data.images import dequantize, quantize
    from src.models.generation import GenerationConfig
    from src.models.multimodal import load_image_text
    from src.utils.callbacks import plot_image_rows
    from src.utils.errors import PipelineError

    model, codebook, size = load_image_text(cfg.ckpt)
    patch, direction = model.hparams.patch, model.hparams.captions
    if cfg.image:
        if direction == "text2image":
            raise PipelineError(f"{cfg.ckpt} draws images from captions (model=parti); give "
                                "prompt=..., not image=")  # fmt: skip
        from PIL import Image, UnidentifiedImageError

        try:
            img = Image.open(cfg.image).convert("L").resize(size[::-1])
        except (OSError, UnidentifiedImageError) as e:
            raise PipelineError(f"{cfg.image}: not a readable image ({e})") from None
        codes = quantize(np.asarray(img, dtype=np.uint8)[None, None], codebook.numpy(), patch)
        return model.caption_images(codes)
    if direction == "image2text":
        raise PipelineError(f"{cfg.ckpt} captions images (model=captioner); give image=PNG")
    unknown = [w for w in cfg.prompt.split() if w not in WORDS]
    if unknown or not cfg.prompt.split():
        raise PipelineError(f"prompt={cfg.prompt!r}: captions use the words {' '.join(WORDS)}")
    model.generation = GenerationConfig.from_settings(cfg, eos_id=None)
    g = torch.Generator().manual_seed(cfg.seed)
    n_codes = (size[0] // patch) * (size[1] // patch)
    codes = model.generate_images([cfg.prompt] * cfg.num_samples, n_codes, g)
    out = Path(cfg.out)
    plot_image_rows([dequantize(codes, codebook, size, patch)], [cfg.prompt], out)
    return [f"{cfg.num_samples} images of {cfg.prompt!r} in {out}"]


def say(cfg: DictConfig, ckpt: dict) -> list[str]:
    """A text-to-speech checkpoint: the word prompt=WORD said num_samples times in the voice of
    the recording voice=FILE (its codes are the prompt), as WAVs named after out."""
    import dataclasses
    from pathlib import Path

    import numpy as np
    import soundfile as sf
    import torch

    from src.data import vq
    from src.data.audio import codes_to_audio
    from src.data.mels import load_audio, log_mel
    from src.data.speech import frame_vectors
    from src.models.generation import GenerationConfig
    from src.models.speech import SpeechGPT
    from src.utils.checkpoint import check_same_model
    from src.utils.errors import PipelineError

    if not cfg.voice:
        raise PipelineError(f"{cfg.ckpt} says a word in someone's voice: give prompt=WORD and "
                            "voice=RECORDING (WAV, FLAC or OGG)")  # fmt: skip
    state = ckpt["AudioDataModule"]  # mel settings, frames a code, the codebook
    model = SpeechGPT(**ckpt["hyper_parameters"])
    check_same_model(ckpt, model, cfg.ckpt)
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    book = np.asarray(state["codebook"], dtype=np.float32)
    mel = log_mel(load_audio(Path(cfg.voice), state["sample_rate"]), state)  # (n_mels, T)
    prompt = vq.encode(frame_vectors(mel[None], state["stack"]), book)  # (1, T / stack)
    gen = GenerationConfig.from_settings(cfg, eos_id=None)
    model.generation = dataclasses.replace(gen, suppress_ids=model.generation.suppress_ids)
    word = cfg.prompt.strip().lower()
    g = torch.Generator().manual_seed(cfg.seed)
    codes = model.speak([word] * cfg.num_samples, prompt.repeat(cfg.num_samples, 0),
                        prompt.shape[1], g)  # fmt: skip
    waves = codes_to_audio(codes, book, state)
    out = Path(cfg.out).with_suffix(".wav")
    names = (
        [out] if len(waves) == 1 else [out.with_stem(f"{out.stem}_{i}") for i in range(len(waves))]
    )
    for name, wave in zip(names, waves, strict=True):
        sf.write(name, wave, state["sample_rate"])
    return [f"{word!r} in the voice of {cfg.voice}: {', '.join(map(str, names))}"]


@config_errors
@hydra.main(version_base="1.3", config_path="../conf", config_name="sample")
def main(cfg: DictConfig) -> None:
    from src.utils.errors import report_errors

    with report_errors():
        try:
            samples = sample(cfg)
        except ValueError as e:  # invalid generation settings
            from src.utils.errors import PipelineError

            raise PipelineError(str(e)) from e
    for i, text in enumerate(samples):
        if len(samples) > 1:
            print(f"--- sample {i + 1}")
        print(text)


if __name__ == "__main__":
    main()
