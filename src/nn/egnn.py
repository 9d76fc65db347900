"""E(n)-equivariant graph layer (Satorras et al. 2021; Bishop, Deep Learning, sec. 13.3.6).

Geometric deep learning: each node has an embedding h_n and a position r_n in space (atoms in a
molecule, say). Messages see positions only through the squared distance ||r_n - r_m||^2, which
rotations, reflections and translations leave unchanged, and positions move along r_n - r_m,
which turns with the input:

    m_nm = φ_e(h_n, h_m, ||r_n - r_m||^2, e_nm)
    r_n' = r_n + C Σ_m (r_n - r_m) φ_r(m_nm)          C = 1/|N(n)|
    h_n' = h_n + φ_h(h_n, Σ_m m_nm)

So for any orthogonal Q (det ±1) and translation t, EGNN(h, r Q^T + t) = (h', r' Q^T + t): the
embeddings are invariant and the positions equivariant, with no augmentation by rotations needed.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import scatter

from src.nn.message_passing import mlp


class EGNNLayer(MessagePassing):
    """One EGNN layer; φ_e, φ_r and φ_h are two-layer MLPs.

    aggr sums the messages m_nm (the paper's choice); the position shifts are always averaged
    (C = 1/|N(n)|) so that a well-connected node does not take steps proportional to its degree.
    """

    def __init__(
        self,
        node_channels: int,
        hidden_channels: int = 64,
        edge_channels: int = 0,
        aggr: str = "sum",
        activation: str = "silu",
        residual: bool = True,
    ):
        super().__init__(aggr=aggr)
        d, dh = node_channels, hidden_channels
        self.residual = residual
        self.phi_e = mlp(2 * d + 1 + edge_channels, dh, dh, activation, final_act=True)
        self.phi_r = mlp(dh, dh, 1, activation)
        self.phi_h = mlp(d + dh, dh, d, activation)

    def forward(
        self, h: Tensor, pos: Tensor, edge_index: Tensor, edge_attr: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """h: (N, D), pos: (N, S) for S spatial dimensions, edge_index: (2, E), edge_attr:
        (E, D_e) or None -> (h', pos'), of shapes (N, D) and (N, S)."""
        z, shift = self.propagate(edge_index, h=h, pos=pos, e=edge_attr)  # (N, D_hid), (N, S)
        out = self.phi_h(torch.cat([h, z], dim=-1))
        return (h + out if self.residual else out), pos + shift

    def message(
        self, h_i: Tensor, h_j: Tensor, pos_i: Tensor, pos_j: Tensor, e: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        diff = pos_i - pos_j  # r_n - r_m: (E, S)
        dist2 = diff.pow(2).sum(dim=-1, keepdim=True)  # (E, 1), invariant
        m = self.phi_e(torch.cat([h_i, h_j, dist2] + ([] if e is None else [e]), dim=-1))
        return m, diff * self.phi_r(m)  # (E, D_hid), (E, S)

    def aggregate(
        self,
        inputs: tuple[Tensor, Tensor],
        index: Tensor,
        ptr: Tensor | None = None,
        dim_size: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        m, shift = inputs
        z = self.aggr_module(m, index, ptr=ptr, dim_size=dim_size)
        return z, scatter(shift, index, dim=0, dim_size=dim_size, reduce="mean")
