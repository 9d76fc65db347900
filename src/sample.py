"""Generate text from a trained GPT checkpoint; samples go to stdout.

python -m src.sample ckpt=outputs/runs/<run>/checkpoints/last.ckpt prompt="ROMEO:"
python -m src.sample ckpt=... strategy=greedy max_new_tokens=100
python -m src.sample ckpt=... strategy=sample temperature=0.8 top_k=40 top_p=0.95
python -m src.sample ckpt=... strategy=beam beam_width=8 length_penalty=0.7
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
