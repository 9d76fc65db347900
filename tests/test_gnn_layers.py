"""The graph layers of Bishop ch. 13 checked on small random graphs: permutation equivariance of
node (and edge) outputs and invariance of graph readouts, every aggregation against a dense
adjacency-matrix reference, GCN against PyG's GCNConv, GAT's attention weights, E(n)-equivariance
of EGNN, and batching of the graph network layer."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GCNConv, global_add_pool, global_max_pool, global_mean_pool
from torch_geometric.utils import scatter

from src.nn.egnn import EGNNLayer
from src.nn.message_passing import (
    GATLayer,
    GCNLayer,
    GINLayer,
    GraphNetworkLayer,
    MessagePassingLayer,
)

N, D, C = 7, 5, 4  # nodes, input width, output width
DT = torch.float64
TOL = dict(atol=1e-10, rtol=1e-8)
POOLS = (global_add_pool, global_mean_pool, global_max_pool)


pytestmark = pytest.mark.usefixtures("seeded", "one_thread")


def random_graph(n: int = N, p: float = 0.5) -> Tensor:
    """edge_index (2, E) of a random undirected graph without self-loops, in random edge order;
    the last node is isolated, and node 0 has at least one neighbour."""
    upper = torch.rand(n, n).triu(diagonal=1) > 1 - p
    upper[0, 1] = True
    upper[:, -1] = upper[-1, :] = False
    src, dst = upper.nonzero().T
    edge_index = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], dim=1)
    return edge_index[:, torch.randperm(edge_index.size(1))]


def dense_adjacency(edge_index: Tensor, n: int = N) -> Tensor:
    """A[n, m] = 1 for each edge m -> n (messages flow to edge_index[1])."""
    a = torch.zeros(n, n, dtype=DT)
    a[edge_index[1], edge_index[0]] = 1.0
    return a


def relabel(perm: Tensor, edge_index: Tensor, edge_perm: Tensor) -> Tensor:
    """edge_index of the graph whose node i is old node perm[i], with edges reordered by edge_perm:
    the sparse form of P A P^T."""
    inverse = torch.argsort(perm)
    return inverse[edge_index[:, edge_perm]]


def features(*shape: int) -> Tensor:
    return torch.randn(*shape, dtype=DT)


# ---- node-level layers: permutation equivariance and invariant readouts ----------------------


def mp_layer(aggr: str, shared: bool) -> MessagePassingLayer:
    return MessagePassingLayer(D, C, aggr=aggr, shared_weights=shared).to(DT).eval()


NODE_LAYERS = {
    **{
        f"mp-{aggr}-{'shared' if shared else 'self+neigh'}": (
            lambda aggr=aggr, shared=shared: mp_layer(aggr, shared)
        )
        for aggr in MessagePassingLayer.AGGREGATIONS
        for shared in (False, True)
    },
    "gcn": lambda: GCNLayer(D, C).to(DT).eval(),
    "gin": lambda: GINLayer(D, C, train_eps=True).to(DT).eval(),
    **{
        f"gat-{score}-{'concat' if concat else 'mean'}": (
            lambda score=score, concat=concat: (
                GATLayer(D, C, heads=3, concat=concat, score=score).to(DT).eval()
            )
        )
        for score in GATLayer.SCORES
        for concat in (True, False)
    },
}


@pytest.mark.parametrize("name", list(NODE_LAYERS))
def test_permutation_equivariance_and_invariant_readout(name: str) -> None:
    layer = NODE_LAYERS[name]()
    h, edge_index = features(N, D), random_graph()
    perm, edge_perm = torch.randperm(N), torch.randperm(edge_index.size(1))
    out = layer(h, edge_index)
    out_p = layer(h[perm], relabel(perm, edge_index, edge_perm))
    torch.testing.assert_close(out_p, out[perm], **TOL)  # f(PX, PAP^T) = P f(X, A)
    for pool in POOLS:
        torch.testing.assert_close(pool(out_p, None), pool(out, None), **TOL)


# ---- each aggregation against a dense adjacency-matrix reference -----------------------------


def dense_aggregate(layer: MessagePassingLayer, a: Tensor, h: Tensor) -> Tensor:
    """z_n of every node from the dense adjacency A (N, N), written independently of PyG (for
    max and min: of the messages W_neigh h_m)."""
    deg = a.sum(dim=1)  # |N(n)|
    has_neigh = (deg > 0)[:, None]
    aggr = layer.aggregation
    if aggr == "sum":
        return a @ h
    if aggr == "mean":
        return (a @ h) / deg.clamp(min=1)[:, None]  # D^-1 A H
    if aggr == "symmetric":
        d = torch.where(deg > 0, deg.rsqrt(), torch.zeros_like(deg))
        return (d[:, None] * a * d[None, :]) @ h  # D^-1/2 A D^-1/2 H
    if aggr == "mlp":
        return layer.mlp_theta(a @ layer.mlp_phi(h))
    fill = float("-inf") if aggr == "max" else float("inf")
    h = h @ layer.w_neigh.weight.T  # max and min pool the transformed messages W_neigh h_m
    rows = h[None, :, :].masked_fill(a[:, :, None] == 0, fill)  # (N, N, D), non-neighbours out
    z = rows.amax(dim=1) if aggr == "max" else rows.amin(dim=1)
    return torch.where(has_neigh, z, torch.zeros_like(z))  # nodes without neighbours get 0


def test_gin_matches_dense_reference() -> None:
    """h' = MLP((1 + ε) H + A H), with a non-zero ε and BatchNorm in its running-stats mode."""
    layer = GINLayer(D, C, train_eps=True).to(DT).eval()
    with torch.no_grad():
        layer.eps.fill_(0.3)
    h, edge_index = features(N, D), random_graph()
    expected = layer.mlp(1.3 * h + dense_adjacency(edge_index) @ h)
    torch.testing.assert_close(layer(h, edge_index), expected, **TOL)
    assert GINLayer(D, C).eps.requires_grad is False  # GIN-0


def test_gine_edge_features_match_dense_reference() -> None:
    """h' = MLP((1 + ε) h_n + Σ_m ReLU(h_m + W_e e_nm + b_e)) (GINE), from a dense (N, N, D_e)
    tensor of edge features; without edge_attr the layer refuses, as GIN refuses one."""
    d_e = 3
    layer = GINLayer(D, C, train_eps=True, edge_channels=d_e).to(DT).eval()
    with torch.no_grad():
        layer.eps.fill_(0.3)
    h, edge_index = features(N, D), random_graph()
    edge_attr = features(edge_index.size(1), d_e)
    dense_e = torch.zeros(N, N, d_e, dtype=DT)
    dense_e[edge_index[1], edge_index[0]] = edge_attr  # e_nm of the edge m -> n at [n, m]
    messages = torch.relu(h[None, :, :] + layer.w_edge(dense_e))  # (N, N, D): from m to n
    z = (dense_adjacency(edge_index)[:, :, None] * messages).sum(dim=1)
    expected = layer.mlp(1.3 * h + z)
    torch.testing.assert_close(layer(h, edge_index, edge_attr), expected, **TOL)
    with pytest.raises(ValueError, match="edge_attr"):
        layer(h, edge_index)
    with pytest.raises(ValueError, match="edge_attr"):
        GINLayer(D, C).to(DT)(h, edge_index, edge_attr)


@pytest.mark.parametrize("shared", [False, True], ids=["self+neigh", "shared"])
@pytest.mark.parametrize("aggr", MessagePassingLayer.AGGREGATIONS)
def test_aggregation_matches_dense_reference(aggr: str, shared: bool) -> None:
    layer = mp_layer(aggr, shared)
    h, edge_index = features(N, D), random_graph()
    a = dense_adjacency(edge_index)
    if shared:  # the simplified layer counts n among its own neighbours
        a = a + torch.eye(N, dtype=DT)
    z = dense_aggregate(layer, a, h)
    neigh = z + layer.w_neigh.bias if aggr in ("max", "min") else layer.w_neigh(z)
    pre = neigh if shared else layer.w_self(h) + neigh
    out = layer(h, edge_index)
    torch.testing.assert_close(out, torch.relu(pre), **TOL)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("aggr", ["sum", "mean", "max", "min", "symmetric"])
def test_isolated_node_gets_zero_aggregate(aggr: str) -> None:
    layer = MessagePassingLayer(D, C, aggr=aggr, activation="none").to(DT)
    h = features(N, D)
    out = layer(h, random_graph())
    torch.testing.assert_close(out[-1], layer.w_self(h[-1]) + layer.w_neigh.bias, **TOL)


def test_invalid_choices_raise() -> None:
    with pytest.raises(ValueError, match="aggregation"):
        MessagePassingLayer(D, C, aggr="median")
    with pytest.raises(ValueError, match="activation"):
        MessagePassingLayer(D, C, activation="swish-ish")
    with pytest.raises(ValueError, match="score"):
        GATLayer(D, C, score="cosine")
    with pytest.raises(ValueError, match="aggregation"):
        GraphNetworkLayer(D, 2, 3, aggr="mlp")


# ---- GCN ----------------------------------------------------------------------------------------


def test_gcn_matches_pyg_and_dense_reference() -> None:
    layer = GCNLayer(D, C).to(DT)
    conv = GCNConv(D, C).to(DT)
    with torch.no_grad():
        conv.lin.weight.copy_(layer.w_neigh.weight)
        conv.bias.copy_(layer.w_neigh.bias)
    h, edge_index = features(N, D), random_graph()
    out = layer(h, edge_index)
    torch.testing.assert_close(out, conv(h, edge_index), **TOL)

    a = dense_adjacency(edge_index) + torch.eye(N, dtype=DT)
    d = a.sum(dim=1).rsqrt()
    dense = (d[:, None] * a * d[None, :]) @ h @ layer.w_neigh.weight.T + layer.w_neigh.bias
    torch.testing.assert_close(out, dense, **TOL)


# ---- GAT ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("self_loops", [True, False], ids=["self-loops", "no-self-loops"])
@pytest.mark.parametrize("score", GATLayer.SCORES)
def test_gat_attention_normalised_and_matches_dense(score: str, self_loops: bool) -> None:
    heads = 3
    layer = GATLayer(D, C, heads=heads, score=score, add_self_loops=self_loops).to(DT).eval()
    h, edge_index = features(N, D), random_graph()
    out, (edges, alpha) = layer(h, edge_index, return_attention=True)
    assert alpha.shape == (edges.size(1), heads) and (alpha >= 0).all()
    total = scatter(alpha, edges[1], dim=0, dim_size=N, reduce="sum")  # Σ_m A_nm per head
    expected = torch.ones(N, heads, dtype=DT)
    if not self_loops:
        expected[-1] = 0.0  # the isolated node attends to nothing
    torch.testing.assert_close(total, expected, **TOL)

    # dense reference: scores for every pair, softmax over the masked row of each node
    x = layer.w(h).view(N, heads, C)  # W h per head
    if score == "mlp":
        s_n, s_m = (x * layer.a_n).sum(-1), (x * layer.a_m).sum(-1)  # (N, H)
        scores = torch.nn.functional.leaky_relu(s_n[:, None] + s_m[None, :], 0.2)  # (N, N, H)
    else:
        scores = torch.einsum("nd,hde,me->nmh", h, layer.w_a, h)  # h_n^T W_a h_m
    a = dense_adjacency(edge_index) + (torch.eye(N, dtype=DT) if self_loops else 0)
    weights = scores.masked_fill(a[:, :, None] == 0, float("-inf")).softmax(dim=1)
    weights = weights.nan_to_num(0.0)  # a row with no neighbours is all -inf
    dense = torch.einsum("nmh,mhc->nhc", weights, x).reshape(N, heads * C) + layer.bias
    torch.testing.assert_close(out, dense, **TOL)


def test_gat_head_shapes() -> None:
    h, edge_index = features(N, D), random_graph()
    for concat, width in [(True, 3 * C), (False, C)]:
        layer = GATLayer(D, C, heads=3, concat=concat, dropout=0.5).to(DT)
        assert layer(h, edge_index).shape == (N, width)  # training mode: attention dropout on


# ---- EGNN ---------------------------------------------------------------------------------------


def random_orthogonal(s: int, det: float) -> Tensor:
    q, r = torch.linalg.qr(torch.randn(s, s, dtype=DT))
    q = q * torch.sign(torch.diagonal(r))  # Haar-distributed
    if torch.linalg.det(q).sign() != det:
        q[:, 0] = -q[:, 0]  # a reflection flips the sign of the determinant
    return q


@pytest.mark.parametrize("edge_channels", [0, 2])
@pytest.mark.parametrize("det", [1.0, -1.0], ids=["rotation", "reflection"])
def test_egnn_is_e_n_equivariant(det: float, edge_channels: int) -> None:
    layer = EGNNLayer(D, 16, edge_channels=edge_channels).to(DT).eval()
    h, pos, edge_index = features(N, D), features(N, 3), random_graph()
    e = features(edge_index.size(1), edge_channels) if edge_channels else None
    q, t = random_orthogonal(3, det), features(1, 3)
    assert torch.linalg.det(q).item() == pytest.approx(det)
    h1, pos1 = layer(h, pos, edge_index, e)
    h2, pos2 = layer(h, pos @ q.T + t, edge_index, e)
    torch.testing.assert_close(h2, h1, **TOL)  # invariant embeddings
    torch.testing.assert_close(pos2, pos1 @ q.T + t, **TOL)  # equivariant positions
    torch.testing.assert_close(pos1[-1], pos[-1], **TOL)  # no neighbours: the node stays put


def test_egnn_permutation_equivariant() -> None:
    layer = EGNNLayer(D, 16, edge_channels=2).to(DT).eval()
    h, pos, edge_index = features(N, D), features(N, 3), random_graph()
    e = features(edge_index.size(1), 2)
    perm, edge_perm = torch.randperm(N), torch.randperm(edge_index.size(1))
    h1, pos1 = layer(h, pos, edge_index, e)
    h2, pos2 = layer(h[perm], pos[perm], relabel(perm, edge_index, edge_perm), e[edge_perm])
    torch.testing.assert_close(h2, h1[perm], **TOL)
    torch.testing.assert_close(pos2, pos1[perm], **TOL)


# ---- graph network layer with edge and graph embeddings ----------------------------------------

DE, DG = 3, 2  # edge and graph embedding widths


def graph_batch(sizes: tuple[int, ...] = (4, 5, 6)) -> Batch:
    graphs = []
    for n in sizes:
        edge_index = random_graph(n)
        e = features(edge_index.size(1), DE)
        graphs.append(Data(x=features(n, D), edge_index=edge_index, edge_attr=e))
    return Batch.from_data_list(graphs)


def within_graph_permutation(batch: Batch) -> Tensor:
    """A node permutation that keeps each graph's nodes together (and `batch` sorted)."""
    ptr = batch.ptr.tolist()
    return torch.cat([lo + torch.randperm(hi - lo) for lo, hi in itertools.pairwise(ptr)])


@pytest.mark.parametrize("aggr", ["sum", "mean", "max"])
def test_graph_network_batching_and_permutations(aggr: str) -> None:
    layer = GraphNetworkLayer(D, DE, DG, hidden_channels=16, aggr=aggr).to(DT).eval()
    data = graph_batch()
    g = features(data.num_graphs, DG)
    h1, e1, g1 = layer(data.x, data.edge_index, data.edge_attr, g, data.batch)
    assert (h1.shape, e1.shape, g1.shape) == (data.x.shape, data.edge_attr.shape, g.shape)

    # a batch is the graphs run one at a time, concatenated
    graphs = data.to_data_list()
    singles = [layer(d.x, d.edge_index, d.edge_attr, g[i : i + 1]) for i, d in enumerate(graphs)]
    for got, want in zip((h1, e1, g1), zip(*singles, strict=True), strict=True):
        torch.testing.assert_close(got, torch.cat(want), **TOL)

    # node and edge outputs follow the relabelling; graph outputs and readouts do not change
    perm, edge_perm = within_graph_permutation(data), torch.randperm(data.num_edges)
    edge_index = relabel(perm, data.edge_index, edge_perm)
    batch = data.batch[perm]
    h2, e2, g2 = layer(data.x[perm], edge_index, data.edge_attr[edge_perm], g, batch)
    torch.testing.assert_close(h2, h1[perm], **TOL)
    torch.testing.assert_close(e2, e1[edge_perm], **TOL)
    torch.testing.assert_close(g2, g1, **TOL)
    for pool in POOLS:
        torch.testing.assert_close(pool(h2, batch), pool(h1, data.batch), **TOL)
