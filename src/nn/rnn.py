"""The recurrent encoder-decoder that the Transformer replaced (Bishop, sec. 12.2.5; Cho et al.
2014, Sutskever et al. 2014), and the additive attention of Bahdanau et al. (2015), the step
between the two.

An encoder RNN reads the source x_1..x_S in both directions into states h_1..h_S. Without
attention, the decoder RNN starts from one fixed vector z*, made of the encoder's final states,
and sees nothing else of the source: every translation must pass through those D numbers, the
bottleneck the chapter names. With attention, each decoder step t also reads a fresh context

    c_t = Σ_j α_tj h_j,    α_tj = softmax_j(v^T tanh(W_s s_{t-1} + W_h h_j)),

so a long sentence is no longer squeezed into z*. The decoder's input at step t is the previous
target token's embedding with c_t (c_t = z* without attention, as Cho et al. feed it at every
step), and its output tanh(W_o [s_t; c_t]) goes through the output layer to the next token's
logits.

The recurrent language model of sec. 12.2.5 is such a decoder alone, with nothing to condition
on: the hidden state z_n = f(z_{n-1}, x_n) summarises the tokens so far and
p(x_{n+1} | x_1..x_n) = softmax(W_o z_n). Sec. 12.2.6's trouble with training it, vanishing and
exploding gradients, is measured by `gradient_norms`: the error at the last position reaches
z_n through the T - n Jacobians dz_{m+1}/dz_m of the steps between, whose product shrinks or
grows geometrically in T - n for the vanilla (tanh) RNN; the additive cell state of the LSTM
and the gated update of the GRU give the gradient a path on which it need not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

# nn.RNN is the vanilla cell, z_n = tanh(W x_n + U z_{n-1} + b)
CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


def cell(name: str) -> type[nn.RNNBase]:
    """The torch RNN class of a config's `cell`."""
    if name not in CELLS:
        raise ValueError(f"unknown cell {name!r}; expected one of {tuple(CELLS)}")
    return CELLS[name]


Hidden = Tensor | tuple[Tensor, Tensor]  # (L, B, D); an LSTM's (h, c)


def each(hidden: Hidden, fn: Callable[[Tensor], Tensor]) -> Hidden:
    """fn applied to the state, to both h and c of an LSTM's."""
    return tuple(fn(x) for x in hidden) if isinstance(hidden, tuple) else fn(hidden)


@dataclass
class RNNSeq2SeqConfig:
    vocab_size: int = 256  # the decoder's K
    src_vocab_size: int = 256  # the encoder's K
    shared_vocab: bool = True  # one embedding matrix for source and target tokens
    block_size: int = 64  # the longest source, and target + its start token
    pad_id: int = 0  # the padding token's id, set by the model from its tokenizer
    d_model: int = 256  # D: embeddings, encoder states (per direction), decoder states
    n_layer: int = 1  # stacked RNN layers, in the encoder and in the decoder
    cell: str = "gru"  # rnn (tanh) | gru | lstm
    attention: bool = False  # False: z* alone; True: additive attention over h_1..h_S
    dropout: float = 0.1
    tie_weights: bool = True  # the output layer shares the target embedding matrix


@dataclass
class RNNState:
    """What one decoding step needs: the decoder's hidden state and the encoded source."""

    hidden: Hidden  # s: (L, B, D); an LSTM's (h, c)
    z: Tensor  # z*: (B, D)
    memory: Tensor | None = None  # attention: h_j projected to D, (B, S, D)
    keys: Tensor | None = None  # attention: W_h h_j, computed once per sentence, (B, S, D)
    pad: Tensor | None = None  # attention: (B, S), True at padding

    def reorder(self, index: Tensor) -> RNNState:
        """Keep the rows `index` (beam search's surviving hypotheses)."""
        rows = (t if t is None else t[index] for t in (self.z, self.memory, self.keys, self.pad))
        return RNNState(each(self.hidden, lambda x: x[:, index]), *rows)


class RNNSeq2Seq(nn.Module):
    """Bidirectional encoder RNN, z* = tanh(W_z [→h_S; ←h_1]), decoder RNN of n_layer layers."""

    def __init__(self, cfg: RNNSeq2SeqConfig):
        super().__init__()
        self.cfg = cfg
        d, rnn = cfg.d_model, cell(cfg.cell)
        between = cfg.dropout if cfg.n_layer > 1 else 0.0  # nn.RNN's dropout is between layers
        self.src_emb = nn.Embedding(cfg.src_vocab_size, d)
        self.tgt_emb = self.src_emb if cfg.shared_vocab else nn.Embedding(cfg.vocab_size, d)
        self.encoder = rnn(d, d, cfg.n_layer, batch_first=True, bidirectional=True,
                           dropout=between)  # fmt: skip
        self.w_z = nn.Linear(2 * d, d)  # the two directions' final states -> z*
        if cfg.attention:
            self.w_m = nn.Linear(2 * d, d)  # h_j (both directions) -> memory
            self.w_h = nn.Linear(d, d, bias=False)  # keys W_h h_j
            self.w_s = nn.Linear(d, d)  # query W_s s_{t-1}
            self.v = nn.Linear(d, 1, bias=False)
        self.decoder = rnn(2 * d, d, cfg.n_layer, batch_first=True, dropout=between)
        self.w_o = nn.Linear(2 * d, d)
        self.drop = nn.Dropout(cfg.dropout)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.tgt_emb.weight
        for emb in {self.src_emb, self.tgt_emb}:  # std 1/sqrt(D), not 1: the tied output layer
            nn.init.normal_(emb.weight, std=d**-0.5)  # then starts at logits of unit scale

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src: (B, S) ids, padding after each sentence -> the states (B, S, 2D) of both
        directions, zero at padding, and the padding (B, S)."""
        pad = src == self.cfg.pad_id
        lengths = (~pad).sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(self.drop(self.src_emb(src)), lengths, batch_first=True,
                                      enforce_sorted=False)  # fmt: skip
        h, _ = self.encoder(packed)
        h, _ = pad_packed_sequence(h, batch_first=True, total_length=src.size(1))
        return h, pad

    def start(self, h: Tensor, pad: Tensor) -> RNNState:
        """The decoder's state before its first token: s_0 = z* in every layer."""
        d, last = self.cfg.d_model, (~pad).sum(1).clamp(min=1) - 1  # (B,) last real position
        rows = torch.arange(len(h), device=h.device)
        z = torch.tanh(self.w_z(torch.cat([h[rows, last, :d], h[:, 0, d:]], -1)))  # (B, D)
        s = z.expand(self.cfg.n_layer, -1, -1).contiguous()  # (L, B, D)
        hidden = (s, torch.zeros_like(s)) if self.cfg.cell == "lstm" else s
        if not self.cfg.attention:  # the decoder sees the source through z* alone
            return RNNState(hidden, z)
        memory = self.w_m(h)  # (B, S, D)
        return RNNState(hidden, z, memory, self.w_h(memory), pad)

    def step(self, y: Tensor, state: RNNState) -> tuple[Tensor, RNNState]:
        """One decoder step: the previous tokens y (B,) -> logits (B, K) of the next ones."""
        h = state.hidden
        s = (h[0] if isinstance(h, tuple) else h)[-1]  # s_{t-1} of the top layer: (B, D)
        if self.cfg.attention:
            scores = self.v(torch.tanh(state.keys + self.w_s(s)[:, None])).squeeze(-1)  # (B, S)
            alpha = scores.masked_fill(state.pad, float("-inf")).softmax(-1)
            c = (alpha[..., None] * state.memory).sum(1)  # (B, D)
        else:
            c = state.z
        x = torch.cat([self.drop(self.tgt_emb(y)), c], -1)[:, None]  # (B, 1, 2D)
        out, hidden = self.decoder(x, h)  # (B, 1, D)
        o = torch.tanh(self.w_o(torch.cat([out[:, 0], c], -1)))  # (B, D)
        return self.lm_head(self.drop(o)), dataclasses.replace(state, hidden=hidden)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing. src: (B, S), tgt_in: (B, T) -> logits (B, T, K) of the next target
        token."""
        state = self.start(*self.encode(src))
        logits = []
        for t in range(tgt_in.size(1)):
            step_logits, state = self.step(tgt_in[:, t], state)
            logits.append(step_logits)
        return torch.stack(logits, 1)


@dataclass
class RNNLMConfig:
    vocab_size: int = 256  # K
    d_model: int = 256  # D: token embeddings and the hidden states z_n of every layer
    n_layer: int = 2  # stacked RNN layers
    cell: str = "gru"  # rnn (tanh) | gru | lstm
    dropout: float = 0.0  # on the embeddings, between layers and before the output layer
    tie_weights: bool = True  # the output layer shares the embedding matrix


@dataclass
class LMState:
    """The recurrent language model's state z_n, all it keeps of the tokens read."""

    hidden: Hidden

    def reorder(self, index: Tensor) -> LMState:
        """Keep the rows `index` (beam search's surviving hypotheses)."""
        return LMState(each(self.hidden, lambda x: x[:, index]))

    def detach(self) -> LMState:
        """The same value, through which no gradient flows back (truncated BPTT)."""
        return LMState(each(self.hidden, Tensor.detach))


class RNNLM(nn.Module):
    """Embedding, n_layer RNN layers, and a linear output layer over z_n of the top layer."""

    def __init__(self, cfg: RNNLMConfig):
        super().__init__()
        self.cfg = cfg
        d, rnn = cfg.d_model, cell(cfg.cell)
        between = cfg.dropout if cfg.n_layer > 1 else 0.0  # nn.RNN's dropout is between layers
        self.tok_emb = nn.Embedding(cfg.vocab_size, d)
        self.rnn = rnn(d, d, cfg.n_layer, batch_first=True, dropout=between)
        self.drop = nn.Dropout(cfg.dropout)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        # std 1/sqrt(D), not 1: the tied output layer then starts at logits of unit scale
        nn.init.normal_(self.tok_emb.weight, std=d**-0.5)
        if cfg.cell == "lstm":  # forget gate bias 1 (Gers et al. 2000): c starts out remembered
            for name, b in self.rnn.named_parameters():
                if name.startswith("bias_ih"):  # gates i, f, g, o
                    nn.init.constant_(b[d : 2 * d], 1.0)

    def initial_state(self, batch: int, device: torch.device | None = None) -> LMState:
        """z_0 = 0."""
        z = torch.zeros(self.cfg.n_layer, batch, self.cfg.d_model, device=device)
        return LMState((z, torch.zeros_like(z)) if self.cfg.cell == "lstm" else z)

    def forward(self, idx: Tensor, state: LMState | None = None) -> tuple[Tensor, LMState]:
        """idx: (B, T) from the state z_0 (zero if None) -> logits (B, T, K) of the next tokens,
        and the state z_T after the last."""
        hidden = None if state is None else state.hidden
        out, hidden = self.rnn(self.drop(self.tok_emb(idx)), hidden)  # (B, T, D)
        return self.lm_head(self.drop(out)), LMState(hidden)

    def step(self, y: Tensor, state: LMState) -> tuple[Tensor, LMState]:
        """One step: tokens y (B,) -> logits (B, K) of the next ones (RecurrentDecoder's step)."""
        logits, state = self(y[:, None], state)
        return logits[:, 0], state


def gradient_norms(net: RNNLM, x: Tensor, y: Tensor) -> Tensor:
    """||dL_T / dz_n|| for n = 1..T: x, y (B, T) -> (T,), the norm for each sequence averaged
    over the batch. L_T is the loss of the last position and z_n the whole state after reading
    x_n: every layer's, an LSTM's h and c. Run the net in eval mode (no dropout)."""
    z, states = net.initial_state(len(x), x.device).hidden, []
    with torch.enable_grad():
        for n in range(x.size(1)):  # step by step: each z_n is a node of the graph
            _, z = net.rnn(net.tok_emb(x[:, n : n + 1]), z)
            states.append(z)
        top = (z[0] if isinstance(z, tuple) else z)[-1]  # z_T of the top layer: (B, D)
        # summed over the sequences, so that each one's gradient is that of its own L_T
        loss = F.cross_entropy(net.lm_head(top), y[:, -1], reduction="sum")
        flat = [t for z in states for t in (z if isinstance(z, tuple) else (z,))]
        # an LSTM's last c_T is unused: L_T reads h_T alone
        grads = torch.autograd.grad(loss, flat, allow_unused=True, materialize_grads=True)
    sq = torch.stack([g.pow(2).sum((0, 2)) for g in grads])  # (T * parts, B)
    return sq.view(x.size(1), -1, len(x)).sum(1).sqrt().mean(1)  # (T,)
