"""Translation (sec. 12.3.5): reading and splitting sentence pairs, the batches, the
encoder-decoder's masks, cached decoding, the RNN encoder-decoder beside the Transformer, the
scores, and runs through the entry point."""

from __future__ import annotations

import json

import pytest
import torch

from src.data.translation import (
    EOS_ID,
    IGNORE,
    collate_pairs,
    number_pairs,
    read_pairs,
    split_by_source,
)
from src.models.generation import GenerationConfig
from src.models.seq2seq import Seq2SeqLitModule, corpus_scores
from src.utils.errors import PipelineError
from tests.conftest import assert_ok, assert_one_error_line, run_module

NET = dict(n_layer=2, n_head=2, d_model=16, block_size=12, dropout=0.0)
RNN = dict(arch="rnn", d_model=16, block_size=12, dropout=0.0)
NETS = {"transformer": NET, "rnn": RNN, "rnn-attention": {**RNN, "attention": True},
        "lstm-2-attention": {**RNN, "cell": "lstm", "n_layer": 2, "attention": True}}  # fmt: skip
OPTIM = dict(lr=1e-3, betas=[0.9, 0.98], weight_decay=0.0, warmup_steps=1, decay_steps=10,
             min_lr=1e-5)  # fmt: skip


@pytest.fixture(autouse=True)
def _seed(one_thread):
    torch.manual_seed(0)


# ---------------------------------------------------------------- pairs


def test_pairs_are_read_with_extra_columns_ignored(tmp_path):
    f = tmp_path / "p.tsv"
    f.write_text("Hi.\tHoi.\tCC-BY 2.0 (France) Attribution\n\nRun!\tRen!\n", encoding="utf-8")
    assert read_pairs(f) == [("Hi.", "Hoi."), ("Run!", "Ren!")]


@pytest.mark.parametrize(
    "content, match",
    [
        ("Hi.\tHoi.\nno tab here\n", "line 2: 'no tab here'"),
        ("Hi.\t\n", "both sides non-empty, first at line 1"),
        ("\n\n", "holds no sentence pairs"),
        (b"Caf\xe9\tCaf\xe9\n", "not UTF-8"),
    ],
)
def test_bad_pair_files_are_one_clear_error(tmp_path, content, match):
    f = tmp_path / "p.tsv"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(PipelineError, match=match):
        read_pairs(f)
    with pytest.raises(PipelineError, match="not found"):
        read_pairs(tmp_path / "missing.tsv")


def test_no_source_sentence_is_in_two_splits():
    pairs = [(f"s{i % 50}", f"t{i}") for i in range(200)]  # every source has 4 translations
    parts = split_by_source(pairs, (0.8, 0.1, 0.1), seed=0)
    sources = {k: {s for s, _ in v} for k, v in parts.items()}
    assert not (sources["train"] & sources["val"] or sources["train"] & sources["test"]
                or sources["val"] & sources["test"])  # fmt: skip
    assert sorted(p for part in parts.values() for p in part) == sorted(pairs)
    assert [len(sources[k]) for k in ("train", "val", "test")] == [40, 5, 5]
    assert split_by_source(pairs, (0.8, 0.1, 0.1), seed=0) == parts


def test_the_built_in_pairs_are_real_dutch_and_deterministic():
    pairs = number_pairs()
    assert dict(pairs)["twenty-one"] == "eenentwintig"  # units first
    assert dict(pairs)["twenty-first"] == "eenentwintigste"
    assert len({s for s, _ in pairs}) == len(pairs) == 13_000
    assert number_pairs() == pairs


def test_batches_shift_the_target_by_one_with_eos_at_both_ends():
    items = [(torch.tensor([7, 8, 9]).numpy(), torch.tensor([10, 11]).numpy()),
             (torch.tensor([7]).numpy(), torch.tensor([12, 13, 14]).numpy())]  # fmt: skip
    b = collate_pairs(items)
    assert b["input_ids"].tolist() == [[7, 8, 9], [7, 2, 2]]
    assert b["decoder_input_ids"].tolist() == [[EOS_ID, 10, 11, 2], [EOS_ID, 12, 13, 14]]
    assert b["labels"].tolist() == [[10, 11, EOS_ID, IGNORE], [12, 13, 14, EOS_ID]]


# ---------------------------------------------------------------- the model


def model(net: dict = NET, **kw) -> Seq2SeqLitModule:
    return Seq2SeqLitModule({**net, **kw}, OPTIM, vocab_size=20, src_vocab_size=20).eval()


@pytest.mark.parametrize("arch", NETS)
def test_decoder_is_causal_and_reads_the_source_but_not_its_padding(arch):
    net = model(NETS[arch]).net
    src, tgt = torch.randint(6, 20, (2, 5)), torch.randint(6, 20, (2, 7))
    with torch.no_grad():
        out = net(src, tgt)
        changed = tgt.clone()
        changed[:, 4:] = 6
        torch.testing.assert_close(net(src, changed)[:, :4], out[:, :4])  # no look-ahead
        padded = torch.cat([src, torch.full((2, 3), 2)], dim=1)  # PAD = 2
        torch.testing.assert_close(net(padded, tgt), out)
        other = src.clone()
        other[:, 0] = (other[:, 0] + 1 - 6) % 14 + 6
        assert not torch.allclose(net(other, tgt), out)  # the decoder sees the source


def test_without_attention_the_rnn_decoder_sees_the_source_only_through_z():
    net, attending = model(RNN).net, model({**RNN, "attention": True}).net
    src = torch.randint(6, 20, (2, 5))
    with torch.no_grad():
        state = net.start(*net.encode(src))
    assert state.z.shape == (2, RNN["d_model"])  # one fixed vector per sentence, and no more
    assert state.memory is None and state.keys is None
    extra = sum(p.numel() for p in attending.parameters()) - sum(
        p.numel() for p in net.parameters()
    )
    d = RNN["d_model"]
    assert extra == (2 * d * d + d) + d * d + (d * d + d) + d  # W_m, W_h, W_s, v


def test_shared_vocabulary_ties_source_target_and_output_embeddings():
    shared, separate = model().net, Seq2SeqLitModule(NET, OPTIM, 20, 30, shared_vocab=False).net
    assert shared.decoder.tok_emb is shared.encoder.tok_emb
    assert shared.decoder.lm_head.weight is shared.encoder.tok_emb.weight
    assert separate.encoder.tok_emb.num_embeddings == 30
    assert separate.decoder.tok_emb is not separate.encoder.tok_emb
    rnn, rnn_apart = model(RNN).net, Seq2SeqLitModule(RNN, OPTIM, 20, 30, shared_vocab=False).net
    assert rnn.tgt_emb is rnn.src_emb and rnn.lm_head.weight is rnn.src_emb.weight
    assert rnn_apart.src_emb.num_embeddings == 30 and rnn_apart.tgt_emb is not rnn_apart.src_emb


@pytest.mark.parametrize("arch", NETS)
@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_batched_cached_translation_equals_one_sentence_at_a_time_uncached(strategy, arch):
    m = model(NETS[arch])
    src = torch.randint(6, 20, (3, 6))
    src[1, 4:] = 2  # a shorter sentence, padded
    cfg = GenerationConfig(strategy=strategy, beam_width=3, max_new_tokens=20, eos_id=EOS_ID)
    out = m.translate(src, cfg)
    assert out == m.translate(src, cfg, cache=False)
    assert [m.translate(src[i : i + 1], cfg)[0] for i in range(3)] == out  # rows independent
    assert all(len(t) <= NET["block_size"] - 1 and EOS_ID not in t for t in out)


def test_the_translation_bench_buckets_sources_by_their_words():
    from bench.translation import bucket

    lengths = (1, 4, 5, 8, 9, 12, 13, 40)
    assert [bucket(" ".join(["w"] * n)) for n in lengths] == [
        "1-4", "1-4", "5-8", "5-8", "9-12", "9-12", "13+", "13+"]  # fmt: skip


def test_cross_attention_maps_align_the_translation_with_its_source():
    src = torch.randint(6, 20, (1, 5))
    maps, tgt_in = model().cross_attention(src, max_new_tokens=4)
    assert len(maps) == NET["n_layer"] and tgt_in[0, 0] == EOS_ID
    for w in maps:  # (H, T, S): each target token's weights over the source tokens
        assert w.shape == (NET["n_head"], tgt_in.size(1), 5)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:2]))
    assert model(RNN).cross_attention(src)[0] == []


def test_plot_labels_are_the_tokens_text():
    from src.data.text import train_tokenizer
    from src.utils.callbacks import readable

    tok = train_tokenizer("bpe", ["the cat sat on the mat"] * 20, vocab_size=300)
    ids = tok.encode("the cat").ids
    assert readable(tok, ids) == ["the", " cat"]  # not "Ġcat"


def test_scores_count_a_match_with_any_reference():
    s = corpus_scores(["the cat sat on the mat", "a dog"],
                      [["the cat sat on the mat"], ["one dog", "a dog"]])  # fmt: skip
    assert s["exact"] == 1.0 and s["bleu"] == pytest.approx(100.0) and s["chrf"] > 99


# ---------------------------------------------------------------- through the entry point

TINY = ["model=seq2seq", "data=translation", "model.net.n_layer=1", "model.net.d_model=32",
        "model.net.n_head=2", "data.vocab_size=300", "data.batch_size=16",
        "trainer.max_steps=8", "trainer.val_check_interval=4", "model.val_sentences=5",
        "model.generation.max_new_tokens=6", "callbacks.progress_bar.refresh_rate=0",
        "trainer.log_every_n_steps=2",
        "logger=csv"]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A short run on a user's TSV (a third of the cardinals below 900)."""
    root = tmp_path_factory.mktemp("translation")
    pairs = number_pairs()[:900:3]
    f = root / "my-pairs.tsv"
    f.write_text("".join(f"{s}\t{t}\textra\n" for s, t in pairs), encoding="utf-8")
    run = root / "run"
    data = [f"data.path={f}", f"paths.data_dir={root / 'data'}"]
    assert_ok(run_module("src.train", *TINY, *data, f"hydra.run.dir={run}"))
    return root, pairs, run


def test_a_users_tsv_trains_and_is_scored(trained):
    root, pairs, run = trained
    metrics = json.loads((run / "metrics.json").read_text())
    for key in ("val/bleu", "test/bleu", "test/bleu_greedy", "test/chrf", "test/exact",
                "train/acc", "train/tokens_per_sec"):  # fmt: skip
        assert key in metrics, key
    prepared = root / "data" / "processed" / "my-pairs-translation-bpe300"
    meta = json.loads((prepared / "meta.json").read_text())
    assert sum(meta["pairs"].values()) == len(pairs)
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["model_class"] == "src.models.seq2seq.Seq2SeqLitModule"
    assert "target_tokenizer" in ckpt["TranslationDataModule"]
    samples = (run / "samples.txt").read_text(encoding="utf-8").splitlines()
    assert len(samples) == 5 and all(len(line.split("\t")) == 3 for line in samples)
    assert (run / "attention.png").stat().st_size > 10_000  # cross-attention, target x source


def test_translate_cli_keeps_one_line_per_line(trained):
    root, _, run = trained
    ckpt = f"ckpt={run / 'checkpoints' / 'last.ckpt'}"
    f = root / "in.txt"
    f.write_text("twenty-one\n\nfive hundred and six\n", encoding="utf-8")
    for how in (["strategy=greedy"], ["strategy=beam", "beam_width=3"]):
        proc = run_module("src.translate", ckpt, f"input={f}", "max_new_tokens=5", *how)
        assert_ok(proc)
        lines = proc.stdout.split("\n")[:-1]
        assert len(lines) == 3 and lines[1] == ""
    bad = root / "latin1.txt"
    bad.write_bytes(b"caf\xe9\n")
    assert_one_error_line(run_module("src.translate", ckpt, f"input={bad}"), "not UTF-8")
    gpt = run_module("src.translate", f"ckpt={root / 'missing.ckpt'}", f"input={f}")
    assert_one_error_line(gpt, "checkpoint not found")


def test_the_rnn_baseline_trains_and_translates_through_the_entry_points(trained):
    root, _, _ = trained
    run = root / "rnn"
    rnn = ["model=rnn_seq2seq", "data=translation", "model.net.d_model=32",
           "model.net.attention=true", *TINY[5:]]  # fmt: skip
    data = [f"data.path={root / 'my-pairs.tsv'}", f"paths.data_dir={root / 'data'}"]
    assert_ok(run_module("src.train", *rnn, *data, f"hydra.run.dir={run}"))
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"val/bleu", "test/bleu", "test/chrf", "train/acc"} <= metrics.keys()
    f = root / "in-rnn.txt"
    f.write_text("twenty-one\n\nfive hundred and six\n", encoding="utf-8")
    ckpt = f"ckpt={run / 'checkpoints' / 'last.ckpt'}"
    proc = run_module("src.translate", ckpt, f"input={f}", "strategy=beam", "max_new_tokens=5")
    assert_ok(proc)
    assert len(proc.stdout.split("\n")[:-1]) == 3


def test_the_marian_peer_trains_on_our_batches_and_translates(trained):
    """bench/translation_peer.py: HF's MarianMTModel of our size, our recipe and data module, HF's
    greedy and beam decoding (where the bench extra, transformers, is installed)."""
    pytest.importorskip("transformers")
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from bench.translation_peer import marian, marian_logits, train_loop, translator
    from src.data.translation import PAD_ID

    _, pairs, run = trained
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.model.optim.decay_steps = 4
    data = instantiate(cfg.data)
    data.setup("fit")
    net = {**OmegaConf.to_container(cfg.model.net), "d_model": 16, "n_head": 2}
    peer = marian(net, data.model_kwargs["vocab_size"], PAD_ID, EOS_ID)
    seconds, tokens_per_sec = train_loop(peer, marian_logits, data, cfg, steps=4)
    assert seconds > 0 and tokens_per_sec > 0
    translate = translator(peer, data, cfg.model.generation)
    sources = [s for s, _ in pairs[:3]]
    for strategy in ("greedy", "beam"):
        hyps = translate(sources, strategy)
        assert len(hyps) == 3 and all(isinstance(h, str) for h in hyps)


@pytest.mark.slow
def test_the_speed_table_times_every_variant(trained):
    """translation_peer --speed: ours through Lightning, then ours, ours compiled and Marian in
    the same plain loop (torch.compile's first compilation takes a minute on 2 cores)."""
    pytest.importorskip("transformers")
    from bench.translation_peer import speed

    rates = speed(trained[2], steps=20)
    assert len(rates) == 4 and all(r > 0 for r in rates.values()), rates


def test_a_malformed_tsv_stops_with_its_line_number(tmp_path):
    f = tmp_path / "bad.tsv"
    f.write_text("one\téén\ntwo twee\n", encoding="utf-8")
    proc = run_module("src.prepare", "data=translation", f"data.path={f}",
                      f"paths.data_dir={tmp_path / 'data'}")  # fmt: skip
    assert_one_error_line(proc, "line 2")
    assert not (tmp_path / "data" / "processed" / "bad-translation-bpe4000").exists()
