"""The maths of Bishop ch. 12 checked on tiny modules: attention (12.14, 12.19), masks, permutation
equivariance, causality, positional encodings (12.25), the layer's norms and MLP, and GPT."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from src.models.gpt import GPT, GPTConfig
from src.nn.attention import MultiHeadAttention, build_attention_mask, naive_attention
from src.nn.positional import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    positional_encoding,
)
from src.nn.transformer import Transformer, TransformerConfig, TransformerLayer

D, H, B, T = 16, 4, 3, 6
DT = torch.float64


pytestmark = pytest.mark.usefixtures("seeded", "one_thread")


def make_mha(**kw) -> MultiHeadAttention:
    return MultiHeadAttention(D, H, **kw).to(DT).eval()


def make_stack(norm_first: bool, n_layer: int = 2, **kw) -> Transformer:
    cfg = TransformerConfig(n_layer=n_layer, n_head=H, d_model=D, norm_first=norm_first, **kw)
    return Transformer(cfg).to(DT).eval()


def make_gpt(**kw) -> GPT:
    cfg = dict(n_layer=2, n_head=2, d_model=D, vocab_size=11, block_size=8, dropout=0.0)
    return GPT(GPTConfig(**{**cfg, **kw})).to(DT).eval()


def right_padding(lengths: list[int], t: int) -> Tensor:
    """(B, t) key padding mask, True after each sequence's length (nn.MultiheadAttention's rule)."""
    return torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None]


def influence(fn, x: Tensor) -> Tensor:
    """T x T matrix of |d (w_n . fn(x)[n]) / d x[m]| summed over features, for fn: (T, D) -> (T, K).

    A random projection w_n per output row needs T backward passes instead of T * K; it is zero
    exactly when d fn(x)[n] / d x[m] is, and non-zero otherwise with probability 1.
    """
    x = x.clone().requires_grad_()
    y = fn(x)
    w = torch.randn_like(y)
    rows = [
        torch.autograd.grad(y[n] @ w[n], x, retain_graph=True)[0].abs().sum(-1)
        for n in range(y.size(0))
    ]
    return torch.stack(rows)


# --- 1. the fast path (SDPA) equals the written-out softmax(QK^T/sqrt(D_k))V ----------------------

CASES = {
    "no_mask": dict(),
    "causal": dict(causal=True),
    "padding": dict(key_padding_mask=right_padding([6, 4, 2], T)),
    "causal+padding": dict(causal=True, key_padding_mask=right_padding([6, 3, 1], T)),
    "cross": dict(t_k=9),
    "cross+padding": dict(t_k=9, key_padding_mask=right_padding([9, 5, 2], 9)),
    "cross+causal": dict(t_k=9, causal=True),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", ["eval", "train_dropout0", "eval_dropout0.5"])
def test_fast_path_equals_naive(case: str, mode: str) -> None:
    """SDPA (fast path) and naive attention agree under every mask; dropout is off in eval."""
    kw = dict(CASES[case])
    t_k = kw.pop("t_k", None)
    fast = make_mha(dropout=0.5 if mode == "eval_dropout0.5" else 0.0)
    naive = make_mha(naive=True)
    naive.load_state_dict(fast.state_dict())
    if mode == "train_dropout0":
        fast.train()
        naive.train()
    x = torch.randn(B, T, D, dtype=DT)
    ctx = None if t_k is None else torch.randn(B, t_k, D, dtype=DT)

    y_fast, w_fast = fast(x, ctx, **kw)
    y_naive, w_naive = naive(x, ctx, **kw)
    y_weights, w = fast(x, ctx, **kw, need_weights=True)

    assert w_fast is None and w_naive is not None
    assert y_fast.shape == (B, T, D)
    assert w.shape == (B, H, T, t_k or T)
    torch.testing.assert_close(y_fast, y_naive)
    torch.testing.assert_close(y_fast, y_weights)


def test_naive_attention_is_eq_12_14() -> None:
    """naive_attention is softmax(Q K^T / sqrt(D_k)) V, computed here with explicit loops."""
    q, k, v = (torch.randn(1, 1, n, 3, dtype=DT) for n in (2, 4, 4))
    y, a = naive_attention(q, k, v)
    for n in range(2):
        s = torch.tensor([q[0, 0, n] @ k[0, 0, m] / math.sqrt(3) for m in range(4)])
        p = s.exp() / s.exp().sum()
        torch.testing.assert_close(a[0, 0, n], p.to(DT))
        torch.testing.assert_close(y[0, 0, n], (p.to(DT)[:, None] * v[0, 0]).sum(0))


@pytest.mark.parametrize("padding", [False, True])
def test_an_additive_bias_enters_the_scores_on_both_paths(padding: bool) -> None:
    """attn_bias (H, T, T) is added to Q K^T / sqrt(D_k) before the softmax, alone or with a
    padding mask, and SDPA's float mask gives what the reference path does."""
    m, x = make_mha(), torch.randn(B, T, D, dtype=DT)
    bias = torch.randn(H, T, T, dtype=DT)
    kpm = right_padding([6, 4, 1], T) if padding else None
    y_fast, _ = m(x, key_padding_mask=kpm, attn_bias=bias)
    y_naive, w = m(x, key_padding_mask=kpm, attn_bias=bias, need_weights=True)
    torch.testing.assert_close(y_fast, y_naive)
    q, k = m._split_heads(m.w_q(x)), m._split_heads(m.w_k(x))
    scores = q @ k.transpose(-2, -1) / math.sqrt(D // H) + bias
    if padding:
        scores = scores.masked_fill(kpm[:, None, None, :], float("-inf"))
    torch.testing.assert_close(w, scores.softmax(-1))


def test_d_model_must_divide_into_heads() -> None:
    """D is split into H heads of D/H features, so D % H must be 0."""
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3)


# --- 2. equal to torch.nn.MultiheadAttention with the same weights -----------------------------


def reference_mha(m: MultiHeadAttention) -> nn.MultiheadAttention:
    """nn.MultiheadAttention holding W_q, W_k, W_v stacked as in_proj and W_o as out_proj."""
    ref = nn.MultiheadAttention(D, H, batch_first=True, dtype=DT).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([m.w_q.weight, m.w_k.weight, m.w_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([m.w_q.bias, m.w_k.bias, m.w_v.bias]))
        ref.out_proj.weight.copy_(m.w_o.weight)
        ref.out_proj.bias.copy_(m.w_o.bias)
    return ref


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("naive", [False, True])
def test_matches_torch_multihead_attention(padding: bool, causal: bool, naive: bool) -> None:
    """Output and head-averaged weights equal nn.MultiheadAttention's (mask True = blocked)."""
    m = make_mha(naive=naive)
    ref = reference_mha(m)
    x = torch.randn(B, T, D, dtype=DT)
    kpm = right_padding([6, 4, 1], T) if padding else None
    blocked = ~build_attention_mask(T, T, causal=True) if causal else None

    y, _ = m(x, causal=causal, key_padding_mask=kpm)
    _, w = m(x, causal=causal, key_padding_mask=kpm, need_weights=True)
    y_ref, w_ref = ref(x, x, x, key_padding_mask=kpm, attn_mask=blocked, need_weights=True)
    _, w_heads = ref(x, x, x, key_padding_mask=kpm, attn_mask=blocked, average_attn_weights=False)

    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(w.mean(dim=1), w_ref)
    torch.testing.assert_close(w, w_heads)


def test_cross_attention_matches_torch_multihead_attention() -> None:
    """Queries from x, keys and values from a longer context: nn.MultiheadAttention(x, c, c)."""
    m = make_mha()
    x, c = torch.randn(B, T, D, dtype=DT), torch.randn(B, 9, D, dtype=DT)
    kpm = right_padding([9, 7, 3], 9)
    y_ref, w_ref = reference_mha(m)(x, c, c, key_padding_mask=kpm)
    torch.testing.assert_close(m(x, c, key_padding_mask=kpm)[0], y_ref)
    torch.testing.assert_close(m(x, c, key_padding_mask=kpm, need_weights=True)[1].mean(1), w_ref)


# --- 3. attention weights are a distribution over the visible keys ----------------------------


def test_weight_rows_sum_to_one_and_vanish_at_masked_keys() -> None:
    """Each row of A sums to 1; A is exactly 0 at padded keys and at future positions m > n."""
    m = make_mha()
    x = torch.randn(B, T, D, dtype=DT)
    lengths = [6, 4, 2]
    kpm = right_padding(lengths, T)

    _, w = m(x, need_weights=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T, dtype=DT))
    assert (w > 0).all()  # softmax never gives exact zeros without a mask

    _, w = m(x, causal=True, key_padding_mask=kpm, need_weights=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T, dtype=DT))
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)  # (n, m) with m > n
    assert (w[:, :, future] == 0).all()
    assert (w[..., 0] > 0).all()  # key 0 is neither padding nor in any query's future
    for b, n in enumerate(lengths):
        assert (w[b, :, :, n:] == 0).all()


def test_causal_mask_for_cross_attention_aligns_last_query_with_last_key() -> None:
    """With T_q < T_k the causal mask is offset: query n sees keys m <= n + T_k - T_q."""
    mask = build_attention_mask(2, 4, causal=True)
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]
    assert build_attention_mask(3, 3) is None


# --- 4. permutation equivariance (why positions must be encoded) ------------------------------


def test_attention_is_permutation_equivariant() -> None:
    """Without positions, permuting the tokens (and their padding flags) permutes the outputs."""
    m = make_mha()
    x = torch.randn(B, T, D, dtype=DT)
    kpm = right_padding([6, 4, 2], T)
    perm = torch.randperm(T)
    torch.testing.assert_close(m(x[:, perm])[0], m(x)[0][:, perm])
    torch.testing.assert_close(
        m(x[:, perm], key_padding_mask=kpm[:, perm])[0], m(x, key_padding_mask=kpm)[0][:, perm]
    )


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_transformer_stack_is_permutation_equivariant(norm_first: bool) -> None:
    """A bidirectional stack (attention, per-token MLP and LayerNorm) commutes with permutations."""
    stack = make_stack(norm_first, activation="relu")
    x = torch.randn(B, T, D, dtype=DT)
    perm = torch.randperm(T)
    torch.testing.assert_close(stack(x[:, perm]), stack(x)[:, perm])


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_positional_encoding_breaks_permutation_equivariance(kind: str) -> None:
    """Adding r_n to token n makes the output depend on order (sanity check for the test above)."""
    stack = make_stack(norm_first=True)
    pe = positional_encoding(kind, D, T).to(DT)
    x = torch.randn(B, T, D, dtype=DT)
    perm = torch.arange(T).flip(0)
    r = pe(torch.arange(T))
    assert not torch.allclose(stack(x[:, perm] + r), stack(x + r)[:, perm], atol=1e-4)


def test_causal_attention_is_not_permutation_equivariant() -> None:
    """The causal mask itself encodes order: reversing the tokens does not reverse the outputs."""
    m = make_mha()
    x = torch.randn(B, T, D, dtype=DT)
    perm = torch.arange(T).flip(0)
    assert not torch.allclose(m(x[:, perm], causal=True)[0], m(x, causal=True)[0][:, perm])


# --- 5. the causal mask: output n never depends on inputs m > n --------------------------------


def assert_causal(infl: Tensor) -> None:
    """infl[n, m] = |d y_n / d x_m|: exactly 0 above the diagonal, non-zero on and below it."""
    future = torch.ones_like(infl, dtype=torch.bool).triu(diagonal=1)
    assert (infl[future] == 0).all(), infl
    assert (infl[~future] > 0).all(), infl


@pytest.mark.parametrize("naive", [False, True], ids=["sdpa", "naive"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_causal_stack_blocks_gradients_from_the_future(norm_first: bool, naive: bool) -> None:
    """Through a causal stack, d y_n / d x_m = 0 exactly for m > n and is non-zero for m <= n."""
    stack = make_stack(norm_first, naive_attention=naive)
    x = torch.randn(T, D, dtype=DT)
    assert_causal(influence(lambda e: stack(e[None], causal=True)[0], x))


@pytest.mark.parametrize("pos", ["none", "learned", "sinusoidal"])
def test_gpt_logits_ignore_future_tokens(pos: str) -> None:
    """GPT's logits at n depend on the token embeddings at m <= n only, for each positional kind."""
    gpt = make_gpt(pos_encoding=pos)
    idx = torch.randint(0, 11, (1, T))
    emb = gpt.tok_emb(idx)[0].detach()

    def logits_from_embeddings(e: Tensor) -> Tensor:  # (T, D) -> (T, K)
        handle = gpt.tok_emb.register_forward_hook(lambda mod, inp, out: e[None])
        try:
            return gpt(idx)[0]
        finally:
            handle.remove()

    torch.testing.assert_close(logits_from_embeddings(emb), gpt(idx)[0])
    assert_causal(influence(logits_from_embeddings, emb))


def test_gpt_prefix_logits_do_not_change_when_tokens_are_appended() -> None:
    """p(x_n | x_<n) is the same whatever follows: logits of a prefix equal the full sequence's."""
    gpt = make_gpt()
    idx = torch.randint(0, 11, (2, 8))
    torch.testing.assert_close(gpt(idx[:, :5]), gpt(idx)[:, :5])


# --- 6. positional encodings (sec. 12.1.9) ----------------------------------------------------


def book_sinusoid(n_pos: int, d: int, base: float) -> Tensor:
    """Eq. (12.25) element by element: sin(n / L^(i/D)) for even i, cos(n / L^((i-1)/D)) for odd."""
    r = torch.empty(n_pos, d, dtype=DT)
    for n in range(n_pos):
        for i in range(d):
            r[n, i] = (
                math.sin(n / base ** (i / d)) if i % 2 == 0 else math.cos(n / base ** ((i - 1) / d))
            )
    return r


@pytest.mark.parametrize("d", [8, 7], ids=["even_D", "odd_D"])
@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_sinusoidal_matches_book_formula(d: int, base: float) -> None:
    """The buffer equals eq. (12.25) computed independently, for even and odd D and any base L."""
    pe = SinusoidalPositionalEncoding(d, 200, base=base)
    assert pe.r.shape == (200, d)
    torch.testing.assert_close(pe.r.to(DT), book_sinusoid(200, d, base), atol=5e-5, rtol=0)
    pos = torch.tensor([5, 0, 199, 5])
    torch.testing.assert_close(pe(pos), pe.r[pos])


def test_sinusoidal_codes_are_distinct_and_bounded() -> None:
    """Every one of 512 positions gets its own vector (all pairwise distances > 0), in [-1, 1]."""
    r = SinusoidalPositionalEncoding(64, 512).r.to(DT)
    dist = torch.cdist(r, r)
    off_diagonal = ~torch.eye(512, dtype=torch.bool)
    assert dist[off_diagonal].min() > 1e-2
    assert r.abs().max() <= 1.0
    torch.testing.assert_close(r[0], torch.tensor([0.0, 1.0] * 32, dtype=DT))  # sin 0, cos 0


def test_sinusoidal_base_is_configurable() -> None:
    """The wavelength constant L changes the code, through the class, the factory and GPTConfig."""
    default = SinusoidalPositionalEncoding(16, 32).r
    short = SinusoidalPositionalEncoding(16, 32, base=100.0).r
    assert not torch.allclose(default, short)
    torch.testing.assert_close(positional_encoding("sinusoidal", 16, 32, base=100.0).r, short)
    cfg = dict(d_model=16, n_head=2, n_layer=1, block_size=32, pos_encoding="sinusoidal")
    gpt = GPT(GPTConfig(**cfg, pos_base=100.0))
    torch.testing.assert_close(gpt.pos_enc.r, short)


def test_sinusoidal_is_a_buffer_and_learned_is_trainable() -> None:
    """The sinusoid has no parameters; the learned code has a (max_len, D) table that gets grads."""
    sin = SinusoidalPositionalEncoding(D, T)
    assert list(sin.parameters()) == [] and "r" not in sin.state_dict()
    learned = LearnedPositionalEncoding(D, T)
    params = list(learned.parameters())
    assert len(params) == 1 and params[0].shape == (T, D) and params[0].requires_grad
    learned(torch.arange(3)).sum().backward()
    assert params[0].grad[:3].abs().sum() > 0 and (params[0].grad[3:] == 0).all()


def test_positional_encoding_factory() -> None:
    """The factory builds "sinusoidal" and "learned", gives None for "none", raises otherwise."""
    assert isinstance(positional_encoding("sinusoidal", D, T), SinusoidalPositionalEncoding)
    assert isinstance(positional_encoding("learned", D, T), LearnedPositionalEncoding)
    assert positional_encoding("none", D, T) is None
    with pytest.raises(ValueError, match="unknown positional encoding"):
        positional_encoding("rotary", D, T)


# --- 7. the Transformer layer: residuals, LayerNorm placement, MLP ----------------------------


def normalised(y: Tensor) -> bool:
    """Every position has mean 0 and (biased) std 1 over its D features, up to LayerNorm's eps."""
    mean, std = y.mean(-1), y.std(-1, unbiased=False)
    return torch.allclose(mean, torch.zeros_like(mean), atol=1e-8) and torch.allclose(
        std, torch.ones_like(std), atol=1e-3
    )


def test_post_norm_layer_is_eqs_12_20_to_12_22() -> None:
    """Post-norm: Z = LN(Y(X) + X), X~ = LN(MLP(Z) + Z); the output is normalised per position."""
    cfg = TransformerConfig(n_head=H, d_model=D, norm_first=False, activation="relu")
    layer = TransformerLayer(cfg).to(DT).eval()
    x = 3 * torch.randn(B, T, D, dtype=DT) + 1
    z = layer.norm1(layer.self_attn(x)[0] + x)
    torch.testing.assert_close(layer(x), layer.norm2(layer.mlp(z) + z))
    assert normalised(layer(x))


def test_pre_norm_layer_and_stack_end_with_final_layernorm() -> None:
    """Pre-norm: Z = X + Y(LN(X)); one layer's output is not normalised, but the stack's is."""
    cfg = TransformerConfig(n_layer=2, n_head=H, d_model=D, norm_first=True)
    layer = TransformerLayer(cfg).to(DT).eval()
    x = 3 * torch.randn(B, T, D, dtype=DT) + 1
    z = x + layer.self_attn(layer.norm1(x))[0]
    torch.testing.assert_close(layer(x), z + layer.mlp(layer.norm2(z)))
    assert not normalised(layer(x))

    stack = make_stack(norm_first=True)
    assert isinstance(stack.norm, nn.LayerNorm)
    h = x
    for each in stack.layers:
        h = each(h)
    torch.testing.assert_close(stack(x), stack.norm(h))
    assert normalised(stack(x))
    post = make_stack(norm_first=False)
    assert isinstance(post.norm, nn.Identity) and normalised(post(x))


def test_mlp_width_and_activation() -> None:
    """Hidden width is 4 D unless d_ff is set; relu/gelu are selectable; others raise."""
    for act, cls in [("relu", nn.ReLU), ("gelu", nn.GELU)]:
        mlp = TransformerLayer(TransformerConfig(d_model=D, n_head=H, activation=act)).mlp
        assert (mlp[0].in_features, mlp[0].out_features) == (D, 4 * D)
        assert (mlp[2].in_features, mlp[2].out_features) == (4 * D, D)
        assert isinstance(mlp[1], cls)
    mlp = TransformerLayer(TransformerConfig(d_model=D, n_head=H, d_ff=24)).mlp
    assert mlp[0].out_features == 24 and mlp[2].in_features == 24
    with pytest.raises(ValueError, match="unknown activation"):
        TransformerLayer(TransformerConfig(d_model=D, n_head=H, activation="swishy"))


def test_attention_dropout_defaults_to_dropout_and_can_be_set_apart() -> None:
    layer = TransformerLayer(TransformerConfig(d_model=D, n_head=H, dropout=0.1), True)
    assert layer.self_attn.dropout == layer.cross_attn.dropout == 0.1
    cfg = TransformerConfig(d_model=D, n_head=H, dropout=0.1, attn_dropout=0.0)
    layer = TransformerLayer(cfg, cross_attention=True)
    assert layer.self_attn.dropout == layer.cross_attn.dropout == 0.0
    assert layer.dropout.p == layer.mlp[3].p == 0.1  # the residual branches keep theirs


# --- 8. GPT --------------------------------------------------------------------------------


def test_gpt_shape_and_weight_tying() -> None:
    """Logits are (B, T, K); lm_head shares tok_emb's matrix unless tie_weights=False."""
    tied, untied = make_gpt(), make_gpt(tie_weights=False)
    idx = torch.randint(0, 11, (B, T))
    assert tied(idx).shape == (B, T, 11)
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert untied.lm_head.weight is not untied.tok_emb.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == 11 * D


def test_gpt_rejects_sequences_longer_than_block_size() -> None:
    """A learned table has block_size rows, so T > block_size is an error; T = block_size works."""
    gpt = make_gpt(block_size=8)
    assert gpt(torch.randint(0, 11, (1, 8))).shape == (1, 8, 11)
    with pytest.raises(ValueError, match="block_size"):
        gpt(torch.randint(0, 11, (1, 9)))


def test_next_token_logits_is_last_row_and_crops_context() -> None:
    """next_token_logits(idx) = forward(idx)[:, -1], using only the last block_size tokens."""
    gpt = make_gpt(block_size=8)
    idx = torch.randint(0, 11, (B, 5))
    torch.testing.assert_close(gpt.next_token_logits(idx), gpt(idx)[:, -1])
    torch.testing.assert_close(gpt(idx, last_only=True), gpt(idx)[:, -1:])
    long = torch.randint(0, 11, (B, 13))
    torch.testing.assert_close(gpt.next_token_logits(long), gpt(long[:, -8:])[:, -1])
    assert gpt.next_token_logits(long).shape == (B, 11)
