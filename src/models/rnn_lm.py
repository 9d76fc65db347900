"""The recurrent language model (Bishop, sec. 12.2.5-12.2.6): a vanilla (tanh) RNN, a GRU or an
LSTM reads the text one token at a time,

    z_n = f(z_{n-1}, x_n, w),    p(x_{n+1} | x_1, ..., x_n) = softmax(W_o z_n),

and is trained, evaluated and sampled as GPT is: the same data, optimiser, metrics and
generation strategies (the state z_n is its cache, so a token costs one step however long the
text).

Back-propagation through time unrolls the recursion over the block. Truncated BPTT (`tbptt`
tokens) cuts it into windows: the state's value is carried into the next window, so every
prediction still conditions on the whole block, but detached, so no gradient reaches back past
its window's start. The windows' losses are summed into one loss and one optimiser step per
batch: the gradient is the sum that a backward pass per window would accumulate, and
max_steps, the learning-rate schedule, gradient accumulation and Lightning's gradient clipping
(trainer.gradient_clip_val, the remedy for exploding gradients) mean what they mean for GPT.
The price is that the graph of the whole block is kept until the step, affordable at blocks of
hundreds of tokens.

The vanishing gradient is measured on the first val batch (src.nn.rnn.gradient_norms):
||dL_T / dz_n|| against the distance T - n at the start of training and after every epoch.
grad/decay_init and grad/decay_final are the ratio of the norm at distance T - 1 to that at
distance 0; <run dir>/gradient_norms.png plots both curves.
"""

from __future__ import annotations

from pathlib import Path

import torch.nn.functional as F
from torch import Tensor

from src.models.generation import GenerationConfig, RecurrentDecoder, generate
from src.models.gpt import LanguageModelModule
from src.nn.rnn import RNNLM, RNNLMConfig, gradient_norms
from src.utils.callbacks import log_image

WHEN = {"init": "at initialisation", "final": "after training"}  # the curves of the plot


class RNNLMLitModule(LanguageModelModule):
    """Trains the RNN language model with truncated BPTT of `tbptt` tokens (None: the whole
    block) and measures its gradients' decay with distance."""

    def __init__(
        self,
        net: dict,
        optim: dict,
        vocab_size: int,
        tbptt: int | None = None,
        generation: dict | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        if tbptt is not None and not (type(tbptt) is int and tbptt >= 1):
            raise ValueError(f"tbptt must be a positive number of tokens or null, got {tbptt!r}")
        self.net = RNNLM(RNNLMConfig(**net, vocab_size=vocab_size))
        self.generation = GenerationConfig(**(generation or {}))
        self.norms: dict[str, Tensor] = {}  # "init", "final": ||dL_T / dz_n||, (T,)

    def forward(self, idx: Tensor) -> Tensor:  # (B, T) -> (B, T, K)
        return self.net(idx)[0]

    def _loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch  # (B, T), (B, T)
        window = self.hparams.tbptt or x.size(1)
        state, total = None, 0.0
        for t in range(0, x.size(1), window):
            logits, state = self.net(x[:, t : t + window], state)  # (B, W, K)
            total = total + F.cross_entropy(
                logits.flatten(0, 1), y[:, t : t + window].flatten(), reduction="sum"
            )
            state = state.detach()
        return total / y.numel()

    def generate(self, prompt: Tensor, cfg: GenerationConfig | None = None, **kw) -> Tensor:
        """prompt: (B, T0) -> (B, T0 + n); see src.models.generation for the strategies."""
        start = self.net.initial_state(len(prompt), prompt.device)  # z_0 = 0
        decoder = RecurrentDecoder(self.net.step, start)
        return generate(decoder, prompt, cfg or self.generation, **kw)

    def _measure(self, when: str) -> None:
        x, y = next(iter(self.trainer.datamodule.val_dataloader()))
        was_training = self.training
        self.eval()  # no dropout
        norms = gradient_norms(self.net, x.to(self.device), y.to(self.device)).cpu()
        self.train(was_training)
        self.norms[when] = norms
        self.log(f"grad/decay_{when}", norms[0] / norms[-1])

    def on_train_start(self) -> None:
        super().on_train_start()
        if self.global_step == 0:  # a resumed run starts from trained weights
            self._measure("init")

    def on_train_epoch_end(self) -> None:
        self._measure("final")  # every epoch: the last is after training, however it ends

    def on_fit_end(self) -> None:
        if not self.trainer.is_global_zero or not self.norms:
            return
        path = Path(self.trainer.default_root_dir) / "gradient_norms.png"
        curves = {WHEN[k]: v for k, v in self.norms.items()}
        plot_gradient_norms(curves, path, f"{self.net.cfg.cell}, step {self.global_step}")
        log_image(self.trainer, "grad/norms", path)


def plot_gradient_norms(norms: dict[str, Tensor], path: Path, title: str) -> None:
    """Curves of ||dL_T / dz_n|| (T,) against T - n, on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, curve in norms.items():
        ax.semilogy(range(len(curve)), curve.flip(0), label=name)  # distance 0 first
    ax.set_xlabel("distance T - n")
    ax.set_ylabel("||dL_T / dz_n||")
    ax.set_title(f"gradient of the last loss w.r.t. earlier states ({title})", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
