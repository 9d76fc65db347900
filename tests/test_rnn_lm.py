"""The recurrent language model (Bishop sec. 12.2.5-12.2.6): cells, truncated BPTT, generation
through the shared decoding strategies, the gradient-norm measurement, and a run of src.train."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from src.models.generation import GenerationConfig
from src.models.rnn_lm import RNNLMLitModule
from src.nn.rnn import gradient_norms
from tests.conftest import FAST, assert_ok, run_module

pytestmark = pytest.mark.usefixtures("one_thread")

K = 11
OPTIM = dict(lr=1e-3, betas=[0.9, 0.99], weight_decay=0.0, warmup_steps=1, decay_steps=10,
             min_lr=1e-4)  # fmt: skip


def model(cell: str = "gru", tbptt: int | None = None, **net) -> RNNLMLitModule:
    net = {"cell": cell, "d_model": 16, "n_layer": 2, **net}
    return RNNLMLitModule(net, OPTIM, vocab_size=K, tbptt=tbptt).eval()


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_each_cell_gives_next_token_logits_and_steps_as_it_reads_whole_blocks(seeded, cell):
    net = model(cell).net
    x = torch.randint(K, (3, 9))
    logits, state = net(x)
    assert logits.shape == (3, 9, K)
    parts = state.hidden if cell == "lstm" else (state.hidden,)
    assert [p.shape for p in parts] == [(2, 3, 16)] * len(parts)
    stepped, s = [], net.initial_state(3)
    for t in range(9):  # one token at a time, as generation reads them
        step_logits, s = net.step(x[:, t], s)
        stepped.append(step_logits)
    torch.testing.assert_close(torch.stack(stepped, 1), logits)


def test_unknown_cell_and_bad_window_are_errors():
    with pytest.raises(ValueError, match="unknown cell 'elman'"):
        model("elman")
    for bad in (0, -3, "16", True):
        with pytest.raises(ValueError, match="tbptt must be"):
            model(tbptt=bad)


def test_truncated_bptt_carries_the_state_and_cuts_the_gradient_at_each_window(seeded):
    """The loss of windows of 4 is the whole block's (the state's value is carried); its
    gradient is what a backward pass per window, from the detached state, accumulates."""
    full, cut = model("rnn"), model("rnn", tbptt=4)
    cut.load_state_dict(full.state_dict())
    batch = torch.randint(K, (2, 10)), torch.randint(K, (2, 10))  # windows 4, 4, 2
    loss_full, loss_cut = full._loss(batch), cut._loss(batch)
    torch.testing.assert_close(loss_cut, loss_full)
    loss_full.backward()
    loss_cut.backward()

    ref, state = model("rnn"), None
    ref.load_state_dict(full.state_dict())
    for t in range(0, 10, 4):
        logits, state = ref.net(batch[0][:, t : t + 4], state)
        window = F.cross_entropy(logits.flatten(0, 1), batch[1][:, t : t + 4].flatten(),
                                 reduction="sum") / 20  # fmt: skip
        window.backward()
        state = state.detach()
    u_full, u_cut, u_ref = (m.net.rnn.weight_hh_l0.grad for m in (full, cut, ref))
    torch.testing.assert_close(u_cut, u_ref)
    assert not torch.allclose(u_cut, u_full)  # the longer paths of full BPTT are missing


def test_generation_greedy_and_beam_are_deterministic_and_greedy_follows_the_forward(seeded):
    m = model("lstm")
    prompt = torch.randint(K, (2, 5))
    greedy = GenerationConfig(strategy="greedy", max_new_tokens=8, eos_id=None)
    out = m.generate(prompt, greedy)
    assert out.shape == (2, 13) and torch.equal(out[:, :5], prompt)
    assert torch.equal(m.generate(prompt, greedy), out)
    # every generated token is the argmax of the whole sequence's forward pass
    assert torch.equal(m(out[:, :-1])[:, 4:].argmax(-1), out[:, 5:])
    beam = GenerationConfig(strategy="beam", beam_width=3, max_new_tokens=8, eos_id=None)
    assert torch.equal(m.generate(prompt, beam), m.generate(prompt, beam))
    one = GenerationConfig(strategy="beam", beam_width=1, max_new_tokens=8, eos_id=None)
    assert torch.equal(m.generate(prompt, one), out)  # width 1 is greedy
    sample = GenerationConfig(strategy="sample", top_k=5, top_p=0.9, max_new_tokens=8)
    a, b = (m.generate(prompt, sample, generator=torch.Generator().manual_seed(1))
            for _ in range(2))  # fmt: skip
    assert torch.equal(a, b)


def test_gradient_norms_of_a_vanilla_rnn_decay_with_distance(seeded):
    net = model("rnn", n_layer=1).net
    x, y = torch.randint(K, (4, 30)), torch.randint(K, (4, 30))
    norms = gradient_norms(net, x, y)  # (T,), n = 1..T
    assert norms.shape == (30,)
    # at n = T: dL_T / dz_T = W_o^T (softmax(W_o z_T) - onehot(y_T)), by hand
    z = net(x)[1].hidden[-1]  # (B, D)
    p = F.softmax(net.lm_head(z), -1) - F.one_hot(y[:, -1], K)
    torch.testing.assert_close(norms[-1], (p @ net.lm_head.weight).norm(dim=1).mean())
    assert norms[0] < 1e-3 * norms[-1]  # vanishing: the product of 29 Jacobians
    assert (norms[1:] > norms[:-1]).float().mean() > 0.9  # larger the closer to T


def test_lstm_keeps_more_gradient_than_the_vanilla_rnn_at_initialisation(seeded):
    x, y = torch.randint(K, (4, 30)), torch.randint(K, (4, 30))
    decay = {c: (lambda g: g[0] / g[-1])(gradient_norms(model(c, n_layer=1).net, x, y))
             for c in ("rnn", "lstm")}  # fmt: skip
    assert decay["lstm"] > 100 * decay["rnn"]


def test_training_logs_the_language_model_metrics_and_plots_the_gradient_decay(
    tmp_path, shakespeare
):
    overrides = [o for o in FAST if not o.startswith("experiment=")]  # GPT's net keys
    proc = run_module(
        "src.train", *overrides, "model=rnn_lm", "data=shakespeare", f"data.path={shakespeare}",
        "data.batch_size=8", "data.splits=[0.8,0.1,0.1]", "trainer.limit_test_batches=2",
        "model.net.cell=lstm", "model.tbptt=16", "model.optim.lr=1e-2",
        "model.optim.warmup_steps=1", "logger=csv", f"hydra.run.dir={tmp_path}",
        f"paths.data_dir={tmp_path}/data",
        env={"OMP_NUM_THREADS": "1"},  # tiny tensors: see the one_thread fixture
    )  # fmt: skip
    assert_ok(proc)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert {"train/loss", "train/ppl", "train/lr", "val/loss", "val/ppl", "val/bits_per_token",
            "test/loss", "grad/decay_init", "grad/decay_final"} <= set(metrics)  # fmt: skip
    assert metrics["val/loss"] < math.log(65)  # below uniform over the characters
    assert 0 < metrics["grad/decay_init"] < 1
    assert (tmp_path / "gradient_norms.png").stat().st_size > 10_000
    assert "=== prompt" in (tmp_path / "samples.txt").read_text()
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["model_class"] == "src.models.rnn_lm.RNNLMLitModule"
