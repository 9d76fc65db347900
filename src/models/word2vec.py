"""Word embeddings: word2vec's skip-gram and CBOW with negative sampling (Bishop, Deep Learning,
sec. 12.2.1).

Word n of a K-word dictionary, a one-hot vector x_n, is embedded in D dimensions as

    v_n = E x_n,        E: the D × K embedding matrix (column n is word n's vector),

learnt by a two-layer linear network that predicts words from their neighbours within R
positions: skip-gram predicts each context word o from the centre word c; CBOW ("continuous bag
of words", fill in the blank) predicts the centre word from the mean of its context's vectors,
h = (1/|C|) Σ_{o ∈ C} v_o. The second layer is another D × K matrix E', u_n = E' x_n. Instead
of a softmax over all K words, negative sampling (Mikolov et al., 2013) tells the true word from
S noise words k drawn from the unigram distribution raised to the power 3/4:

    L = -log σ(u_o^T v_c) - Σ_{k=1}^{S} log σ(-u_k^T v_c)        (CBOW: v_c -> h, u_o -> u_c)

As in word2vec's C code (and gensim), frequent words are subsampled: a word of frequency f is
kept with probability min(1, (sqrt(f / t) + 1) t / f) (Mikolov's 1 - sqrt(t / f) discards about
as many), dropped words being removed before the windows are formed; and each centre word's
window radius is drawn from 1..R, so that nearer words count more.

Batches are the text data module's random windows of a word-level token stream
(`data.tokenizer=word`); the words subsampling keeps are packed end to end into rows as long as
a window, the (centre, context) pairs are formed inside each row, on the fly, among words of one
window, and scored by matrix products over the whole row (a band of its T x T scores); the
noise words are drawn per row and shared by its centre words, weighted so that the loss is the
same in expectation (Word2Vec.forward). On 2 CPU cores that trains skip-gram faster than
gensim's C loop with the same settings, and CBOW at about half its speed (bench/word2vec.py):

    python -m src.train model=word2vec data=shakespeare data.tokenizer=word data.vocab_size=null

Evaluation, on the words the training split holds, by cosine similarity: the nearest neighbours
of chosen words; analogies a : b :: c : d answered by the word nearest to v(b) - v(a) + v(c)
(unit vectors, a, b and c excluded; Mikolov's Google set, questions-words.txt); the Spearman
correlation of similarities with human judgements (WordSim-353). Both score only the questions
whose words are all in the vocabulary, and report that share (coverage). Both files ship in
gensim's test data (the `bench` and `dev` extras), from where they are read by default.

The trained vectors are written in word2vec's text format (`<run dir>/word_vectors.txt`), which
`model.embedding.init` of GPT and BERT reads: a pre-trained token embedding, frozen or
fine-tuned.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric

from src.data.text import SPECIAL_TOKENS
from src.utils.checkpoint import class_path
from src.utils.errors import PipelineError

log = logging.getLogger(__name__)

N_SPECIAL = len(SPECIAL_TOKENS)  # ids below this (<|endoftext|>, <unk>, ...) are never words


@dataclass
class Word2VecConfig:
    vocab_size: int = 256  # K, set from the tokenizer by the data module
    dim: int = 100  # D
    mode: str = "skipgram"  # "skipgram" or "cbow"
    window: int = 5  # R: context words on each side, at most
    negative: int = 5  # S: noise words per true word
    # drawn per row and shared by its centre words (see forward); None: 40 for skip-gram, 20
    # for CBOW, which scores one query per centre where skip-gram scores one per pair (on
    # text8's head CBOW scored as well with 20 and ran 1.2 x faster; skip-gram lost 0.7 points)
    noise_words: int | None = None
    sample: float = 1e-3  # t of subsampling; 0 keeps every word
    ns_exponent: float = 0.75  # the noise distribution: unigram counts to this power


# --------------------------------------------------------------------------- training pairs


def keep_probability(counts: Tensor, t: float) -> Tensor:
    """(K,) counts -> (K,) the probability that subsampling keeps each word (word2vec's form);
    special tokens and words never seen are never kept."""
    f = counts.double() / counts.sum()
    keep = torch.ones_like(f) if t <= 0 else ((f / t).sqrt() + 1) * t / f
    keep = keep.clamp(max=1).nan_to_num(0.0)  # f = 0: 0 / 0
    keep[:N_SPECIAL] = 0
    return keep.float()


def noise_distribution(counts: Tensor, exponent: float = 0.75) -> Tensor:
    """(K,) counts -> (K,) the negative-sampling distribution, ∝ count^exponent over words."""
    p = counts.double().pow(exponent)
    p[:N_SPECIAL] = 0
    p[counts == 0] = 0
    return (p / p.sum()).float()


def draw_noise(p: Tensor, n: int, s: int, generator: torch.Generator | None = None) -> Tensor:
    """(K,) noise distribution -> (n, S) noise words, S for each of n rows: uniform draws
    looked up in its cumulative sum (a third of torch.multinomial's time on a CPU); a word of
    probability 0 is an empty interval, never drawn."""
    cdf = p.cumsum(0)
    u = torch.rand(n * s, generator=generator, device=p.device) * cdf[-1]
    # below the total even where the product rounds up to it: the last word drawable is a word
    u = torch.minimum(u, torch.nextafter(cdf[-1], cdf.new_zeros(())))
    return torch.searchsorted(cdf, u, right=True).view(n, s)


def pack(tokens: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """(B, T) windows of tokens and their keep mask -> the kept words of all B windows end to
    end, cut into rows of T, (M, T) with M = ceil(kept / T), and the window each position's word
    came from, (M, T), -1 past the end. Subsampled words vanish and their neighbours close up,
    and no compute is spent on them: a third of the positions at word2vec's t = 1e-3."""
    b, t = tokens.shape
    words = tokens[keep]  # (n,)
    window = torch.arange(b, device=tokens.device)[:, None].expand(b, t)[keep]  # (n,)
    pad = max(1, math.ceil(len(words) / t)) * t - len(words)
    return F.pad(words, (0, pad)).view(-1, t), F.pad(window, (0, pad), value=-1).view(-1, t)


def context_band(window: Tensor, radius: Tensor) -> Tensor:
    """window: (M, T) the window each position's word came from, -1 for none; radius: (M, T)
    each centre's, in 1..R -> (M, T, T) C[m, i, j]: word j is a context word of centre i (both
    from one window, 0 < |i - j| <= the radius of i). A band around the diagonal: every
    (centre, context) pair of the row."""
    t = window.shape[1]
    pos = torch.arange(t, device=window.device)
    dist = (pos[None, :] - pos[:, None]).abs()  # (T, T)
    same = (window[:, :, None] == window[:, None, :]) & (window >= 0)[:, :, None]
    return (dist > 0) & (dist <= radius[..., None]) & same


# --------------------------------------------------------------------------- the model


class _Rows(torch.autograd.Function):
    """table[idx], whose backward adds the gradient's rows into a zero table by index_add_."""

    @staticmethod
    def forward(ctx, table: Tensor, idx: Tensor) -> Tensor:
        ctx.save_for_backward(idx)
        ctx.rows = len(table)
        return table.index_select(0, idx.flatten()).view(*idx.shape, table.shape[1])

    @staticmethod
    def backward(ctx, grad: Tensor):
        (idx,) = ctx.saved_tensors
        grad = grad.reshape(-1, grad.shape[-1])
        return grad.new_zeros(ctx.rows, grad.shape[1]).index_add_(0, idx.flatten(), grad), None


class WordTable(nn.Embedding):
    """An embedding table whose backward is one index_add_: for the ~30 k words a text8 step
    looks up, F.embedding's dense backward (a tensor operation per index on a CPU) took 40 %
    longer (the whole CBOW step: about 5 %)."""

    def forward(self, idx: Tensor) -> Tensor:
        return _Rows.apply(self.weight, idx)


class Word2Vec(nn.Module):
    """E (the input vectors v) and E' (the output vectors u) as K × D embedding tables, their
    rows being the columns of the chapter's D × K matrices; and the negative-sampling loss of a
    batch of windows. `set_counts` gives it the training split's unigram counts."""

    def __init__(self, cfg: Word2VecConfig):
        super().__init__()
        if cfg.mode not in ("skipgram", "cbow"):
            raise PipelineError(f"model.net.mode={cfg.mode!r}: choose skipgram or cbow")
        self.cfg = cfg
        self.noise_words = cfg.noise_words or (40 if cfg.mode == "skipgram" else 20)
        k, d = cfg.vocab_size, cfg.dim
        # dense gradients and Adam: measured on tiny Shakespeare (K = 3k), SparseAdam's step on
        # sparse gradients (coalescing ~10^5 row updates) took longer than the whole dense step
        self.emb_in = WordTable(k, d)  # E^T
        self.emb_out = WordTable(k, d)  # E'^T
        # word2vec's initialisation: small random input vectors, zero output vectors
        nn.init.uniform_(self.emb_in.weight, -0.5 / d, 0.5 / d)
        nn.init.zeros_(self.emb_out.weight)
        self.register_buffer("counts", torch.zeros(k, dtype=torch.long))
        self.register_buffer("keep", torch.zeros(k))
        self.register_buffer("noise", torch.zeros(k))

    @property
    def E(self) -> Tensor:
        """(D, K) the embedding matrix: v_n = E x_n."""
        return self.emb_in.weight.T

    def set_counts(self, counts: Tensor) -> None:
        self.counts.copy_(counts)
        self.keep.copy_(keep_probability(self.counts, self.cfg.sample))
        self.noise.copy_(noise_distribution(self.counts, self.cfg.ns_exponent))
        if (self.noise > 0).sum() < 2:
            raise PipelineError("word2vec's negative sampling needs two words or more in training")

    def windows(self, tokens: Tensor, generator: torch.Generator | None = None):
        """(B, T) token ids -> the words subsampling keeps, packed into rows (M, T), and their
        (centre, context) pairs under each centre's random radius, (M, T, T)."""
        r = torch.rand(tokens.shape, generator=generator, device=tokens.device)
        tokens, window = pack(tokens, r < self.keep[tokens])
        radius = torch.randint(1, self.cfg.window + 1, tokens.shape, generator=generator,
                               device=tokens.device)  # fmt: skip
        return tokens, context_band(window, radius)

    def forward(self, tokens: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """(B, T) token ids -> the mean negative-sampling loss per true word.

        All of a row's scores come from matrix products, which is what makes this fast on a
        CPU (a row of E and one of E' read per word, not 1 + S of E' per pair): skip-gram scores
        every (centre i, word j) of the row, u_j^T v_i, (T, T), and keeps the band of context
        pairs; CBOW averages each centre's context vectors into h by the band's product with
        the row's v's. The noise words are drawn per row, `noise_words` of them, and every query
        of the row (skip-gram's centre, CBOW's h) is scored against all of them, each weighted
        S / noise_words for each of its true words (a noise word that is the true word itself
        skipped, as word2vec's C code skips it): the same loss in expectation as S noise words
        of its own per true word."""
        tokens, band = self.windows(tokens, generator)  # (M, T), (M, T, T)
        w = band.to(self.emb_in.weight.dtype)
        size = w.sum(-1)  # (M, T): |C|, the context words of each centre
        noise = draw_noise(self.noise, len(tokens), self.noise_words, generator)  # (M, N)
        is_word = (noise[:, :, None] == tokens[:, None, :]).to(w.dtype)  # (M, N, T): k is j
        u = self.emb_out(tokens)  # (M, T, D): u of each word of the row
        if self.cfg.mode == "skipgram":
            v = self.emb_in(tokens)  # (M, T, D): v_c of each centre
            true = (w * F.logsigmoid(torch.bmm(v, u.transpose(1, 2)))).sum()
            against = size[..., None] - torch.bmm(w, is_word.transpose(1, 2))  # (M, T, N)
            n_true = size.sum()
        else:
            has = (size > 0).to(w.dtype)  # (M, T): centres with a context
            mean = w / size.clamp(min=1)[..., None]  # (M, T, T): each centre's row sums to 1
            v = torch.bmm(mean, self.emb_in(tokens))  # (M, T, D): h
            true = (has * F.logsigmoid((v * u).sum(-1))).sum()  # u_c^T h
            against = has[..., None] * (1 - is_word.transpose(1, 2))  # (M, T, N)
            n_true = has.sum()
        noise_scores = torch.bmm(v, self.emb_out(noise).transpose(1, 2))  # (M, T, N): u_k^T v
        noise_loss = (against * F.logsigmoid(-noise_scores)).sum() * self.cfg.negative
        return -(true + noise_loss / self.noise_words) / n_true


# --------------------------------------------------------------------------- evaluation


def gensim_test_file(name: str) -> Path | None:
    """A file of gensim's test data (found without importing gensim), or None without gensim."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "test" / "test_data" / name


def resolve_eval_file(value: str | None, name: str) -> Path | None:
    """An evaluation setting: a path, `gensim` (its copy of `name`) or null (none)."""
    if value is None:
        return None
    if value == "gensim":
        path = gensim_test_file(name)
        if path is None:
            log.warning("gensim is not installed (pip install -e '.[bench]'): no %s scores", name)
        return path
    path = Path(value).expanduser()
    if not path.is_file():
        raise PipelineError(f"evaluation file not found: {path}")
    return path


def read_analogies(path: Path) -> list[tuple[str, str, str, str]]:
    """questions-words.txt: `a b c d` per line, lowercased; `: section` lines skipped."""
    lines = Path(path).read_text(encoding="utf-8").lower().splitlines()
    return [tuple(ln.split()) for ln in lines if ln.strip() and not ln.startswith(":")]


def read_wordsim(path: Path) -> list[tuple[str, str, float]]:
    """wordsim353.tsv: `word1 <tab> word2 <tab> score` per line, lowercased; `#` comments."""
    rows = []
    for ln in Path(path).read_text(encoding="utf-8").lower().splitlines():
        if ln.strip() and not ln.startswith("#"):
            a, b, score = ln.split("\t")[:3]
            rows.append((a, b, float(score)))
    return rows


class WordVectors:
    """Words and their vectors (n, D), unit length for cosine similarities: what the evaluation
    reads, from this model or from gensim alike."""

    def __init__(self, words: list[str], vectors: Tensor | np.ndarray):
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.raw = torch.as_tensor(np.asarray(vectors), dtype=torch.float32)  # (n, D)
        self.unit = F.normalize(self.raw, dim=1)

    def nearest(self, word: str, k: int = 5) -> list[tuple[str, float]]:
        """The k words of highest cosine similarity to `word` (not itself)."""
        sims = self.unit @ self.unit[self.index[word]]  # (n,)
        sims[self.index[word]] = -math.inf
        top = sims.topk(min(k, len(sims) - 1))
        return [
            (self.words[i], s)
            for s, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)
        ]

    def analogy_accuracy(self, questions, batch: int = 1024) -> tuple[float, float, int]:
        """-> (accuracy on the covered questions, coverage, covered count); a question is
        answered by argmax_d cos(d, v(b) - v(a) + v(c)) over the words other than a, b, c."""
        ids = [[self.index[w] for w in q] for q in questions if all(w in self.index for w in q)]
        if not ids:
            return math.nan, 0.0, 0
        q = torch.tensor(ids)  # (Q, 4): a, b, c, d
        correct = 0
        for part in q.split(batch):
            target = self.unit[part[:, 1]] - self.unit[part[:, 0]] + self.unit[part[:, 2]]
            sims = target @ self.unit.T  # (Q, n)
            sims.scatter_(1, part[:, :3], -math.inf)
            correct += int((sims.argmax(1) == part[:, 3]).sum())
        return correct / len(ids), len(ids) / len(questions), len(ids)

    def wordsim_spearman(self, pairs) -> tuple[float, float, int]:
        """-> (Spearman's ρ between cosine similarity and the human scores on the covered pairs,
        coverage, covered count)."""
        from scipy.stats import spearmanr

        rows = [(a, b, s) for a, b, s in pairs if a in self.index and b in self.index]
        if len(rows) < 2:
            return math.nan, len(rows) / len(pairs), len(rows)
        a = self.unit[[self.index[r[0]] for r in rows]]
        b = self.unit[[self.index[r[1]] for r in rows]]
        rho = spearmanr((a * b).sum(1).numpy(), [r[2] for r in rows]).statistic
        return float(rho), len(rows) / len(pairs), len(rows)


def evaluate(
    vectors: WordVectors, analogies: list | None, wordsim: list | None
) -> dict[str, float]:
    """The scores of `vectors` on the question sets given (None: skipped)."""
    out = {}
    if analogies:
        acc, cov, n = vectors.analogy_accuracy(analogies)
        out.update({"analogy_acc": acc, "analogy_coverage": cov, "analogy_questions": n})
    if wordsim:
        rho, cov, n = vectors.wordsim_spearman(wordsim)
        out.update({"wordsim_spearman": rho, "wordsim_coverage": cov, "wordsim_pairs": n})
    return out


# --------------------------------------------------------------------------- word vector files


def save_word_vectors(vectors: WordVectors, path: Path) -> None:
    """word2vec's text format: `n D`, then `word x_1 ... x_D` per line (gensim's
    KeyedVectors.load_word2vec_format reads it). Words with whitespace in them (the line break
    token) cannot be written in it and are left out."""
    rows = [(w, v) for w, v in zip(vectors.words, vectors.raw.tolist(), strict=True)
            if not any(c.isspace() for c in w)]  # fmt: skip
    lines = [f"{len(rows)} {vectors.raw.size(1)}"] + [w + " " + " ".join(f"{x:.6g}" for x in v)
                                              for w, v in rows]  # fmt: skip
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def load_word_vectors(path: str | Path) -> tuple[list[str], Tensor]:
    """A word2vec text-format file -> its words and (n, D) vectors."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise PipelineError(f"word vectors not found: {path}")
    lines = path.read_text(encoding="utf-8").splitlines()
    n = int(lines[0].split()[0])  # the header: n D
    parts = [ln.rstrip().split(" ") for ln in lines[1 : n + 1]]
    return [p[0] for p in parts], torch.tensor([[float(x) for x in p[1:]] for p in parts])


def init_token_embedding(embedding: nn.Embedding, tokenizer, path: str, freeze: bool) -> int:
    """The chapter's pre-trained layer: the rows of the tokens that are words of `path` (word2vec
    text format) set to their vectors, the rest left as initialised; `freeze` keeps the whole
    table fixed (and a tied output layer with it). Returns the number of rows set."""
    words, vectors = load_word_vectors(path)
    if vectors.size(1) != embedding.embedding_dim:
        raise PipelineError(
            f"the word vectors in {path} have {vectors.size(1)} dimensions, the token embedding "
            f"{embedding.embedding_dim} (model.net.d_model)"
        )
    vocab = tokenizer.get_vocab()
    rows = [(vocab[w], i) for i, w in enumerate(words) if w in vocab]
    if not rows:
        raise PipelineError(
            f"no word of {path} is a token of the data's tokenizer (data.tokenizer=word?)"
        )
    token_ids, word_ids = torch.tensor(rows).T
    with torch.no_grad():
        embedding.weight[token_ids] = vectors[word_ids].to(embedding.weight)
    embedding.weight.requires_grad_(not freeze)
    log.info("token embedding: %d of %d rows from %s%s", len(rows), embedding.num_embeddings,
             path, " (frozen)" if freeze else "")  # fmt: skip
    return len(rows)


# --------------------------------------------------------------------------- Lightning


class Word2VecLitModule(pl.LightningModule):
    """Trains word2vec with Adam and a linear learning-rate decay (word2vec's schedule);
    logs the loss, and at each validation the held-out loss, the analogy and WordSim scores with
    their coverage, and the nearest neighbours of `eval.neighbours` (`<run dir>/neighbours.txt`).
    Writes `<run dir>/word_vectors.txt` at the end of training."""

    def __init__(self, net: dict, optim: dict, vocab_size: int, eval: dict | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.net = Word2Vec(Word2VecConfig(**net, vocab_size=vocab_size))
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self._questions: dict[str, list | None] | None = None  # read once, in setup()

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule
        if stage == "fit":  # a resumed run loads the same counts from its checkpoint
            self.net.set_counts(torch.as_tensor(dm.counts("train")))
        vocab = dm.tokenizer.get_vocab()
        self.words = sorted(vocab, key=vocab.get)  # id -> word
        e = self.hparams.eval or {}
        files = {"analogies": ("questions-words.txt", read_analogies),
                 "wordsim": ("wordsim353.tsv", read_wordsim)}  # fmt: skip
        self._questions = {}
        for key, (name, read) in files.items():
            path = resolve_eval_file(e.get(key), name)
            self._questions[key] = read(path) if path else None

    def vectors(self) -> WordVectors:
        """The rows of E that are words seen in training (specials and unseen words left out)."""
        ids = torch.nonzero(self.net.counts[N_SPECIAL:]).flatten() + N_SPECIAL
        return WordVectors([self.words[i] for i in ids.tolist()],
                           self.net.emb_in.weight[ids].detach().float().cpu())  # fmt: skip

    def forward(self, idx: Tensor) -> Tensor:
        """(B, T) token ids -> (B, T, D) their embeddings v = E x."""
        return self.net.emb_in(idx)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch  # (B, T) each; the window is x and y's last token
        loss = self.net(torch.cat([x, y[:, -1:]], 1))
        if not torch.isfinite(loss):
            raise PipelineError(f"training loss became {loss.item()} at step {self.global_step}")
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def _eval_step(self, metric: MeanMetric, batch, batch_idx: int) -> None:
        # the same subsampling, radii and noise words in every evaluation: comparable losses
        g = torch.Generator(self.device).manual_seed(batch_idx)
        x, y = batch
        metric.update(self.net(torch.cat([x, y[:, -1:]], 1), g))

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(self.val_loss, batch, batch_idx)

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(self.test_loss, batch, batch_idx)

    def _log_eval(self, stage: str, metric: MeanMetric) -> None:
        self.log(f"{stage}/loss", metric.compute(), prog_bar=True)
        metric.reset()
        vectors = self.vectors()
        scores = evaluate(vectors, self._questions["analogies"], self._questions["wordsim"])
        for name, value in scores.items():
            self.log(f"{stage}/{name}", float(value), prog_bar=name.endswith(("acc", "spearman")))
        if self.trainer.is_global_zero and not self.trainer.sanity_checking:
            self.write_neighbours(vectors)

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val", self.val_loss)

    def on_test_epoch_end(self) -> None:
        self._log_eval("test", self.test_loss)

    def neighbours(self, vectors: WordVectors) -> list[str]:
        e = self.hparams.eval or {}
        k = e.get("top_k", 5)
        return [f"{w}: " + ", ".join(f"{n} {s:.2f}" for n, s in vectors.nearest(w, k))
                for w in e.get("neighbours", []) if w in vectors.index]  # fmt: skip

    def write_neighbours(self, vectors: WordVectors) -> None:
        lines = self.neighbours(vectors)
        path = Path(self.trainer.default_root_dir) / "neighbours.txt"
        path.write_text(f"step {self.global_step}\n" + "".join(ln + "\n" for ln in lines))

    def on_fit_end(self) -> None:
        if not self.trainer.is_global_zero:
            return
        vectors = self.vectors()
        for line in self.neighbours(vectors):
            log.info("nearest %s", line)
        path = Path(self.trainer.default_root_dir) / "word_vectors.txt"
        save_word_vectors(vectors, path)
        log.info("word vectors (%d words) in %s", len(vectors.words), path)

    def configure_optimizers(self):
        o = self.hparams.optim
        # fused: one pass over E and E' per step, where the default's per-op passes took a
        # sixth of a text8 step on 2 cores
        opt = torch.optim.Adam(self.parameters(), lr=o["lr"], fused=True)
        decay = max(1, o["decay_steps"])
        floor = o["min_lr"] / o["lr"]
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt,
            lambda step: max(floor, 1 - step / decay),  # word2vec's linear decay
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["model_class"] = class_path(self)
