"""Graph neural network layers (Bishop, Deep Learning, sec. 13.2-13.3).

A layer updates every node n from its own embedding h_n and its neighbourhood N(n) (sec. 13.2):

    z_n  = Aggregate({h_m : m ∈ N(n)})                     (sum, mean, max, min, symmetric, MLP)
    h_n' = f(W_self h_n + W_neigh z_n + b)                  (the update operator, sec. 13.2.4)

Aggregation ignores the order of the neighbours, so a layer is equivariant to permutations of the
nodes: f(P X, P A P^T) = P f(X, A). The general graph networks of sec. 13.3 weigh neighbours by
attention (GATLayer) and also carry edge embeddings e_nm and a graph embedding g
(GraphNetworkLayer).

Conventions are PyG's: edge_index (2, E) lists edges m -> n as columns (source m, target n), so
messages flow to `edge_index[1]`; in `message`, x_j is the neighbour h_m and x_i the node h_n.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import add_remaining_self_loops, degree, scatter, softmax

from src.nn.activations import activation_layer


def mlp(
    d_in: int, d_hidden: int, d_out: int, act: str = "relu", final_act: bool = False
) -> nn.Sequential:
    """Two-layer MLP, the learnable function inside every layer below."""
    layers = [nn.Linear(d_in, d_hidden), activation_layer(act), nn.Linear(d_hidden, d_out)]
    return nn.Sequential(*layers, activation_layer(act) if final_act else nn.Identity())


class MessagePassingLayer(MessagePassing):
    """The chapter's general message-passing layer (sec. 13.2.3-13.2.4).

    aggr: how z_n summarises the neighbours:
        "sum"        z_n = Σ_m h_m
        "mean"       z_n = Σ_m h_m / |N(n)|
        "max", "min" elementwise over the neighbours' W_neigh h_m (GraphSAGE's pooling
                     aggregator, Hamilton et al. 2017), not over the raw h_m
        "symmetric"  z_n = Σ_m h_m / sqrt(|N(n)| |N(m)|)
        "mlp"        z_n = MLP_θ(Σ_m MLP_φ(h_m)), a learnable aggregation that can approximate
                     any permutation-invariant function of the neighbours (Deep Sets); φ and θ
                     are D_out wide, and φ(h_m) is computed once per node, not once per edge
    A node without neighbours gets z_n = 0 (for max and min too, not ±inf).

    shared_weights=True is the simplified layer that counts n among its own neighbours and uses
    one matrix, h_n' = f(W_neigh Aggregate({h_m : m ∈ N(n) ∪ {n}}) + b); with "symmetric" this is
    the graph convolutional network of Kipf & Welling (GCNLayer).
    """

    AGGREGATIONS = ("sum", "mean", "max", "min", "symmetric", "mlp")

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        aggr: str = "sum",
        shared_weights: bool = False,
        activation: str = "relu",
        bias: bool = True,
    ):
        if aggr not in self.AGGREGATIONS:
            raise ValueError(f"unknown aggregation {aggr!r}; choose one of {self.AGGREGATIONS}")
        # symmetric and mlp are sums of transformed messages
        super().__init__(aggr="sum" if aggr in ("symmetric", "mlp") else aggr)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.aggregation, self.shared_weights = aggr, shared_weights
        self.mlp_phi = self.mlp_theta = None
        d_z = in_channels  # the width of z_n
        if aggr == "mlp":
            d_z = out_channels
            self.mlp_phi = mlp(in_channels, d_z, d_z)
            self.mlp_theta = mlp(d_z, d_z, d_z)
        # b lives in W_neigh; W_self adds no second bias
        self.w_self = None if shared_weights else nn.Linear(in_channels, out_channels, bias=False)
        self.w_neigh = nn.Linear(d_z, out_channels, bias=bias)
        self.act = activation_layer(activation)

    def forward(self, h: Tensor, edge_index: Tensor) -> Tensor:
        """h: (N, D_in), edge_index: (2, E) -> (N, D_out)."""
        n = h.size(0)
        if self.shared_weights:
            edge_index, _ = add_remaining_self_loops(edge_index, num_nodes=n)
        norm = None
        if self.aggregation == "symmetric":
            src, dst = edge_index
            deg = degree(dst, n, dtype=h.dtype)  # |N(n)|
            inv_sqrt = deg.pow(-0.5).masked_fill(deg == 0, 0.0)  # 0, not inf, for isolated nodes
            norm = inv_sqrt[src] * inv_sqrt[dst]  # (E,)
        # W_neigh commutes with the linear aggregations: when it narrows the features, apply it
        # first, so that the E messages are D_out wide rather than D_in (GCN on Cora: 16, not
        # 1433). Max and min always take W_neigh h_m (GraphSAGE's pooling): of raw one-hot or
        # bag-of-words features the max is only their union and the min mostly 0
        linear = self.aggregation in ("sum", "mean", "symmetric")
        early = self.aggregation in ("max", "min") or (
            linear and self.out_channels < self.in_channels
        )
        if self.mlp_phi is not None:
            x = self.mlp_phi(h)  # (N, D_out)
        else:
            x = F.linear(h, self.w_neigh.weight) if early else h
        z = self.propagate(edge_index, x=x, norm=norm)  # (N, D_out) if early or mlp, else (N, D_in)
        if self.mlp_theta is not None:
            z = self.mlp_theta(z)
        if not early:
            out = self.w_neigh(z)
        else:
            out = z if self.w_neigh.bias is None else z + self.w_neigh.bias
        if self.w_self is not None:
            out = out + self.w_self(h)
        return self.act(out)

    def message(self, x_j: Tensor, norm: Tensor | None) -> Tensor:  # (E, D) -> (E, D)
        return x_j if norm is None else norm[:, None] * x_j

    def __repr__(self) -> str:  # PyG's repr would show the base aggregation, "sum", for symmetric
        return (
            f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
            f"aggr={self.aggregation!r}, shared_weights={self.shared_weights})"
        )


class GCNLayer(MessagePassingLayer):
    """Graph convolution (Kipf & Welling 2017; sec. 13.2.2): H' = f(D^-1/2 (A + I) D^-1/2 H W + b),
    where D counts the neighbours of A + I. It is the shared-weight layer with the symmetric
    aggregation, so it matches torch_geometric.nn.GCNConv given the same W and b."""

    def __init__(
        self, in_channels: int, out_channels: int, activation: str = "none", bias: bool = True
    ):
        super().__init__(
            in_channels,
            out_channels,
            aggr="symmetric",
            shared_weights=True,
            activation=activation,
            bias=bias,
        )


class GINLayer(MessagePassing):
    """Graph isomorphism network layer (Xu et al. 2019): h_n' = MLP((1 + ε) h_n + Σ_m h_m).

    The sum keeps multisets of neighbours apart (a mean or max cannot tell {a, a} from {a}), and
    the MLP after it is injective enough that GIN separates graphs as well as the
    Weisfeiler-Lehman test. ε is learned with train_eps=True, else 0 (GIN-0, the paper's best).
    The MLP is Linear -> BatchNorm -> f -> Linear, as in the paper.

    With edge_channels > 0 the bonds of a molecule, say, enter the messages (GINE, Hu et al.
    2020): h_n' = MLP((1 + ε) h_n + Σ_m f(h_m + W_e e_nm + b_e)), W_e mapping the edge
    features e_nm (D_e) to the width of h.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        train_eps: bool = False,
        batch_norm: bool = True,
        activation: str = "relu",
        edge_channels: int = 0,
    ):
        super().__init__(aggr="sum")
        self.eps = nn.Parameter(torch.zeros(1), requires_grad=train_eps)
        self.mlp = nn.Sequential(
            nn.Linear(in_channels, out_channels),
            nn.BatchNorm1d(out_channels) if batch_norm else nn.Identity(),
            activation_layer(activation),
            nn.Linear(out_channels, out_channels),
        )
        self.w_edge = nn.Linear(edge_channels, in_channels) if edge_channels else None
        self.act = activation_layer(activation)

    def forward(self, h: Tensor, edge_index: Tensor, edge_attr: Tensor | None = None) -> Tensor:
        """h: (N, D_in), edge_index: (2, E), edge_attr: (E, D_e) or None -> (N, D_out)."""
        if (self.w_edge is None) != (edge_attr is None):
            raise ValueError("GINLayer: edge_attr must be given exactly when edge_channels > 0")
        e = None if edge_attr is None else self.w_edge(edge_attr)  # W_e e_nm: (E, D_in)
        z = self.propagate(edge_index, x=h, e=e)  # Σ_m h_m or Σ_m f(h_m + W_e e_nm): (N, D_in)
        return self.mlp((1 + self.eps) * h + z)

    def message(self, x_j: Tensor, e: Tensor | None) -> Tensor:
        return x_j if e is None else self.act(x_j + e)


class GATLayer(MessagePassing):
    """Graph attention (Veličković et al. 2018; sec. 13.3.1): z_n = Σ_m A_nm W h_m, where the
    attention weights are a softmax over the neighbourhood of n,

        A_nm = exp(a(h_n, h_m)) / Σ_{m' ∈ N(n)} exp(a(h_n, h_m')),

    and the score a(·, ·) is one of the chapter's two forms:
        score="bilinear"  a(h_n, h_m) = h_n^T W_a h_m
        score="mlp"       a(h_n, h_m) = LeakyReLU(a^T [W h_n || W h_m])     (Veličković et al.)

    H heads each have their own W (and W_a or a); their outputs are concatenated, (N, H C), or
    averaged, (N, C). Self-loops let a node attend to itself, as in the original GAT.
    """

    SCORES = ("bilinear", "mlp")

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        score: str = "mlp",
        dropout: float = 0.0,
        negative_slope: float = 0.2,
        add_self_loops: bool = True,
        bias: bool = True,
    ):
        if score not in self.SCORES:
            raise ValueError(f"unknown score {score!r}; choose one of {self.SCORES}")
        # Σ_m A_nm W h_m (the weights already normalise); nodes index dim 0 of (N, H, C) tensors
        super().__init__(aggr="sum", node_dim=0)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.heads, self.concat, self.score = heads, concat, score
        self.dropout, self.negative_slope = dropout, negative_slope
        self.add_self_loops = add_self_loops
        self.w = nn.Linear(in_channels, heads * out_channels, bias=False)
        if score == "mlp":
            # a^T [W h_n || W h_m] = a_n^T W h_n + a_m^T W h_m: score each node once, not each edge
            self.a_n = nn.Parameter(torch.empty(heads, out_channels))
            self.a_m = nn.Parameter(torch.empty(heads, out_channels))
            nn.init.xavier_uniform_(self.a_n)
            nn.init.xavier_uniform_(self.a_m)
        else:
            self.w_a = nn.Parameter(torch.empty(heads, in_channels, in_channels))
            nn.init.xavier_uniform_(self.w_a)
        d_out = heads * out_channels if concat else out_channels
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None

    def forward(
        self, h: Tensor, edge_index: Tensor, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """h: (N, D_in), edge_index: (2, E) -> (N, H C) or (N, C); with return_attention also
        (edge_index, A) where A: (E', H) holds A_nm for the edges used (self-loops included)."""
        n, heads, c = h.size(0), self.heads, self.out_channels
        if self.add_self_loops:
            edge_index, _ = add_remaining_self_loops(edge_index, num_nodes=n)
        x = self.w(h).view(n, heads, c)  # W h, per head: (N, H, C)
        if self.score == "mlp":
            q, k = (x * self.a_n).sum(-1), (x * self.a_m).sum(-1)  # (N, H) each
        else:
            q, k = torch.einsum("nd,hde->nhe", h, self.w_a), h[:, None, :]  # h_n^T W_a, h_m
        alpha = self.edge_updater(edge_index, q=q, k=k)  # (E', H)
        out = self.propagate(edge_index, x=x, alpha=alpha)  # (N, H, C)
        out = out.reshape(n, heads * c) if self.concat else out.mean(dim=1)
        if self.bias is not None:
            out = out + self.bias
        return (out, (edge_index, alpha)) if return_attention else out

    def edge_update(
        self, q_i: Tensor, k_j: Tensor, index: Tensor, ptr: Tensor | None, size_i: int | None
    ) -> Tensor:
        if self.score == "mlp":
            e = F.leaky_relu(q_i + k_j, self.negative_slope)  # (E, H)
        else:
            e = (q_i * k_j).sum(-1)  # h_n^T W_a h_m: (E, H)
        alpha = softmax(e, index, ptr, size_i)  # normalised over the edges into each node n
        return F.dropout(alpha, self.dropout, self.training)

    def message(self, x_j: Tensor, alpha: Tensor) -> Tensor:  # (E, H, C) -> (E, H, C)
        return alpha[..., None] * x_j


class GraphNetworkLayer(MessagePassing):
    """A full graph network block (Battaglia et al. 2018; sec. 13.3.2-13.3.3) with edge embeddings
    e_nm and a graph embedding g, updated in turn:

        e_nm' = f_e(e_nm, h_n, h_m, g)
        h_n'  = f_v(h_n, Aggregate_m e_nm', g)
        g'    = f_g(g, Aggregate_n h_n', Aggregate_nm e_nm')

    f_e, f_v, f_g are two-layer MLPs; the widths of h, e and g are kept so that layers stack.
    Batched graphs (PyG's Batch) share one call: `batch` (N,) maps each node to its graph, and
    each edge belongs to the graph of its source node.
    """

    def __init__(
        self,
        node_channels: int,
        edge_channels: int,
        global_channels: int,
        hidden_channels: int = 64,
        aggr: str = "sum",
        activation: str = "relu",
    ):
        if aggr not in ("sum", "mean", "max", "min"):
            raise ValueError(f"unknown aggregation {aggr!r}; choose sum, mean, max or min")
        super().__init__(aggr=aggr)
        dv, de, dg = node_channels, edge_channels, global_channels
        self.f_e = mlp(de + 2 * dv + dg, hidden_channels, de, activation)
        self.f_v = mlp(dv + de + dg, hidden_channels, dv, activation)
        self.f_g = mlp(dg + dv + de, hidden_channels, dg, activation)

    def forward(
        self,
        h: Tensor,
        edge_index: Tensor,
        e: Tensor,
        g: Tensor,
        batch: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """h: (N, D_v), edge_index: (2, E), e: (E, D_e), g: (B, D_g), batch: (N,) graph of each
        node (None: one graph) -> (h', e', g') of the same shapes."""
        if batch is None:
            batch = h.new_zeros(h.size(0), dtype=torch.long)
        edge_batch = batch[edge_index[0]]  # (E,)
        e = self.edge_updater(edge_index, h=h, e=e, g_e=g[edge_batch])  # (E, D_e)
        z = self.propagate(
            edge_index, e=e, size=(h.size(0), h.size(0))
        )  # Aggregate_m e_nm': (N, D_e)
        h = self.f_v(torch.cat([h, z, g[batch]], dim=-1))  # (N, D_v)
        b = g.size(0)
        h_g = scatter(h, batch, dim=0, dim_size=b, reduce=self.aggr)  # (B, D_v)
        e_g = scatter(e, edge_batch, dim=0, dim_size=b, reduce=self.aggr)  # (B, D_e)
        return h, e, self.f_g(torch.cat([g, h_g, e_g], dim=-1))

    def edge_update(self, e: Tensor, h_i: Tensor, h_j: Tensor, g_e: Tensor) -> Tensor:
        return self.f_e(torch.cat([e, h_i, h_j, g_e], dim=-1))

    def message(self, e: Tensor) -> Tensor:  # the message from m to n is the new e_nm
        return e
