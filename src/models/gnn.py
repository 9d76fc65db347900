"""Graph neural networks and their tasks (Bishop, sec. 13.1-13.3).

L message-passing layers turn the node features x into node embeddings,

    h^(0) = x,    h^(l) = h^(l-1) [if the widths match and residual] + f(Norm(Layer_l(h^(l-1))))

with dropout on every layer's input. Layer_l is one of src/nn/: "gcn" (Kipf & Welling 2017),
"gat" (Veličković et al. 2018: H heads concatenated in hidden layers, averaged in the output
layer), "gin" (Xu et al. 2019), "mpnn" (the chapter's general layer, W_self h_n + W_neigh
Aggregate_m h_m, with a chosen aggregation), "graphnet" (edge embeddings e_nm and a graph
embedding g, sec. 13.3.2) or "egnn" (E(n)-equivariant, on node positions r_n, sec. 13.3.6). The
last two keep their width, so x is first mapped to it by a linear layer.

The tasks read the embeddings differently:
- node classification (NodeClassifier): class scores y_n from an output layer of the same kind
  (jk="none"), or, with jumping knowledge (Xu et al. 2018; sec. 13.2.5; jk="cat"), from a linear
  map of every layer's embedding of the node, y_n = W [h_n^(1) ⊕ ... ⊕ h_n^(L)] + b;
- link prediction (LinkPredictor): p(n, m) = σ(h_n^T h_m) (sec. 13.1.3);
- graph classification and regression (GraphPredictor): an MLP on a sum, mean or max readout of
  the node embeddings of each graph (sec. 13.1.3), or (head="layers", GIN's) a sum over the
  layers, the input included, of a linear map of each layer's readout.
`gnn_task` picks the task that the data module names.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool
from torch_geometric.utils import negative_sampling
from torchmetrics import Accuracy, MeanAbsoluteError, MeanSquaredError
from torchmetrics.classification import BinaryAUROC

from src.nn.activations import activation_layer
from src.nn.egnn import EGNNLayer
from src.nn.message_passing import (
    GATLayer,
    GCNLayer,
    GINLayer,
    GraphNetworkLayer,
    MessagePassingLayer,
    mlp,
)
from src.utils.checkpoint import class_path
from src.utils.errors import PipelineError

LAYERS = ("gcn", "gat", "gin", "mpnn", "graphnet", "egnn")
WIDTH_PRESERVING = ("graphnet", "egnn")  # their layers map D -> D: x is embedded first
JK = ("none", "cat")
NORMS = ("none", "batch")
POOLS = {"sum": global_add_pool, "mean": global_mean_pool, "max": global_max_pool}
READOUTS = tuple(POOLS)
HEADS = ("mlp", "layers")


@dataclass
class GNNConfig:
    layer: str = "gcn"  # gcn | gat | gin | mpnn | graphnet | egnn
    hidden: int = 16  # width W of the hidden embeddings (per head for GAT)
    num_layers: int = 2  # message-passing layers, the output layer included when there is one
    dropout: float = 0.5  # on the embeddings: the input of every later layer and of the readout
    input_dropout: float | None = None  # on x, the first layer's input; None: dropout
    activation: str = "relu"  # f, after every hidden layer (not after the output layer)
    norm: str = "none"  # none | batch: BatchNorm after every hidden layer (GIN)
    residual: bool = False  # h^(l) = h^(l-1) + f(...) in layers whose widths match
    jk: str = "none"  # none | cat (jumping knowledge: the tasks read h^(1) ⊕ ... ⊕ h^(L))
    heads: int = 1  # gat: heads of the hidden layers, concatenated: width heads * hidden
    out_heads: int = 1  # gat: heads of the output layer, averaged
    attn_dropout: float = 0.0  # gat: dropout on the attention weights A_nm
    score: str = "mlp"  # gat: mlp | bilinear attention scores
    aggr: str = "mean"  # mpnn: sum | mean | max | min | symmetric | mlp; graphnet, egnn: sum | mean
    train_eps: bool = False  # gin: learn ε (GIN-ε) or keep it 0 (GIN-0)
    edge_features: bool = False  # gin: the data's edge features enter the messages (GINE)
    readout: str = "sum"  # graph tasks: sum | mean | max of the node embeddings of a graph
    head: str = "mlp"  # graph tasks: mlp | layers (Xu et al.: Σ_l W_l readout(h^(l)), l = 0..L)
    head_dropout: float | None = None  # graph tasks: dropout in the head; None: dropout


def _check(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise PipelineError(f"unknown {name} {value!r}; choose one of {choices}")


class GNN(nn.Module):
    """A graph -> node outputs (N, out_channels), or, with out_channels=None, node embeddings
    (N, embedding_dim) with embedding_dim = W, or L W with jk="cat"."""

    def __init__(
        self,
        cfg: GNNConfig,
        in_channels: int,
        out_channels: int | None = None,
        edge_channels: int = 0,
    ):
        super().__init__()
        _check("layer", cfg.layer, LAYERS)
        _check("jk", cfg.jk, JK)
        _check("norm", cfg.norm, NORMS)
        _check("readout", cfg.readout, READOUTS)
        if cfg.num_layers < 1:
            raise PipelineError(f"num_layers={cfg.num_layers}: a GNN needs at least one layer")
        if cfg.edge_features and not edge_channels:
            raise PipelineError("model.net.edge_features=true, but the data has no edge features")
        self.cfg, self.edge_channels = cfg, edge_channels
        width = cfg.hidden * cfg.heads if cfg.layer == "gat" else cfg.hidden  # W
        embed = cfg.layer in WIDTH_PRESERVING
        out_layer = out_channels is not None and cfg.jk == "none" and not embed
        n_hidden = cfg.num_layers - 1 if out_layer else cfg.num_layers
        self.input = nn.Linear(in_channels, width) if embed else None
        dims = [width if embed else in_channels] + [width] * n_hidden
        self.layers = nn.ModuleList(self._layer(d, cfg.hidden, output=False) for d in dims[:-1])
        self.norms = nn.ModuleList(
            nn.BatchNorm1d(width) if cfg.norm == "batch" else nn.Identity() for _ in dims[1:]
        )
        self.residual = [cfg.residual and d == width for d in dims[:-1]]
        if cfg.layer == "graphnet":  # e_nm^(0) from the edge features (or a constant), g^(0)
            self.edge_input = nn.Linear(max(edge_channels, 1), width)
            self.g0 = nn.Parameter(torch.zeros(width))
        self.embedding_dim = n_hidden * width if cfg.jk == "cat" else dims[-1]
        if out_channels is None:
            self.readout = None
        elif out_layer:
            self.readout = self._layer(dims[-1], out_channels, output=True)
        else:
            self.readout = nn.Linear(self.embedding_dim, out_channels)  # (L W or W) -> C
        self.act = activation_layer(cfg.activation)
        self.drop = nn.Dropout(cfg.dropout)
        self.p_in = cfg.dropout if cfg.input_dropout is None else cfg.input_dropout
        for m in self.modules():  # Glorot, as Kipf & Welling and Veličković et al. initialise
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def _layer(self, d_in: int, d_out: int, output: bool) -> nn.Module:
        c = self.cfg
        if c.layer == "gcn":
            return GCNLayer(d_in, d_out)  # linear: f is applied here, in embeddings()
        if c.layer == "gat":  # hidden: (N, heads * d_out) concatenated; output: (N, d_out) mean
            heads = c.out_heads if output else c.heads
            return GATLayer(
                d_in, d_out, heads=heads, concat=not output, score=c.score, dropout=c.attn_dropout
            )
        if c.layer == "gin":
            edges = self.edge_channels if c.edge_features else 0  # GINE (Hu et al. 2020)
            return GINLayer(d_in, d_out, c.train_eps, activation=c.activation, edge_channels=edges)
        if c.layer == "graphnet":
            return GraphNetworkLayer(d_in, d_in, d_in, d_out, aggr=c.aggr, activation=c.activation)
        if c.layer == "egnn":  # the residual path is added in embeddings(), as for every layer
            return EGNNLayer(d_in, d_out, self.edge_channels, c.aggr, "silu", residual=False)
        return MessagePassingLayer(d_in, d_out, aggr=c.aggr, activation="none")

    def embeddings(
        self,
        x: Tensor,
        edge_index: Tensor,
        edge_attr: Tensor | None = None,
        pos: Tensor | None = None,
        batch: Tensor | None = None,
    ) -> list[Tensor]:
        """x: (N, F), edge_index: (2, E), edge_attr: (E, D_e), pos: (N, S), batch: (N,) graph of
        each node -> the hidden layers' embeddings [h^(1), ..., h^(L')], each (N, W)."""
        kind = self.cfg.layer
        h = input_dropout(x, self.p_in, self.training)
        if self.input is not None:
            h = self.input(h)  # (N, W)
        if kind == "egnn" and pos is None:
            raise PipelineError("egnn needs node positions (data.pos), e.g. data=esol")
        if kind == "graphnet":
            e = self.edge_input(
                edge_attr if edge_attr is not None else x.new_ones(len(edge_index[0]), 1)
            )
            g = self.g0.expand(1 if batch is None else int(batch.max()) + 1, -1)  # (B, W)
        hs = []
        for i, layer in enumerate(self.layers):
            h_in = h if i == 0 else self.drop(h)
            if kind == "graphnet":
                z, e, g = layer(h_in, edge_index, e, g, batch)
            elif kind == "egnn":
                z, pos = layer(h_in, pos, edge_index, edge_attr)
            elif kind == "gin" and self.cfg.edge_features:
                z = layer(h_in, edge_index, edge_attr)
            else:
                z = layer(h_in, edge_index)
            z = self.act(self.norms[i](z))  # (N, W)
            h = h + z if self.residual[i] else z
            hs.append(h)
        return hs

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        edge_attr: Tensor | None = None,
        pos: Tensor | None = None,
        batch: Tensor | None = None,
    ) -> Tensor:
        """-> (N, out_channels), or the embeddings (N, embedding_dim) without out_channels."""
        hs = self.embeddings(x, edge_index, edge_attr, pos, batch)
        h = hs[-1] if hs else x  # (N, W), or (N, F) for a one-layer model
        if self.cfg.jk == "cat":
            h = torch.cat(hs, dim=-1)  # (N, L W)
        if self.readout is None:
            return h
        if isinstance(self.readout, nn.Linear):
            return self.readout(self.drop(h))
        h = self.drop(h) if hs else input_dropout(h, self.p_in, self.training)
        return self.readout(h, edge_index)  # the output layer: (N, C)


def input_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Dropout that draws only for the non-zero entries of x: the same distribution as
    F.dropout(x, p), since a dropped or kept 0 stays 0, but on sparse features (Cora's
    bag-of-words: 1.3 % non-zero) it costs ~5 ms instead of ~60 ms per pass of the 2708 x 1433
    matrix on 2 CPU threads, most of an epoch. Kipf & Welling drop their sparse input alike."""
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return torch.zeros_like(x)
    flat = x.reshape(-1)
    nonzero = flat.nonzero().view(-1)  # (nnz,)
    kept = nonzero[torch.rand(nonzero.numel(), device=x.device) >= p]
    out = torch.zeros_like(flat)
    out[kept] = flat[kept] / (1 - p)
    return out.view_as(x)


def graph_inputs(batch) -> dict:
    """The tensors of a PyG Data or Batch that GNN.forward reads."""
    return {
        "x": batch.x,
        "edge_index": batch.edge_index,
        "edge_attr": batch.get("edge_attr"),
        "pos": batch.get("pos"),
        "batch": batch.get("batch"),
    }


def cosine_similarity(h: Tensor) -> Tensor:
    """Mean cosine similarity of the N (N - 1) pairs of distinct rows of h (N, D): 1 when all
    embeddings point the same way (over-smoothed). O(N D): Σ_{n≠m} u_n·u_m = |Σ u|² - Σ |u|²."""
    u = F.normalize(h, dim=-1)
    n = u.size(0)
    return (u.sum(0).pow(2).sum() - u.pow(2).sum()) / (n * (n - 1))


def dirichlet_energy(h: Tensor, edge_index: Tensor) -> Tensor:
    """(1/N) Σ_{(n,m) ∈ E} |h_n / sqrt(1 + d_n) - h_m / sqrt(1 + d_m)|² (Rusch et al. 2023):
    how much embeddings vary across edges; it decays towards 0 as layers over-smooth."""
    src, dst = edge_index
    d = torch.bincount(dst, minlength=h.size(0)).to(h.dtype)
    hn = h / (1 + d).sqrt()[:, None]
    return (hn[src] - hn[dst]).pow(2).sum() / h.size(0)


class GNNTask(pl.LightningModule):
    """What every graph task shares: the train/val/test steps around the task's `_step`, Adam
    with L2 weight decay (and an optional step schedule), a NaN check on the training loss, and
    the model class written into checkpoints."""

    net: GNN

    def _check_finite(self, loss: Tensor) -> None:
        if not torch.isfinite(loss):
            raise PipelineError(
                f"training loss became {loss.item()} at step {self.global_step}; "
                "lower model.optim.lr or check the data"
            )

    def _step(self, batch, stage: str) -> Tensor:
        """The loss of `batch` for stage train, val or test, with the stage's metrics logged."""
        raise NotImplementedError

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss = self._step(batch, "train")
        self._check_finite(loss)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "test")

    def _log(self, name: str, value, batch_size: int, prog_bar: bool = False) -> None:
        self.log(name, value, on_step=False, on_epoch=True, batch_size=batch_size,
                 prog_bar=prog_bar)  # fmt: skip

    def configure_optimizers(self):
        o = self.hparams.optim
        optimizer = adam(self, o)
        if not o.get("lr_step_epochs"):
            return optimizer
        # GIN's schedule: the learning rate times lr_gamma every lr_step_epochs epochs
        step = torch.optim.lr_scheduler.StepLR(optimizer, o["lr_step_epochs"], o["lr_gamma"])
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": step, "interval": "epoch"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["model_class"] = class_path(self)


class NodeClassifier(GNNTask):
    """Class scores of the nodes of one graph, trained full-batch on its labelled training nodes;
    logs loss and accuracy of the train, val and test nodes, and, on the test pass, how smooth
    the last hidden embeddings are (cosine similarity and Dirichlet energy; over-smoothing)."""

    def __init__(self, in_channels: int, out_channels: int, net: dict, optim: dict):
        super().__init__()
        self.save_hyperparameters()
        self.net = GNN(GNNConfig(**net), in_channels, out_channels)
        # one metric per stage (train/acc: on the training pass, dropout active, as the papers)
        self.train_acc = Accuracy(task="multiclass", num_classes=out_channels)
        self.val_acc = Accuracy(task="multiclass", num_classes=out_channels)
        self.test_acc = Accuracy(task="multiclass", num_classes=out_channels)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.net(x, edge_index)

    def loss(self, batch, stage: str) -> tuple[Tensor, Tensor, Tensor]:
        """Cross-entropy over the nodes of `<stage>_mask` only -> (loss, logits (M, C), y (M,))."""
        logits = self.net(**graph_inputs(batch))  # (N, C): all nodes pass through the GNN
        mask = batch[f"{stage}_mask"]  # (N,) bool, M of them true
        logits, y = logits[mask], batch.y[mask]  # (M, C), (M,)
        return F.cross_entropy(logits, y), logits, y

    def _step(self, batch, stage: str) -> Tensor:
        loss, logits, y = self.loss(batch, stage)
        acc = getattr(self, f"{stage}_acc")
        acc.update(logits, y)  # logged as an object: computed once, at the epoch end
        # one graph = one batch: batch_size=1 spares Lightning guessing it from a Data object
        self._log(f"{stage}/loss", loss, 1, prog_bar=stage != "train")
        self._log(f"{stage}/acc", acc, 1, prog_bar=True)
        return loss

    def test_step(self, batch, batch_idx: int) -> None:
        super().test_step(batch, batch_idx)
        hs = self.net.embeddings(**graph_inputs(batch))
        h = hs[-1] if hs else batch.x  # (N, W)
        self._log("test/cosine_similarity", cosine_similarity(h), 1)
        self._log("test/dirichlet_energy", dirichlet_energy(h, batch.edge_index), 1)


class LinkPredictor(GNNTask):
    """Edges of one graph: p(n, m) = σ(h_n^T h_m) from node embeddings h (N, W) (the output
    layer maps to W, with no activation). Each training step scores the training edges against
    as many node pairs drawn afresh from the non-edges (negative sampling), with binary
    cross-entropy; val and test score held-out edges and fixed negatives (ROC-AUC)."""

    def __init__(self, in_channels: int, net: dict, optim: dict):
        super().__init__()
        self.save_hyperparameters()
        cfg = GNNConfig(**net)
        self.net = GNN(cfg, in_channels, out_channels=cfg.hidden)
        self.val_auroc, self.test_auroc = BinaryAUROC(), BinaryAUROC()

    def score(self, h: Tensor, pairs: Tensor) -> Tensor:
        """h: (N, W), pairs: (2, P) node pairs (n, m) -> logits h_n^T h_m: (P,)."""
        return (h[pairs[0]] * h[pairs[1]]).sum(-1)

    def _step(self, batch, stage: str) -> Tensor:
        h = self.net(**graph_inputs(batch))  # (N, W), from the message-passing edges only
        pairs, labels = batch.edge_label_index, batch.edge_label.float()  # (2, P), (P,)
        if stage == "train":  # the training edges against as many non-edges, drawn afresh
            neg = negative_sampling(batch.edge_index, batch.num_nodes, pairs.size(1))
            pairs = torch.cat([pairs, neg], dim=1)
            labels = torch.cat([labels, labels.new_zeros(neg.size(1))])
        logits = self.score(h, pairs)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        self._log(f"{stage}/loss", loss, 1, prog_bar=stage != "train")
        if stage != "train":
            auroc = getattr(self, f"{stage}_auroc")
            auroc.update(logits, labels.long())
            self._log(f"{stage}/auroc", auroc, 1, prog_bar=True)
        return loss


class GraphPredictor(GNNTask):
    """One output per graph of a batch: an MLP on the readout (sum, mean or max over the nodes of
    each graph) of the node embeddings, (B, D) -> (B, C) class scores (task
    "graph_classification": cross-entropy, accuracy) or (B, T) targets ("graph_regression": mean
    squared error of the standardised targets; RMSE and MAE logged in the targets' units).

    head="layers" is the readout of Xu et al. (2019): y = Σ_{l=0..L} Dropout(W_l r(h^(l)) + b_l)
    over the input features h^(0) = x and every layer's embeddings, whatever jk says; as in
    their code, the dropout acts on each layer's scores, "after the dense layer". head="mlp"
    drops the readout's inputs. head_dropout (None: dropout) is the rate in either head."""

    def __init__(
        self,
        task: str,
        in_channels: int,
        out_channels: int,
        net: dict,
        optim: dict,
        edge_channels: int = 0,
        target_mean: list[float] | None = None,
        target_std: list[float] | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        cfg = GNNConfig(**net)
        _check("head", cfg.head, HEADS)
        self.net = GNN(cfg, in_channels, edge_channels=edge_channels)
        p = cfg.dropout if cfg.head_dropout is None else cfg.head_dropout
        if cfg.head == "mlp":
            d = self.net.embedding_dim
            self.head = nn.Sequential(nn.Dropout(p), mlp(d, cfg.hidden, out_channels))
        else:  # one W_l per layer: h^(0) = x (F wide), then the L hidden layers (W wide)
            width = cfg.hidden * cfg.heads if cfg.layer == "gat" else cfg.hidden
            dims = [in_channels] + [width] * len(self.net.layers)
            self.head = nn.ModuleList(nn.Linear(d, out_channels) for d in dims)
            self.head_drop = nn.Dropout(p)
        self.regression = task == "graph_regression"
        if self.regression:
            mean = torch.tensor(target_mean or [0.0] * out_channels)
            std = torch.tensor(target_std or [1.0] * out_channels)
            self.register_buffer("target_mean", mean)  # (T,)
            self.register_buffer("target_std", std)  # (T,)
        metrics = {}  # one per stage and name, as Lightning needs
        for stage in ("train", "val", "test"):
            if self.regression:
                metrics[f"{stage}_rmse"] = MeanSquaredError(squared=False)
                metrics[f"{stage}_mae"] = MeanAbsoluteError()
            else:
                metrics[f"{stage}_acc"] = Accuracy(task="multiclass", num_classes=out_channels)
        self.metrics = nn.ModuleDict(metrics)

    def forward(self, batch) -> Tensor:
        """A PyG Batch of B graphs -> (B, C) logits, or (B, T) predictions in the targets' units."""
        readout = POOLS[self.net.cfg.readout]
        if self.net.cfg.head == "mlp":
            h = self.net(**graph_inputs(batch))  # (N, D)
            out = self.head(readout(h, batch.batch, size=batch.num_graphs))
        else:
            hs = [batch.x, *self.net.embeddings(**graph_inputs(batch))]  # h^(0), ..., h^(L)
            out = sum(
                self.head_drop(w(readout(h, batch.batch, size=batch.num_graphs)))  # (B, C)
                for w, h in zip(self.head, hs, strict=True)
            )
        return out * self.target_std + self.target_mean if self.regression else out

    def _step(self, batch, stage: str) -> Tensor:
        out, y, b = self(batch), batch.y, batch.num_graphs
        if self.regression:
            y = y.view(b, -1).to(out.dtype)  # (B, T)
            loss = F.mse_loss(out / self.target_std, y / self.target_std)  # standardised
            names = ("rmse", "mae")
        else:
            loss = F.cross_entropy(out, y)
            names = ("acc",)
        self._log(f"{stage}/loss", loss, b, prog_bar=stage != "train")
        for name in names:
            metric = self.metrics[f"{stage}_{name}"]
            metric.update(out, y)
            self._log(f"{stage}/{name}", metric, b, prog_bar=stage != "train")
        return loss


TASKS = {
    "node": NodeClassifier,
    "link": LinkPredictor,
    "graph_classification": GraphPredictor,
    "graph_regression": GraphPredictor,
}


def gnn_task(task: str, by_task: dict | None = None, **kwargs) -> GNNTask:
    """The LightningModule for `task`, which the data module names (data.task or task=...).

    by_task = {"node": {"net": {...}, "optim": {...}}, "graph": {...}}: the values of the net and
    optim settings left None (null in the config) for node and link tasks (one graph, trained
    full-batch) and for graph tasks (datasets of small graphs), whose good recipes differ."""
    _check("task", task, tuple(TASKS))
    cls = TASKS[task]
    family = "graph" if cls is GraphPredictor else "node"
    for group, defaults in ((by_task or {}).get(family) or {}).items():
        given = kwargs[group]
        kwargs[group] = {**given, **{k: v for k, v in defaults.items() if given.get(k) is None}}
    if cls is GraphPredictor:
        return cls(task=task, **kwargs)
    kwargs.pop("edge_channels", None)  # node and link tasks read x and edge_index only
    return cls(**kwargs)


def adam(model: nn.Module, o: dict) -> torch.optim.Adam:
    """Adam over the parameters of `model` (a GNN or a task holding one) with L2 regularisation
    (coupled weight decay, as both papers add λ/2 ||w||² to the loss) on every parameter, or, with
    decay="first", on the GNN's first layer's only (Kipf & Welling)."""
    decay = o.get("decay", "all")
    if decay not in ("all", "first"):
        raise PipelineError(f"unknown model.optim.decay {decay!r}; choose all or first")
    net = next(m for m in model.modules() if isinstance(m, GNN))
    first = net.layers[0] if len(net.layers) else net.readout
    decayed = {id(p) for p in (first if decay == "first" else model).parameters()}
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if id(p) in decayed], "weight_decay": o["weight_decay"]},
        {"params": [p for p in params if id(p) not in decayed], "weight_decay": 0.0},
    ]
    return torch.optim.Adam([g for g in groups if g["params"]], lr=o["lr"])
