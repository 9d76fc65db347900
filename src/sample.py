"""Generate text from a trained GPT checkpoint; samples go to stdout.

python -m src.sample ckpt=outputs/runs/<run>/checkpoints/last.ckpt prompt="ROMEO:"
python -m src.sample ckpt=... strategy=greedy max_new_tokens=100
python -m src.sample ckpt=... strategy=sample temperature=0.8 top_k=40 top_p=0.95
python -m src.sample ckpt=... strategy=beam beam_width=8 length_penalty=0.7
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from src.utils.config import register_resolvers

register_resolvers()


def sample(cfg: DictConfig) -> list[str]:
    import torch

    from src.data.text import EOS, load_tokenizer
    from src.models.generation import GenerationConfig
    from src.models.gpt import GPTLitModule
    from src.utils.checkpoint import load_checkpoint

    ckpt = load_checkpoint(cfg.ckpt, expected_class="src.models.gpt.GPTLitModule")
    model = GPTLitModule(**ckpt["hyper_parameters"])
    model.load_state_dict(ckpt["state_dict"])
    model.to(cfg.device).eval()
    tokenizer = load_tokenizer(ckpt["TextDataModule"]["tokenizer"])

    eos = tokenizer.token_to_id(EOS) if cfg.stop_at_eos else None
    gen = GenerationConfig.from_settings(cfg, eos_id=eos)
    prompt = torch.tensor([tokenizer.encode(cfg.prompt).ids], device=cfg.device)
    if prompt.numel() == 0:
        from src.utils.errors import PipelineError

        raise PipelineError(f"the prompt {cfg.prompt!r} encodes to no tokens")
    g = torch.Generator(cfg.device).manual_seed(cfg.seed)
    # sampling draws num_samples different continuations; greedy and beam search are deterministic
    n = cfg.num_samples if cfg.strategy == "sample" else 1
    out = model.generate(prompt.expand(n, -1), gen, generator=g)
    return [cfg.prompt + tokenizer.decode(row[prompt.size(1) :].tolist()) for row in out]


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
