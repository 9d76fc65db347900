"""The encoder-decoder Transformer for translation (Bishop, sec. 12.3.5), and the RNN
encoder-decoder it replaced (src/nn/rnn.py; `model=rnn_seq2seq`), trained and decoded alike.

The encoder reads the source x_1..x_S bidirectionally into Z (S, D). The decoder is a causal token
Transformer whose every layer adds cross-attention, with Q from the decoder and K, V from Z, so
each target token can look at the source words it translates:

    p(y_1, ..., y_T | x) = prod_t p(y_t | y_1, ..., y_{t-1}, Z)

Training is teacher-forced (the reference y_<t as the decoder's input) with label smoothing;
translation decodes through src.models.generation (greedy, beam search) with the key/value cache,
Z's keys and values computed once per sentence. Metrics: BLEU and chrF (sacrebleu, corpus level,
its default tokenisation) and exact match, against every reference of a source.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric

from src.data.text import PAD_ID
from src.data.translation import EOS_ID, IGNORE, pad
from src.models.base import TransformerModule
from src.models.generation import GenerationConfig, RecurrentDecoder, TokenDecoder, generate
from src.nn.attention import record_attention
from src.nn.rnn import RNNSeq2Seq, RNNSeq2SeqConfig
from src.nn.transformer import TokenTransformer, TokenTransformerConfig

log = logging.getLogger(__name__)


@dataclass
class Seq2SeqConfig(TokenTransformerConfig):
    src_vocab_size: int = 256  # the encoder's K; vocab_size is the decoder's
    shared_vocab: bool = True  # one vocabulary: encoder and decoder share the embedding matrix


class Seq2Seq(nn.Module):
    """Encoder and decoder stacks of n_layer layers each, D = d_model, H = n_head."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.cfg = cfg
        # the encoder's output head is never used: tied to its embeddings it costs no parameters
        enc = dataclasses.replace(cfg, vocab_size=cfg.src_vocab_size, tie_weights=True)
        self.encoder = TokenTransformer(enc, causal=False)
        self.decoder = TokenTransformer(cfg, causal=True, cross_attention=True)
        if cfg.shared_vocab:  # Vaswani et al.: one matrix for source, target and output tokens
            self.decoder.tok_emb = self.encoder.tok_emb
            if cfg.tie_weights:
                self.decoder.lm_head.weight = self.decoder.tok_emb.weight

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src: (B, S) ids, PAD after each sentence -> Z (B, S, D) and the padding (B, S)."""
        pad = src == PAD_ID
        return self.encoder.hidden(src, key_padding_mask=pad), pad

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src: (B, S), tgt_in: (B, T) -> logits (B, T, K) of the next target token."""
        z, pad = self.encode(src)
        return self.decoder(tgt_in, context=z, context_padding_mask=pad)

    def next_token_logits(self, z: Tensor, pad: Tensor, cache: bool = True) -> TokenDecoder:
        """The decoder as generate() calls it, reading the encoded source (B, S, D)."""
        return TokenDecoder(self.decoder, z, pad, cache=cache)


class RNNTranslator(RNNSeq2Seq):
    """The RNN encoder-decoder with Seq2Seq's interface; its state is its cache."""

    def next_token_logits(self, h: Tensor, pad: Tensor, cache: bool = True) -> RecurrentDecoder:
        return RecurrentDecoder(self.step, self.start(h, pad))


def build_net(net: dict, **sizes) -> Seq2Seq | RNNTranslator:
    """net.arch: transformer (the default) | rnn; sizes: vocab_size, src_vocab_size, ..."""
    net = dict(net)
    if net.pop("arch", "transformer") == "rnn":
        return RNNTranslator(RNNSeq2SeqConfig(**net, **sizes, pad_id=PAD_ID))
    return Seq2Seq(Seq2SeqConfig(**net, **sizes))


def until_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids


class Seq2SeqLitModule(TransformerModule):
    """Trains the encoder-decoder with AdamW, warm-up and cosine decay; logs loss, token accuracy
    and lr, and on val (greedy, the first `val_sentences` sources) and test (greedy and the
    configured strategy, every source) BLEU, chrF and exact match."""

    def __init__(
        self,
        net: dict,
        optim: dict,
        vocab_size: int,
        src_vocab_size: int,
        shared_vocab: bool = True,
        label_smoothing: float = 0.1,
        generation: dict | None = None,
        val_sentences: int = 200,
        samples: int = 5,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.net = build_net(net, vocab_size=vocab_size, src_vocab_size=src_vocab_size,
                             shared_vocab=shared_vocab)  # fmt: skip
        gen = {**(generation or {}), "eos_id": EOS_ID}
        self.generation = GenerationConfig(**gen)
        self.loss_metric = nn.ModuleDict({s: MeanMetric() for s in ("val", "test")})
        self.acc_metric = nn.ModuleDict({s: MeanMetric() for s in ("val", "test")})

    def forward(self, src: Tensor) -> Tensor:  # (B, S) -> the encoded source, e.g. for plots
        return self.net.encode(src)[0]

    def _loss(self, batch: dict) -> tuple[Tensor, Tensor, int]:
        logits = self.net(batch["input_ids"], batch["decoder_input_ids"])  # (B, T, K)
        labels = batch["labels"]
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE,
                               label_smoothing=self.hparams.label_smoothing)  # fmt: skip
        real = labels != IGNORE
        acc = (logits.argmax(-1) == labels)[real].float().mean()
        return loss, acc, int(real.sum())

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        loss, acc, n = self._loss(batch)
        self.check_finite(loss)
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/acc", acc, batch_size=n)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def _eval_step(self, stage: str, batch: dict) -> None:
        loss, acc, n = self._loss(batch)
        self.loss_metric[stage].update(loss, weight=n)
        self.acc_metric[stage].update(acc, weight=n)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("test", batch)

    def _log_eval(self, stage: str) -> None:
        for name, metric in (("loss", self.loss_metric[stage]), ("acc", self.acc_metric[stage])):
            self.log(f"{stage}/{name}", metric.compute(), prog_bar=name == "loss")
            metric.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val")
        if self.trainer.sanity_checking:
            return
        greedy = dataclasses.replace(self.generation, strategy="greedy")
        scores, _ = self.score("val", greedy, limit=self.hparams.val_sentences)
        for k, v in scores.items():
            self.log(f"val/{k}", v, prog_bar=k == "bleu")

    def on_test_epoch_end(self) -> None:
        self._log_eval("test")
        greedy = dataclasses.replace(self.generation, strategy="greedy")
        scores, triples = self.score("test", greedy)
        for k, v in scores.items():
            self.log(f"test/{k}_greedy", v)
        if self.generation.strategy != "greedy":
            scores, triples = self.score("test", self.generation)
        for k, v in scores.items():
            self.log(f"test/{k}", v)
        self._show(triples[: self.hparams.samples])

    # -- translation and its scores
    @torch.no_grad()
    def translate(self, src: Tensor, cfg: GenerationConfig | None = None, cache: bool = True,
                  generator: torch.Generator | None = None) -> list[list[int]]:  # fmt: skip
        """src: (B, S) ids -> the B translations as token ids, without EOS; `generator` seeds
        sampling."""
        cfg = cfg or self.generation
        longest = self.net.cfg.block_size - 1  # the decoder's positions, its start token first
        cfg = dataclasses.replace(cfg, max_new_tokens=min(cfg.max_new_tokens, longest))
        z, pad = self.net.encode(src)
        start = src.new_full((len(src), 1), EOS_ID)
        out = generate(self.net.next_token_logits(z, pad, cache), start, cfg, generator)
        return [until_eos(row[1:]) for row in out.tolist()]

    @torch.no_grad()
    def cross_attention(self, src: Tensor, max_new_tokens: int = 24) -> tuple[list[Tensor], Tensor]:
        """src: (1, S) -> the decoder's cross-attention weights, (H, T, S) per layer, over its
        own greedy translation (1, T) (start token first): how it aligns target to source
        tokens. The RNN has no multi-head attention: ([], its start token)."""
        if not isinstance(self.net, Seq2Seq):
            return [], src.new_full((1, 1), EOS_ID)
        cfg = dataclasses.replace(self.generation, strategy="greedy", max_new_tokens=max_new_tokens)
        tgt_in = src.new_tensor([[EOS_ID, *self.translate(src, cfg)[0]]])  # (1, T)
        layers = nn.ModuleList(layer.cross_attn for layer in self.net.decoder.transformer.layers)
        with record_attention(layers) as maps:
            self.net(src, tgt_in)
        return [m[0] for m in maps], tgt_in

    def translate_texts(self, sources: list[str], cfg: GenerationConfig | None = None,
                        batch_size: int = 64) -> list[str]:  # fmt: skip
        data = self.trainer.datamodule
        src_tok, tgt_tok = data.tokenizer, data.target_tokenizer
        return translate_texts(self, src_tok, tgt_tok, sources, cfg, batch_size)

    def score(self, split: str, cfg: GenerationConfig, limit: int | None = None):
        """BLEU, chrF, exact match of the split's sources (the first `limit`) -> (scores,
        [(source, references, hypothesis), ...])."""
        sources, refs = self.trainer.datamodule.references(split)
        sources, refs = sources[:limit], refs[:limit]
        was_training = self.training
        self.eval()
        hyps = self.translate_texts(sources, cfg, self.trainer.datamodule.hparams.batch_size)
        self.train(was_training)
        return corpus_scores(hyps, refs), list(zip(sources, refs, hyps, strict=True))

    def _show(self, triples: list) -> None:
        if not triples or not self.trainer.is_global_zero:
            return
        from rich.console import Console
        from rich.table import Table

        table = Table("source", "reference", "translation", title="test translations")
        rows = [[s, " | ".join(r), h] for s, r, h in triples]
        for row in rows:
            table.add_row(*row)
        Console().print(table)
        with open(Path(self.trainer.default_root_dir) / "samples.txt", "w", encoding="utf-8") as f:
            f.writelines("\t".join(row) + "\n" for row in rows)  # source, references, output
        for logger in self.trainer.loggers:
            if hasattr(logger, "log_text"):  # WandbLogger
                logger.log_text("translations", columns=["source", "reference", "translation"],
                                data=rows)  # fmt: skip


def load_translator(path, device: str = "cpu"):
    """A translation checkpoint (model=seq2seq or rnn_seq2seq) -> (model in eval mode, source
    tokenizer, target tokenizer); loaded with weights_only=True."""
    from src.data.text import load_tokenizer
    from src.utils.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path, expected_class="src.models.seq2seq.Seq2SeqLitModule")
    model = Seq2SeqLitModule(**ckpt["hyper_parameters"])
    model.load_state_dict(ckpt["state_dict"])
    state = ckpt["TranslationDataModule"]
    tokenizers = (load_tokenizer(state["tokenizer"]), load_tokenizer(state["target_tokenizer"]))
    return model.to(device).eval(), *tokenizers


def translate_texts(
    model: Seq2SeqLitModule,
    src_tok,
    tgt_tok,
    sources: list[str],
    cfg: GenerationConfig | None = None,
    batch_size: int = 64,
) -> list[str]:
    """Translate sentences in batches; a source longer than the encoder's window is cut to it,
    with a warning."""
    window, out, cut = model.net.cfg.block_size, [], 0
    device = next(model.parameters()).device
    for i in range(0, len(sources), batch_size):
        ids = [e.ids for e in src_tok.encode_batch(sources[i : i + batch_size])]
        cut += sum(len(x) > window for x in ids)
        src = pad([x[:window] for x in ids], PAD_ID).to(device)  # (B, S)
        out += tgt_tok.decode_batch(model.translate(src, cfg))
    if cut:
        log.warning("%d source(s) longer than the model's %d tokens were cut to them", cut, window)
    return out


def corpus_scores(hyps: list[str], refs: list[list[str]]) -> dict[str, float]:
    """Corpus BLEU and chrF (sacrebleu's defaults; sources may have several references) and the
    fraction of translations equal to one of their references."""
    from sacrebleu.metrics import BLEU, CHRF

    n = max(map(len, refs))
    streams = [[r[k] if k < len(r) else None for r in refs] for k in range(n)]
    exact = sum(h in r for h, r in zip(hyps, refs, strict=True)) / max(len(hyps), 1)
    return {"bleu": BLEU().corpus_score(hyps, streams).score,
            "chrf": CHRF().corpus_score(hyps, streams).score, "exact": exact}  # fmt: skip
