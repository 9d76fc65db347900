"""Translate sentences with a trained model=seq2seq (or rnn_seq2seq) checkpoint; one line in,
one line out.

echo "How are you?" | python -m src.translate ckpt=outputs/runs/<run>/checkpoints/last.ckpt
python -m src.translate ckpt=... input=sentences.txt strategy=greedy
python -m src.translate ckpt=... strategy=beam beam_width=8 length_penalty=1.0
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from src.utils.config import register_resolvers

register_resolvers()


def translate(cfg: DictConfig, lines: list[str]) -> list[str]:
    import torch

    from src.models.generation import GenerationConfig
    from src.models.seq2seq import load_translator, translate_texts

    model, src_tok, tgt_tok = load_translator(cfg.ckpt, cfg.device)
    gen = GenerationConfig.from_settings(cfg, eos_id=model.generation.eos_id)
    torch.manual_seed(cfg.seed)
    todo = [i for i, line in enumerate(lines) if line.strip()]  # blank lines stay blank
    out = [""] * len(lines)
    done = translate_texts(model, src_tok, tgt_tok, [lines[i] for i in todo], gen, cfg.batch_size)
    for i, text in zip(todo, done, strict=True):
        out[i] = text
    return out


@hydra.main(version_base="1.3", config_path="../conf", config_name="translate")
def main(cfg: DictConfig) -> None:
    from src.utils.errors import PipelineError, report_errors

    with report_errors():
        if cfg.input is not None:
            path = Path(cfg.input)
            if not path.is_file():
                raise PipelineError(f"input file not found: {path}")
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise PipelineError(f"{path} is not UTF-8 text") from None
        else:
            text = sys.stdin.read()
        try:
            translations = translate(cfg, text.splitlines())
        except ValueError as e:  # invalid generation settings
            raise PipelineError(str(e)) from e
    for line in translations:
        print(line)


if __name__ == "__main__":
    main()
