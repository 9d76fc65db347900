"""Node classification with a graph neural network (Bishop, sec. 13.1-13.3).

L message-passing layers turn the node features x into node embeddings,

    h^(0) = x,    h^(l) = f(Layer_l(dropout(h^(l-1)), A))  [+ h^(l-1) where the widths match]

and the class scores y_n of node n (logits; softmax in the loss) come either from the last layer,
which maps to the C classes (jk="none"), or, with "jumping knowledge" (Xu et al. 2018; sec.
13.2.5; jk="cat"), from a linear map of every layer's embedding of the node,

    y_n = W [h_n^(1) ⊕ h_n^(2) ⊕ ... ⊕ h_n^(L)] + b.

Layer_l is one of src/nn/message_passing.py: "gcn" (Kipf & Welling 2017), "gat" (Veličković et
al. 2018: H heads concatenated in hidden layers, averaged in the output layer) or "mpnn" (the
chapter's general layer, W_self h_n + W_neigh Aggregate_m h_m, with a chosen aggregation).
Dropout acts on every layer's input, as in both papers.

Training is transductive and full-batch: each step runs the whole graph and the cross-entropy
counts the labelled training nodes only; validation and test read other nodes of the same pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Accuracy

from src.nn.activations import activation_layer
from src.nn.message_passing import GATLayer, GCNLayer, MessagePassingLayer
from src.utils.checkpoint import class_path
from src.utils.errors import PipelineError

LAYERS = ("gcn", "gat", "mpnn")
JK = ("none", "cat")


@dataclass
class GNNConfig:
    layer: str = "gcn"  # gcn | gat | mpnn
    hidden: int = 16  # width of the hidden embeddings (per head for GAT)
    num_layers: int = 2  # message-passing layers, the output layer included when jk="none"
    dropout: float = 0.5  # on the input of every layer (and of the jk readout)
    activation: str = "relu"  # f, after every hidden layer (not after the output layer)
    residual: bool = False  # h^(l) = f(...) + h^(l-1) in layers whose input and output widths match
    jk: str = "none"  # none | cat (jumping knowledge: a linear readout of h^(1) ⊕ ... ⊕ h^(L))
    heads: int = 1  # gat: heads of the hidden layers, concatenated: width heads * hidden
    out_heads: int = 1  # gat: heads of the output layer, averaged
    attn_dropout: float = 0.0  # gat: dropout on the attention weights A_nm
    aggr: str = "mean"  # mpnn: sum | mean | max | min | symmetric | mlp


class GNN(nn.Module):
    """(x (N, F), edge_index (2, E)) -> class logits (N, C)."""

    def __init__(self, cfg: GNNConfig, in_channels: int, num_classes: int):
        super().__init__()
        if cfg.layer not in LAYERS:
            raise PipelineError(f"unknown layer {cfg.layer!r}; choose one of {LAYERS}")
        if cfg.jk not in JK:
            raise PipelineError(f"unknown jk {cfg.jk!r}; choose one of {JK}")
        if cfg.num_layers < 1:
            raise PipelineError(f"num_layers={cfg.num_layers}: a GNN needs at least one layer")
        self.cfg = cfg
        width = cfg.hidden * cfg.heads if cfg.layer == "gat" else cfg.hidden  # W
        n_hidden = cfg.num_layers if cfg.jk == "cat" else cfg.num_layers - 1
        dims = [in_channels] + [width] * n_hidden
        self.layers = nn.ModuleList(self._layer(d, cfg.hidden, output=False) for d in dims[:-1])
        self.residual = [cfg.residual and d == width for d in dims[:-1]]
        if cfg.jk == "cat":
            self.readout = nn.Linear(n_hidden * width, num_classes)  # W: (L W) -> C
        else:
            self.readout = self._layer(dims[-1], num_classes, output=True)
        self.act = activation_layer(cfg.activation)
        self.drop = nn.Dropout(cfg.dropout)
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
            return GATLayer(d_in, d_out, heads=heads, concat=not output, dropout=c.attn_dropout)
        return MessagePassingLayer(d_in, d_out, aggr=c.aggr, activation="none")

    def _dropout(self, h: Tensor, is_input: bool) -> Tensor:
        if is_input:  # the node features: often sparse bag-of-words
            return input_dropout(h, self.cfg.dropout, self.training)
        return self.drop(h)

    def embeddings(self, x: Tensor, edge_index: Tensor) -> list[Tensor]:
        """x: (N, F) -> the hidden layers' embeddings [h^(1), ..., h^(L')], each (N, W)."""
        hs, h = [], x
        for layer, residual in zip(self.layers, self.residual, strict=True):
            z = self.act(layer(self._dropout(h, is_input=not hs), edge_index))  # (N, W)
            h = h + z if residual else z
            hs.append(h)
        return hs

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """x: (N, F), edge_index: (2, E) -> logits (N, C)."""
        hs = self.embeddings(x, edge_index)
        if self.cfg.jk == "cat":
            return self.readout(self.drop(torch.cat(hs, dim=-1)))  # (N, L W) -> (N, C)
        h = hs[-1] if hs else x  # (N, W), or (N, F) for a one-layer model
        return self.readout(self._dropout(h, is_input=not hs), edge_index)  # (N, C)


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


class NodeClassifier(pl.LightningModule):
    """Trains a GNN on the labelled nodes of one graph with Adam and L2 weight decay; logs loss
    and accuracy of the train, val and test nodes."""

    def __init__(self, in_channels: int, num_classes: int, net: dict, optim: dict):
        super().__init__()
        self.save_hyperparameters()
        self.net = GNN(GNNConfig(**net), in_channels, num_classes)
        # one metric per stage (train/acc: on the training pass, dropout active, as the papers)
        self.train_acc = Accuracy(task="multiclass", num_classes=num_classes)
        self.val_acc = Accuracy(task="multiclass", num_classes=num_classes)
        self.test_acc = Accuracy(task="multiclass", num_classes=num_classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.net(x, edge_index)

    def loss(self, batch, stage: str) -> tuple[Tensor, Tensor, Tensor]:
        """Cross-entropy over the nodes of `<stage>_mask` only -> (loss, logits (M, C), y (M,))."""
        logits = self.net(batch.x, batch.edge_index)  # (N, C): all nodes pass through the GNN
        mask = batch[f"{stage}_mask"]  # (N,) bool, M of them true
        logits, y = logits[mask], batch.y[mask]  # (M, C), (M,)
        return F.cross_entropy(logits, y), logits, y

    def _step(self, batch, stage: str) -> Tensor:
        loss, logits, y = self.loss(batch, stage)
        acc = getattr(self, f"{stage}_acc")
        acc(logits, y)
        # one graph = one batch: batch_size=1 spares Lightning guessing it from a Data object
        self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True, batch_size=1,
                 prog_bar=stage != "train")  # fmt: skip
        self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, batch_size=1, prog_bar=True)
        return loss

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss = self._step(batch, "train")
        if not torch.isfinite(loss):
            raise PipelineError(
                f"training loss became {loss.item()} at step {self.global_step}; "
                "lower model.optim.lr or check the data"
            )
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._step(batch, "test")

    def configure_optimizers(self) -> torch.optim.Adam:
        return adam(self.net, self.hparams.optim)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["model_class"] = class_path(self)


def adam(net: GNN, o: dict) -> torch.optim.Adam:
    """Adam with L2 regularisation (coupled weight decay, as both papers add λ/2 ||w||² to the
    loss) on every parameter, or, with decay="first", on the first layer's only (Kipf & Welling)."""
    decay = o.get("decay", "all")
    if decay not in ("all", "first"):
        raise PipelineError(f"unknown model.optim.decay {decay!r}; choose all or first")
    first = net.layers[0] if len(net.layers) else net.readout
    decayed = {id(p) for p in (first if decay == "first" else net).parameters()}
    params = list(net.parameters())
    groups = [
        {"params": [p for p in params if id(p) in decayed], "weight_decay": o["weight_decay"]},
        {"params": [p for p in params if id(p) not in decayed], "weight_decay": 0.0},
    ]
    return torch.optim.Adam([g for g in groups if g["params"]], lr=o["lr"])
