"""LoRA (sec. 12.3, Hu et al. 2021) on a tiny Transformer: the adapted model starts equal to the
base, training moves only A and B, merging W_0 + (alpha/R) A B changes no output."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from src.nn.lora import LoRALinear, add_lora, count_parameters, merge_lora
from src.nn.transformer import Transformer, TransformerConfig

D, N_LAYER, R = 16, 2, 4
ALL = ["w_q", "w_k", "w_v", "w_o", "mlp.0", "mlp.2"]

pytestmark = pytest.mark.usefixtures("seeded", "one_thread")


def make_stack() -> Transformer:
    return Transformer(TransformerConfig(n_layer=N_LAYER, n_head=2, d_model=D)).eval()


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def trained_lora(steps: int = 3):
    """A stack frozen as a fine-tuning module would, LoRA on every linear, a few AdamW steps.
    Returns the model, the pre-training copy of its weights and an input."""
    model = make_stack()
    model.requires_grad_(False)
    add_lora(model, ALL, rank=R, alpha=2.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, target = torch.randn(2, 5, D), torch.randn(2, 5, D)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = (model(x) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), before, x


def test_lora_model_equals_base_at_init():
    base = make_stack()
    model = copy.deepcopy(base)
    names = add_lora(model, ALL, rank=R, alpha=8.0)
    assert len(names) == N_LAYER * len(ALL)
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        assert torch.equal(model(x), base(x))  # B = 0: the update is exactly zero


def test_training_moves_only_lora_parameters():
    model, before, _ = trained_lora()
    after = model.state_dict()
    for k, v in after.items():
        if "lora_" in k:
            continue
        assert torch.equal(v, before[k]), k  # W_0, biases, LayerNorms bit-identical
    for name, m in lora_modules(model).items():
        assert not m.base.weight.requires_grad and not m.base.bias.requires_grad
        assert m.lora_b.abs().sum() > 0, name


def test_merge_lora_gives_plain_linears_with_the_same_outputs():
    model, _, x = trained_lora()
    names = list(lora_modules(model))
    merged = merge_lora(copy.deepcopy(model))
    assert not lora_modules(merged)
    for name in names:
        assert type(merged.get_submodule(name)) is nn.Linear
    with torch.no_grad():
        torch.testing.assert_close(merged(x), model(x), atol=1e-6, rtol=1e-5)


def test_targets_match_by_dotted_suffix():
    model = make_stack()
    names = add_lora(model, ["w_q", "w_v"], rank=2)
    assert names == sorted(f"layers.{i}.self_attn.w_{w}" for i in range(N_LAYER) for w in "qv")
    for layer in model.layers:
        wrapped = [n for n, m in layer.named_modules() if isinstance(m, LoRALinear)]
        assert wrapped == ["self_attn.w_q", "self_attn.w_v"]
    assert add_lora(make_stack(), ["mlp.0"], rank=2) == [f"layers.{i}.mlp.0" for i in range(2)]
    # a LoRALinear's frozen W_0 is not a candidate a second time
    with pytest.raises(ValueError, match="w_q"):
        add_lora(model, ["w_q"], rank=2)


@pytest.mark.parametrize("target", ["nope", "q"])  # "q" is a substring of "w_q", not a suffix
def test_unmatched_target_raises_with_its_name(target):
    with pytest.raises(ValueError, match=f"'{target}'"):
        add_lora(make_stack(), ["w_q", target], rank=2)


def test_rank_must_be_positive():
    with pytest.raises(ValueError, match="rank"):
        add_lora(make_stack(), ["w_q"], rank=0)
    with pytest.raises(ValueError, match="rank"):
        LoRALinear(nn.Linear(4, 4), rank=0)


def test_count_parameters():
    model = make_stack()
    _, total = count_parameters(model)
    model.requires_grad_(False)
    add_lora(model, ["w_q", "w_v"], rank=R)
    expected = N_LAYER * 2 * R * (D + D)
    assert count_parameters(model) == (expected, total + expected)
    shared = nn.Linear(3, 3)
    assert count_parameters(nn.Sequential(shared, shared)) == (12, 12)  # tied: counted once


def test_lora_linear_shape_and_scaling():
    base = nn.Linear(8, 5)
    layer = LoRALinear(base, rank=2, alpha=3.0)
    with torch.no_grad():
        layer.lora_b.normal_()
    x = torch.randn(2, 3, 8)
    y = layer(x)
    assert y.shape == (2, 3, 5)
    manual = x @ base.weight.T + base.bias + (3.0 / 2) * (x @ layer.lora_a @ layer.lora_b)
    torch.testing.assert_close(y, manual)
    torch.testing.assert_close(layer.merged()(x), y)
    assert "rank=2" in repr(layer)


def test_dropout_acts_on_the_lora_branch_only():
    base = nn.Linear(8, 5)
    layer = LoRALinear(base, rank=2, dropout=1.0).train()
    with torch.no_grad():
        layer.lora_b.normal_()
    x = torch.randn(4, 8)
    torch.testing.assert_close(layer(x), base(x))  # the branch is fully dropped, base(x) is not
