"""BERT (sec. 12.3.3): the masked-LM corruption, padding, bidirectionality, loading a pre-trained
encoder for fine-tuning, and LoRA fine-tuning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from src.models.bert import (
    CLS_ID,
    IGNORE,
    MASK_ID,
    N_SPECIAL,
    PAD_ID,
    BertClassifier,
    BertMLM,
    mask_tokens,
)
from src.nn.attention import record_attention
from src.nn.lora import LoRALinear, count_parameters
from src.utils.errors import PipelineError

V = 50
NET = dict(n_layer=2, n_head=2, d_model=16, block_size=24, dropout=0.0)
OPTIM = dict(lr=1e-2, betas=[0.9, 0.99], weight_decay=0.0, warmup_steps=1, decay_steps=10,
             min_lr=1e-3)  # fmt: skip
LORA = dict(rank=2, alpha=4.0, targets=["w_q", "w_v"])


@pytest.fixture(autouse=True)
def _seed(one_thread):
    torch.manual_seed(0)


def classifier(**kw) -> BertClassifier:
    return BertClassifier(NET, OPTIM, vocab_size=V, num_classes=3, **kw).eval()


def random_ids(b: int, t: int) -> torch.Tensor:
    ids = torch.randint(N_SPECIAL, V, (b, t))
    ids[:, 0] = CLS_ID
    return ids


# ---------------------------------------------------------------- masked-LM corruption


def test_masking_proportions_hold_on_a_large_batch():
    ids = random_ids(256, 512)
    ids[:, -50:] = PAD_ID
    g = torch.Generator().manual_seed(1)
    inputs, targets = mask_tokens(ids, V, generator=g)
    chosen = targets != IGNORE
    ordinary = ids >= N_SPECIAL
    n = chosen.sum().item()
    assert not chosen[~ordinary].any()  # never <cls> or <pad>
    assert abs(n / ordinary.sum().item() - 0.15) < 0.005
    assert torch.equal(targets[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])  # only chosen tokens are corrupted
    masked = (inputs[chosen] == MASK_ID).float().mean().item()
    kept = (inputs[chosen] == ids[chosen]).float().mean().item()
    changed = ((inputs[chosen] != MASK_ID) & (inputs[chosen] != ids[chosen])).float().mean().item()
    # a random replacement equals the original with probability 1 / (V - N_SPECIAL)
    p_same = 1 / (V - N_SPECIAL)
    assert abs(masked - 0.8) < 0.01
    assert abs(kept - (0.1 + 0.1 * p_same)) < 0.01
    assert abs(changed - 0.1 * (1 - p_same)) < 0.01
    assert inputs[chosen & (inputs != MASK_ID)].min() >= N_SPECIAL  # random tokens are ordinary


def test_mlm_loss_only_at_chosen_positions():
    model = BertMLM(NET, OPTIM, vocab_size=V)
    ids = random_ids(4, 24)
    g = torch.Generator().manual_seed(0)
    loss, _ = model._step({"input_ids": ids}, g)
    inputs, targets = mask_tokens(ids, V, generator=torch.Generator().manual_seed(0))
    logits = model(inputs)
    chosen = targets != IGNORE
    expected = torch.nn.functional.cross_entropy(logits[chosen], targets[chosen])
    assert torch.allclose(loss, expected)


def test_language_model_windows_start_with_cls():
    from src.models.bert import as_ids

    x = random_ids(2, 8)
    x[:, 0] = 17
    assert (as_ids((x, x))[:, 0] == CLS_ID).all() and (x[:, 0] == 17).all()  # x untouched


# ---------------------------------------------------------------- encoder


def test_padding_gets_no_attention_and_does_not_change_the_outputs():
    model = classifier(task="tag")
    ids = random_ids(1, 10)
    padded = torch.cat([ids, torch.full((1, 6), PAD_ID)], dim=1)
    with torch.no_grad(), record_attention(model) as maps:
        out = model(padded)
    assert torch.allclose(out[:, :10], model(ids), atol=1e-5)
    for weights in maps:  # (1, H, T, T): no query attends to a padded key
        assert (weights[..., 10:] == 0).all()


def test_mean_pooling_reads_the_real_tokens_only():
    model = classifier(pool="mean")
    ids = random_ids(1, 10)
    padded = torch.cat([ids, torch.full((1, 6), PAD_ID)], dim=1)
    with torch.no_grad():
        assert torch.allclose(model(padded), model(ids), atol=1e-5)  # (1, C)
        h = model.net.hidden(ids)  # (1, T, D)
        assert torch.allclose(model(ids), model.head(h.mean(1)), atol=1e-5)
    with pytest.raises(PipelineError, match=r"model\.pool='max'"):
        classifier(pool="max")


def test_tagger_loss_ignores_padded_positions():
    model = classifier(task="tag")
    ids = torch.cat([random_ids(2, 10), torch.full((2, 4), PAD_ID)], dim=1)
    labels = torch.randint(0, 3, ids.shape).masked_fill(ids == PAD_ID, IGNORE)
    loss, logits, flat = model._step({"input_ids": ids, "labels": labels})
    keep = flat != IGNORE
    assert keep.sum() == 20
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(logits[keep], flat[keep]))


def test_encoder_is_bidirectional():
    """The output at position 2 depends on a later token (GPT's would not)."""
    model = classifier(task="tag")
    ids = random_ids(1, 12)
    later = ids.clone()
    later[0, 9] = (ids[0, 9] - N_SPECIAL + 1) % (V - N_SPECIAL) + N_SPECIAL
    with torch.no_grad():
        assert not torch.allclose(model(ids)[0, 2], model(later)[0, 2])


def test_task_and_labels_must_agree():
    ids = random_ids(2, 8)
    with pytest.raises(PipelineError, match="bert_tagger"):
        classifier(task="cls")._step({"input_ids": ids, "labels": torch.zeros_like(ids)})


# ---------------------------------------------------------------- from a pre-trained encoder


def save_checkpoint(module, path):
    """What Lightning writes, as far as fine-tuning reads it."""
    ckpt = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, path)
    return path


def test_fine_tuning_starts_from_the_pretrained_encoder(tmp_path):
    mlm = BertMLM(NET, OPTIM, vocab_size=V)
    path = save_checkpoint(mlm, tmp_path / "mlm.ckpt")
    fine = classifier(pretrained=str(path))
    for name, p in mlm.net.state_dict().items():
        assert torch.equal(fine.net.state_dict()[name], p), name


def test_pretrained_checkpoint_of_another_model_or_shape(tmp_path):
    other = save_checkpoint(classifier(), tmp_path / "cls.ckpt")
    with pytest.raises(PipelineError, match=r"not a src\.models\.bert\.BertMLM"):
        classifier(pretrained=str(other))
    small_vocab = save_checkpoint(BertMLM(NET, OPTIM, vocab_size=V - 1), tmp_path / "mlm.ckpt")
    with pytest.raises(PipelineError, match="does not fit"):
        classifier(pretrained=str(small_vocab))


# ---------------------------------------------------------------- LoRA fine-tuning


def test_lora_trains_only_adapters_and_head_and_merges_exactly():
    model = classifier(lora=LORA).train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n or n.startswith("head.") for n in trainable)
    n_lora = NET["n_layer"] * 2 * LORA["rank"] * (16 + 16)
    assert count_parameters(model)[0] == n_lora + 16 * 3 + 3

    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = {"input_ids": random_ids(8, 12), "labels": torch.randint(0, 3, (8,))}
    for _ in range(3):
        opt.zero_grad()
        model._step(batch)[0].backward()
        opt.step()
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)

    model.eval()
    with torch.no_grad():
        before = model(batch["input_ids"])
        merged = model.merged()
        assert not any(isinstance(m, LoRALinear) for m in merged.modules())
        assert torch.allclose(merged(batch["input_ids"]), before, atol=1e-5)


def test_lora_trains_at_its_own_learning_rate():
    opt = classifier(lora={**LORA, "lr": 3e-3}).configure_optimizers()["optimizer"]
    assert opt.defaults["lr"] == 3e-3
    assert classifier(lora={**LORA, "lr": None}).hparams.optim["lr"] == OPTIM["lr"]
    assert classifier(lora={**LORA, "rank": 0, "lr": 3e-3}).hparams.optim["lr"] == OPTIM["lr"]


def test_lora_at_initialisation_equals_the_base_model():
    base = classifier()
    torch.manual_seed(0)  # the same W_0 and head: the adapters are drawn after them
    lora = classifier(lora=LORA)
    ids = random_ids(3, 10)
    with torch.no_grad():
        assert torch.equal(lora(ids), base(ids))


# ---------------------------------------------------------------- the chain, as a user runs it

TINY = ["model.net.n_layer=1", "model.net.d_model=16", "model.net.n_head=2", "data.batch_size=8",
        "data.block_size=32", "callbacks.progress_bar.refresh_rate=0", "logger=csv"]  # fmt: skip


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, shakespeare):
    """Prepare the speaker task, then pre-train on its corpus for a few steps."""
    from tests.conftest import assert_ok, run_module

    root = tmp_path_factory.mktemp("bert")
    data = [f"paths.data_dir={root / 'data'}"]  # tiny Shakespeare from the mirror
    assert_ok(run_module("src.prepare", "data=text_cls", *data))
    run = root / "pretrain"
    assert_ok(run_module("src.train", "experiment=bert_pretrain_speakers", *TINY,
                         f"paths.data_dir={root / 'data'}", "trainer.max_steps=6",
                         "data.steps_per_epoch=3", "trainer.limit_val_batches=2",
                         f"hydra.run.dir={run}"))  # fmt: skip
    return root, data, run / "checkpoints" / "last.ckpt"


def test_pretraining_logs_masked_accuracy(pretrained):
    import json

    metrics = json.loads((pretrained[2].parents[1] / "metrics.json").read_text())
    assert {"train/loss", "train/masked_acc", "val/loss", "val/masked_acc"} <= set(metrics)
    ckpt = torch.load(pretrained[2], weights_only=True)
    assert ckpt["model_class"] == "src.models.bert.BertMLM"


def finetune(pretrained, *extra: str) -> Path:
    """The run dir of a short fine-tuning from the pre-trained checkpoint (run once per module)."""
    from tests.conftest import assert_ok, run_module

    root, data, ckpt = pretrained
    run = root / ("finetune" + "".join(f"-{e.replace('=', '_')}" for e in extra))
    if not (run / "metrics.json").exists():
        assert_ok(run_module("src.train", "experiment=bert_finetune_speakers", *TINY, *data, *extra,
                             f"model.pretrained={ckpt}", "trainer.max_steps=4",
                             "trainer.limit_train_batches=2", "trainer.limit_val_batches=2",
                             "trainer.limit_test_batches=2", f"hydra.run.dir={run}"))  # fmt: skip
    return run


@pytest.mark.parametrize("lora", [False, True])
def test_fine_tuning_from_the_pretrained_checkpoint(pretrained, lora):
    import json

    run = finetune(pretrained, *(["model.lora.rank=2"] if lora else []))
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"val/acc", "val/f1", "test/acc", "test/f1", "params/trainable"} <= set(metrics)
    assert (metrics["params/fraction"] < 0.2) == lora


def test_merge_lora_cli_writes_a_plain_checkpoint_with_the_same_outputs(pretrained, tmp_path):
    from src.utils.checkpoint import load_checkpoint
    from tests.conftest import assert_ok, assert_one_error_line, run_module

    lora_ckpt = finetune(pretrained, "model.lora.rank=2") / "checkpoints" / "last.ckpt"
    out = tmp_path / "merged.ckpt"
    proc = run_module("src.merge_lora", f"ckpt={lora_ckpt}", f"out={out}")
    assert_ok(proc)
    assert "max |merged - unmerged|" in proc.stdout

    def restore(path) -> BertClassifier:
        ckpt = load_checkpoint(path, expected_class="src.models.bert.BertClassifier")
        model = BertClassifier(**dict(ckpt["hyper_parameters"], pretrained=None))
        model.load_state_dict(ckpt["state_dict"])
        return model.eval()

    merged, adapted = restore(out), restore(lora_ckpt)
    assert not any(isinstance(m, LoRALinear) for m in merged.modules())
    assert count_parameters(merged)[1] < count_parameters(adapted)[1]
    ids = random_ids(3, 20)
    with torch.no_grad():
        assert torch.allclose(merged(ids), adapted(ids), atol=1e-5)

    # the merged file is never overwritten; a checkpoint without adapters is one error line
    assert_one_error_line(run_module("src.merge_lora", f"ckpt={lora_ckpt}", f"out={out}"), "exists")
    plain = finetune(pretrained) / "checkpoints" / "last.ckpt"
    proc = run_module("src.merge_lora", f"ckpt={plain}", f"out={tmp_path / 'x.ckpt'}")
    assert_one_error_line(proc, "without LoRA")


def test_fine_tuning_from_a_gpt_checkpoint_is_one_error_line(pretrained, tmp_path):
    from tests.conftest import assert_one_error_line, run_module

    _, data, ckpt = pretrained
    state = torch.load(ckpt, weights_only=True)
    state["model_class"] = "src.models.gpt.GPTLitModule"
    torch.save(state, tmp_path / "gpt.ckpt")
    proc = run_module("src.train", "experiment=bert_finetune_speakers", *TINY, *data,
                      f"model.pretrained={tmp_path / 'gpt.ckpt'}",
                      f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert_one_error_line(proc, "holds a src.models.gpt.GPTLitModule, not a")


def test_fine_tuning_data_is_encoded_with_the_pretrained_tokenizer(pretrained, tmp_path):
    """Another split would train another BPE of the same size; with model.pretrained the data
    is encoded with the encoder's own tokenizer instead. A tokenizer file given explicitly that
    contradicts the checkpoint is one error line saying which setting to drop."""
    from src.data.text import checkpoint_tokenizer, load_tokenizer
    from src.utils.checkpoint import load_checkpoint
    from tests.conftest import assert_ok, assert_one_error_line, run_module

    _, data, ckpt = pretrained
    other = [f"paths.data_dir={tmp_path / 'data'}", "data.split_seed=1"]
    run = tmp_path / "run"
    assert_ok(run_module("src.train", "experiment=bert_finetune_speakers", *TINY, *other,
                         "trainer.max_steps=2", "test=false", f"model.pretrained={ckpt}",
                         f"hydra.run.dir={run}"))  # fmt: skip
    (folder,) = (tmp_path / "data" / "processed").glob("shakespeare_speakers-cls-*")
    used = load_tokenizer((folder / "tokenizer.json").read_text()).to_str()
    assert (
        used
        == checkpoint_tokenizer(load_checkpoint(ckpt))
        == checkpoint_tokenizer(load_checkpoint(run / "checkpoints/last.ckpt"))
    )

    assert_ok(run_module("src.prepare", "data=text_cls", *other, "data.vocab_size=300"))
    (foreign,) = (tmp_path / "data" / "processed").glob("*-bpe300")
    proc = run_module("src.train", "experiment=bert_finetune_speakers", *TINY, *data,
                      f"data.tokenizer_file={foreign / 'tokenizer.json'}",
                      f"model.pretrained={ckpt}", f"hydra.run.dir={tmp_path / 'bad'}")  # fmt: skip
    assert_one_error_line(
        proc, "is not the tokenizer the pre-trained encoder", "drop data.tokenizer_file"
    )


def test_pretrain_on_a_text_file_then_fine_tune_on_a_csv(tmp_path, shakespeare):
    """A user's workflow through the entry point: masked-LM pre-training on their own text file
    (data=text, BPE 512), then fine-tuning, fully and with LoRA, on their own CSV with
    model.pretrained: the CSV is encoded with the encoder's tokenizer, and the encoder's shape
    (here other than model.net's defaults) comes from the checkpoint."""
    from src.data.text import checkpoint_tokenizer
    from src.utils.checkpoint import load_checkpoint
    from tests.conftest import assert_ok, run_module

    text = shakespeare.read_text(encoding="utf-8")[:150_000]
    (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
    lines = [ln for ln in text.splitlines() if len(ln) > 10][:300]
    rows = [f'"{ln.replace(chr(34), "")}",{"long" if len(ln) > 35 else "short"}' for ln in lines]
    (tmp_path / "labels.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    common = [f"paths.data_dir={tmp_path / 'data'}", "callbacks.progress_bar.refresh_rate=0",
              "logger=csv", "trainer.max_steps=4", "trainer.limit_val_batches=2"]  # fmt: skip
    pre = tmp_path / "pre"
    assert_ok(run_module("src.train", "model=bert", "data=text", f"data.path={tmp_path}/corpus.txt",
                         "data.vocab_size=512", "data.steps_per_epoch=2", "data.block_size=32",
                         "model.net.n_layer=1", "model.net.d_model=32", "model.net.n_head=2",
                         "test=false", *common, f"hydra.run.dir={pre}"))  # fmt: skip
    ckpt = pre / "checkpoints" / "last.ckpt"
    for rank in (0, 4):
        run = tmp_path / f"fine-lora{rank}"
        assert_ok(run_module("src.train", "model=bert_cls", "data=text_cls",
                             f"data.path={tmp_path}/labels.csv", f"model.pretrained={ckpt}",
                             f"model.lora.rank={rank}", "data.block_size=32", *common,
                             f"hydra.run.dir={run}"))  # fmt: skip
        fine = load_checkpoint(run / "checkpoints" / "last.ckpt")
        assert fine["hyper_parameters"]["net"]["d_model"] == 32
        assert (
            fine["hyper_parameters"]["vocab_size"]
            == load_checkpoint(ckpt)["hyper_parameters"]["vocab_size"]
        )
        assert checkpoint_tokenizer(
            load_checkpoint(run / "checkpoints" / "last.ckpt")
        ) == checkpoint_tokenizer(load_checkpoint(ckpt))
        assert "test/acc" in (run / "metrics.json").read_text()
