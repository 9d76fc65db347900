"""GNN tasks (src/models/gnn.py) on single graphs (src/data/graphs.py): node classification
(transductive and inductive), link prediction, graph-level outputs of every layer kind; the maths
on small graphs, and `python -m src.train model=... data=planetoid|karate [task=link]` end to end.

The Planetoid runs copy Cora's raw files from the data mirror ($DATA_MIRROR; skipped where it
lacks them) into `paths.data_dir=<tmp>/data`, so that raw files land in <tmp>/data/raw/ and
processed ones in <tmp>/data/processed/; nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from src.data.graphs import KarateClubDataModule, PlanetoidDataModule
from src.models.gnn import (
    GNN,
    LAYERS,
    GNNConfig,
    GraphPredictor,
    LinkPredictor,
    NodeClassifier,
    adam,
    cosine_similarity,
    dirichlet_energy,
    gnn_task,
    input_dropout,
)
from src.utils.callbacks import Throughput
from src.utils.errors import PipelineError
from tests.conftest import MIRROR, ROOT, assert_ok, assert_one_error_line, run_module

CORA_RAW = MIRROR / "planetoid" / "Cora" / "raw"  # the mirror's copy: data/raw's layout
N, F_IN, C = 12, 6, 3
NET = dict(hidden=8, num_layers=2, dropout=0.0)
OPTIM = dict(lr=0.01, weight_decay=5e-4)
# tiny graphs: one thread avoids thread-pool stalls when the CPUs are busy with other work
ENV = {"OMP_NUM_THREADS": "1"}
FAST = ["logger=none", "callbacks.progress_bar.refresh_rate=0"]
RESIDUAL_JK = ["model.net.residual=true", "model.net.jk=cat"]


def _train(run_dir: Path, *overrides: str, env: dict | None = None):
    return run_module(
        "src.train", f"hydra.run.dir={run_dir}", *overrides, env={**ENV, **(env or {})}
    )


def graph(seed: int = 0) -> Data:
    """A random undirected graph with N nodes, F_IN features, C classes, 4 training nodes."""
    g = torch.Generator().manual_seed(seed)
    upper = torch.rand(N, N, generator=g).triu(diagonal=1) > 0.6
    src, dst = upper.nonzero().T
    edge_index = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], dim=1)
    train = torch.zeros(N, dtype=torch.bool)
    train[:4] = True
    return Data(
        x=torch.randn(N, F_IN, generator=g),
        edge_index=edge_index,
        y=torch.randint(C, (N,), generator=g),
        train_mask=train,
        val_mask=~train,
        test_mask=~train,
    )


# ---------------------------------------------------------------- the task's maths


@pytest.mark.parametrize("layer", ["gcn", "gat", "mpnn"])
def test_loss_counts_training_nodes_only(layer):
    """Transductive: all nodes go through the GNN, only the train mask's labels enter the loss."""
    torch.manual_seed(0)
    model = NodeClassifier(F_IN, C, net={**NET, "layer": layer, "dropout": 0.5}, optim=OPTIM)
    data = graph()

    def train_loss(d: Data) -> torch.Tensor:
        torch.manual_seed(1)  # the same dropout masks on each call: the training pass itself
        return model.loss(d, "train")[0]

    other = data.clone()
    other.y[~data.train_mask] = (other.y[~data.train_mask] + 1) % C
    assert torch.equal(train_loss(data), train_loss(other))
    flipped = data.clone()
    flipped.y[0] = (flipped.y[0] + 1) % C
    assert not torch.equal(train_loss(data), train_loss(flipped))


@pytest.mark.parametrize(("layer", "heads"), [("gcn", 1), ("gat", 2), ("mpnn", 1)])
def test_jumping_knowledge_concatenates_every_layer(layer, heads):
    cfg = GNNConfig(layer=layer, hidden=8, heads=heads, num_layers=3, jk="cat")
    net, data = GNN(cfg, F_IN, C), graph()
    width = 8 * heads
    hs = net.embeddings(data.x, data.edge_index)
    assert [h.shape for h in hs] == [(N, width)] * 3  # every layer is a hidden layer
    assert net.readout.in_features == 3 * width  # y_n = W [h^(1) ⊕ h^(2) ⊕ h^(3)] + b
    assert net(data.x, data.edge_index).shape == (N, C)
    assert GNN(GNNConfig(layer=layer, heads=heads, num_layers=3), F_IN, C)(
        data.x, data.edge_index
    ).shape == (N, C)


@pytest.mark.parametrize("layer", ["gcn", "gat", "mpnn"])
def test_residual_connections_between_same_width_layers(layer):
    """A layer whose weights are all 0 outputs f(0) = 0: with the residual path its embedding is
    the previous one, without it 0. The first layer (F_IN -> hidden) has no residual path."""
    data = graph()
    for residual in (True, False):
        cfg = GNNConfig(layer=layer, hidden=8, num_layers=3, dropout=0.0, residual=residual)
        net = GNN(cfg, F_IN, C)
        assert net.residual == [False, residual]
        with torch.no_grad():
            for p in net.layers[1].parameters():
                p.zero_()
            h1, h2 = net.embeddings(data.x, data.edge_index)
        assert h1.abs().sum() > 0
        assert torch.equal(h2, h1 if residual else torch.zeros_like(h1))


def batch_of_graphs(sizes=(5, 7, 6), edge_channels: int = 2):
    """A PyG Batch of random graphs with node features, edge features and 3D positions."""
    from torch_geometric.data import Batch

    graphs = []
    for i, n in enumerate(sizes):
        g = graph(i)
        keep = g.edge_index.max(0).values < n  # the first n nodes of a random graph
        ei = g.edge_index[:, keep]
        e = torch.randn(ei.size(1), edge_channels)
        graphs.append(
            Data(x=g.x[:n], edge_index=ei, edge_attr=e, pos=torch.randn(n, 3), y=torch.randn(1, 1))
        )
    return Batch.from_data_list(graphs)


def permute_within_graphs(batch):
    """The same graphs with their nodes renumbered (P X, P A P^T, edges reordered too)."""
    perm = torch.cat([torch.randperm(int(c)) + int(o) for c, o in zip(
        batch.ptr.diff(), batch.ptr[:-1], strict=True)])  # fmt: skip
    inverse, edge_perm = torch.argsort(perm), torch.randperm(batch.num_edges)
    out = batch.clone()
    out.x, out.pos = batch.x[perm], batch.pos[perm]
    out.edge_index = inverse[batch.edge_index[:, edge_perm]]
    out.edge_attr = batch.edge_attr[edge_perm]
    return out


@pytest.mark.parametrize("layer", LAYERS)
def test_graph_outputs_are_permutation_invariant(layer):
    """Every layer kind, read out by sum, mean or max: renumbering the nodes of each graph leaves
    the graph-level prediction unchanged (and node embeddings permute with the nodes)."""
    torch.manual_seed(0)
    batch = batch_of_graphs()
    shuffled = permute_within_graphs(batch)
    for readout in ("sum", "mean", "max"):
        net = dict(layer=layer, hidden=8, num_layers=2, dropout=0.0, readout=readout, heads=2)
        model = GraphPredictor("graph_regression", F_IN, 1, net, OPTIM, edge_channels=2).eval()
        with torch.no_grad():
            torch.testing.assert_close(model(shuffled), model(batch), atol=1e-5, rtol=1e-5)
            assert model(batch).shape == (3, 1)


def test_egnn_graph_output_is_invariant_to_rotations_and_translations():
    torch.manual_seed(0)
    batch = batch_of_graphs()
    net = dict(layer="egnn", hidden=8, num_layers=3, dropout=0.0, residual=True)
    model = GraphPredictor("graph_regression", F_IN, 1, net, OPTIM, edge_channels=2).eval()
    q, _ = torch.linalg.qr(torch.randn(3, 3))  # a random rotation or reflection
    moved = batch.clone()
    moved.pos = batch.pos @ q.T + torch.randn(3)
    with torch.no_grad():
        torch.testing.assert_close(model(moved), model(batch), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layer", LAYERS)
def test_every_layer_kind_gives_node_outputs(layer):
    torch.manual_seed(0)
    b = batch_of_graphs()
    for jk in ("none", "cat"):
        net = GNN(GNNConfig(layer=layer, hidden=8, num_layers=3, jk=jk), F_IN, C, edge_channels=2)
        out = net(b.x, b.edge_index, b.edge_attr, b.pos, b.batch)
        assert out.shape == (b.num_nodes, C) and torch.isfinite(out).all()
        emb = GNN(GNNConfig(layer=layer, hidden=8, num_layers=3, jk=jk), F_IN, edge_channels=2)
        assert emb(b.x, b.edge_index, b.edge_attr, b.pos, b.batch).shape == (
            b.num_nodes, emb.embedding_dim)  # fmt: skip
        assert emb.embedding_dim == (3 if jk == "cat" else 1) * 8


def test_graph_regression_standardises_targets():
    """Predictions come out in the targets' units: a zeroed head predicts the train mean."""
    b = batch_of_graphs()
    model = GraphPredictor("graph_regression", F_IN, 1, dict(layer="gin", hidden=8), OPTIM,
                           target_mean=[-3.0], target_std=[2.0]).eval()  # fmt: skip
    with torch.no_grad():
        for p in model.head.parameters():
            p.zero_()
        assert torch.equal(model(b), torch.full((3, 1), -3.0))


def test_link_scores_are_dot_products():
    torch.manual_seed(0)
    model = LinkPredictor(F_IN, dict(hidden=8, num_layers=2), OPTIM)
    h = torch.randn(N, 8)
    pairs = torch.tensor([[0, 1, 2], [3, 4, 2]])
    torch.testing.assert_close(model.score(h, pairs), (h[[0, 1, 2]] * h[[3, 4, 2]]).sum(-1))
    torch.testing.assert_close(model.score(h, pairs.flip(0)), model.score(h, pairs))  # symmetric


def test_gnn_task_picks_the_module():
    net = dict(hidden=8)
    kw = dict(in_channels=F_IN, net=net, optim=OPTIM, edge_channels=0)
    assert isinstance(gnn_task("node", out_channels=C, **kw), NodeClassifier)
    assert isinstance(gnn_task("link", **kw), LinkPredictor)
    assert gnn_task("graph_regression", out_channels=1, **kw).regression
    assert not gnn_task("graph_classification", out_channels=2, **kw).regression
    with pytest.raises(PipelineError, match="unknown task 'edge'"):
        gnn_task("edge", **kw)


def test_smoothness_measures_against_brute_force():
    torch.manual_seed(0)
    data = graph()
    h = torch.randn(N, 4)
    u = torch.nn.functional.normalize(h, dim=-1)
    pairs = [(i, j) for i in range(N) for j in range(N) if i != j]
    expected = sum(float(u[i] @ u[j]) for i, j in pairs) / len(pairs)
    assert float(cosine_similarity(h)) == pytest.approx(expected, abs=1e-5)
    assert float(cosine_similarity(h[:1].repeat(N, 1))) == pytest.approx(1.0, abs=1e-5)
    deg = torch.bincount(data.edge_index[1], minlength=N).float()
    energy = (
        sum(
            float(((h[n] / (1 + deg[n]).sqrt() - h[m] / (1 + deg[m]).sqrt()) ** 2).sum())
            for m, n in data.edge_index.T.tolist()
        )
        / N
    )
    assert float(dirichlet_energy(h, data.edge_index)) == pytest.approx(energy, rel=1e-5)


def test_inductive_training_graph_leaves_out_val_and_test_nodes():
    dm = KarateClubDataModule(inductive=True)
    full, train = dm.data, dm.splits["train"]
    assert train.num_nodes == int(full.train_mask.sum()) + int(
        (~(full.train_mask | full.val_mask | full.test_mask)).sum()
    )
    assert train.train_mask.all() and not train.val_mask.any() and not train.test_mask.any()
    assert dm.splits["val"] is full and dm.splits["test"] is full
    transductive = KarateClubDataModule()
    assert transductive.splits["train"] is transductive.data


def test_link_split_holds_out_edges_with_negatives():
    dm = KarateClubDataModule(task="link", link_val=0.1, link_test=0.2)
    s = dm.splits
    assert dm.model_kwargs == {"task": "link", "in_channels": 34}
    train_edges = {tuple(e) for e in s["train"].edge_index.T.tolist()}
    for stage in ("val", "test"):
        labels, pairs = s[stage].edge_label, s[stage].edge_label_index
        assert labels.sum() * 2 == len(labels)  # as many non-edges as edges
        held_out = {tuple(e) for e in pairs[:, labels == 1].T.tolist()}
        assert not held_out & train_edges  # message passing never sees a held-out edge
    again = KarateClubDataModule(task="link", link_val=0.1, link_test=0.2).splits
    assert torch.equal(again["test"].edge_label_index, s["test"].edge_label_index)  # seeded
    with pytest.raises(PipelineError, match="does not fit a single graph"):
        KarateClubDataModule(task="graph_regression")


def test_input_dropout_draws_for_the_nonzero_features_only():
    """Same distribution as F.dropout: zeros stay 0, each non-zero is kept with probability
    1 - p and then scaled by 1 / (1 - p)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(400, 50, generator=g) * (torch.rand(400, 50, generator=g) < 0.1)  # ~2000 nnz
    torch.manual_seed(0)
    out = input_dropout(x, 0.25)
    assert not out[x == 0].any()
    kept = out != 0
    assert torch.allclose(out[kept], x[kept] / 0.75)
    assert kept.sum() / (x != 0).sum() == pytest.approx(0.75, abs=0.05)
    assert input_dropout(x, 0.25, training=False) is x
    assert not input_dropout(x, 1.0).any()


def test_the_task_fills_in_the_dropout_left_null():
    """model=gat: on node tasks the paper's 0.6 on x, the embeddings and the attention; on graph
    tasks none inside the GNN and 0.5 in the readout head. A value given wins on either."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["model=gat"])
    kw = OmegaConf.to_container(cfg.model)
    kw.pop("_target_")
    assert kw["net"]["dropout"] is None  # the config leaves it to the task
    node = gnn_task("node", in_channels=F_IN, out_channels=C, **kw)
    graph = gnn_task("graph_classification", in_channels=F_IN, out_channels=C, **kw)
    assert (node.net.p_in, node.net.cfg.dropout, node.net.cfg.attn_dropout) == (0.6, 0.6, 0.6)
    assert (graph.net.p_in, graph.net.cfg.dropout, graph.net.cfg.attn_dropout) == (0, 0, 0)
    assert graph.head[0].p == 0.5
    kw["net"]["dropout"] = 0.3
    assert gnn_task("node", in_channels=F_IN, out_channels=C, **kw).net.p_in == 0.3  # x too
    graph = gnn_task("graph_classification", in_channels=F_IN, out_channels=C, **kw)
    assert (graph.net.cfg.dropout, graph.net.p_in) == (0.3, 0.0)


def test_bad_net_settings_are_pipeline_errors():
    for bad in (dict(layer="sage"), dict(jk="max"), dict(num_layers=0)):
        with pytest.raises(PipelineError):
            GNN(GNNConfig(**bad), F_IN, C)


def test_weight_decay_on_first_layer_only():
    net = GNN(GNNConfig(num_layers=3), F_IN, C)
    decayed, plain = adam(net, {**OPTIM, "decay": "first"}).param_groups
    assert {id(p) for p in decayed["params"]} == {id(p) for p in net.layers[0].parameters()}
    assert decayed["weight_decay"] == 5e-4 and plain["weight_decay"] == 0.0
    (everything,) = adam(net, OPTIM).param_groups
    assert len(everything["params"]) == len(list(net.parameters()))


def test_throughput_counts_tokens_of_text_images_of_image_batches_and_nodes_of_graphs():
    ids = torch.zeros(4, 8, dtype=torch.long)
    assert Throughput._size((ids, ids)) == ("tokens", 32)
    assert Throughput._size((torch.zeros(4, 1, 8, 8), torch.zeros(4).long())) == ("images", 4)
    assert Throughput._size(graph()) == ("nodes", N)


def test_karate_split_is_seeded_disjoint_and_complete():
    data = KarateClubDataModule(split_seed=3).data
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask])
    assert torch.equal(masks.sum(0), torch.ones(34, dtype=torch.long))  # each node in one split
    assert masks.sum(1).tolist() == [4, 10, 20]
    assert torch.bincount(data.y[data.train_mask]).tolist() == [1, 1, 1, 1]  # 1 per community
    assert torch.equal(KarateClubDataModule(split_seed=3).data.val_mask, data.val_mask)
    assert not torch.equal(KarateClubDataModule(split_seed=4).data.val_mask, data.val_mask)


def test_failed_download_says_what_to_do(tmp_path, monkeypatch):
    """Offline, without raw files and without a mirror, the download fails: one PipelineError
    that names the files, where to put them, their URL and DATA_MIRROR, and no partial file is
    left behind. Every URL fails here (urlopen raises), so no network is touched."""
    import urllib.error
    import urllib.request

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network in the tests")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    raw = tmp_path / "raw"
    dm = PlanetoidDataModule(root=str(tmp_path / "processed"), name="cora", raw_dir=str(raw))
    folder = raw / "planetoid" / "Cora" / "raw"
    with pytest.raises(PipelineError) as info:
        dm.prepare_data()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"dataset planetoid/Cora: ind.cora.x, ind.cora.tx, ind.cora.allx, "
                              f"ind.cora.y and 4 more not found in {folder}; ")  # fmt: skip
    assert "raw.githubusercontent.com/kimiyoung/planetoid" in message  # where they come from
    assert "set DATA_MIRROR to a folder holding planetoid/Cora/raw/" in message
    assert "could not download https://" in message and "no network in the tests" in message
    assert not [f for f in raw.rglob("*") if f.is_file()]
    assert not (tmp_path / "processed").exists()


# ---------------------------------------------------------------- end to end: python -m src.train


@pytest.fixture(scope="module")
def cora_data_dir(tmp_path_factory) -> Path:
    """This module's data folder (paths.data_dir): Cora's raw files are copied into its raw/ from
    the mirror by the first run, and processed into its processed/."""
    if not (CORA_RAW / "ind.cora.x").exists():
        pytest.skip(f"dataset missing in the mirror: {CORA_RAW}")
    return tmp_path_factory.mktemp("cora") / "data"


@pytest.fixture(scope="module")
def cora(cora_data_dir) -> list[str]:
    """Overrides that read Cora from the mirror into this module's data folder, never online."""
    return ["data=planetoid", f"paths.data_dir={cora_data_dir}", "data.download=false"]


@pytest.fixture(scope="module")
def gcn_run(tmp_path_factory, cora) -> Path:
    """30 epochs of Kipf & Welling's GCN on Cora (a few seconds)."""
    run_dir = tmp_path_factory.mktemp("gcn")
    assert_ok(_train(run_dir, "model=gcn", *cora, "trainer.max_steps=30", "logger=csv",
               "callbacks.progress_bar.refresh_rate=0"))  # fmt: skip
    return run_dir


def test_gcn_on_cora_learns(gcn_run, cora_data_dir):
    metrics = json.loads((gcn_run / "metrics.json").read_text())
    assert {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc"} <= set(
        metrics
    )
    assert {"train/nodes_per_sec", "train/startup_sec"} <= set(metrics)
    assert "train/tokens_per_sec" not in metrics
    assert metrics["test/acc"] > 0.5  # 7 classes; Kipf's GCN reaches ~0.8 in 200 epochs
    assert (gcn_run / "csv" / "metrics.csv").exists()
    raw = cora_data_dir / "raw" / "planetoid" / "Cora" / "raw"
    assert (raw / "ind.cora.graph").is_file()  # copied from the mirror into its home
    assert sorted(f.name for f in raw.iterdir()) == sorted(f.name for f in CORA_RAW.iterdir())
    root = cora_data_dir / "processed" / "planetoid"  # data.root: processed files only
    files = [f.relative_to(root) for f in root.rglob("*") if f.is_file()]
    assert files and all(f.parts[:2] == ("Cora", "processed") for f in files), files


def test_gcn_checkpoint_loads_with_weights_only(gcn_run):
    """The best checkpoint (by val/loss here) rebuilds the model, which gives the logged test
    accuracy on the test nodes."""
    metrics = json.loads((gcn_run / "metrics.json").read_text())
    (best,) = (gcn_run / "checkpoints").glob("best-*.ckpt")
    ckpt = torch.load(best, weights_only=True)
    assert ckpt["model_class"] == "src.models.gnn.NodeClassifier"
    hp = ckpt["hyper_parameters"]
    assert (hp["in_channels"], hp["out_channels"], hp["net"]["layer"]) == (1433, 7, "gcn")
    model = NodeClassifier(**hp)
    model.load_state_dict(ckpt["state_dict"])
    data = PlanetoidDataModule(**ckpt["datamodule_hyper_parameters"]).data
    model.eval()
    with torch.no_grad():
        _, logits, y = model.loss(data, "test")
    accuracy = (logits.argmax(-1) == y).float().mean().item()
    assert accuracy == pytest.approx(metrics["test/acc"], abs=1e-6)
    assert torch.load(gcn_run / "checkpoints" / "last.ckpt", weights_only=True)["model_class"]


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=gat"],
        ["model=mpnn"],
        ["model=mpnn", "model.net.aggr=sum", "model.net.num_layers=3", *RESIDUAL_JK],
        ["experiment=gcn_cora"],  # monitors val/acc, checkpoint mode max
    ],
    ids=["gat", "mpnn", "mpnn-sum-residual-jk", "gcn_cora"],
)
def test_models_on_cora_run(tmp_path, cora, overrides):
    assert_ok(_train(tmp_path, *overrides, *cora, "trainer.max_steps=5", *FAST))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert {"train/loss", "val/acc", "test/acc"} <= set(metrics)
    assert len(list((tmp_path / "checkpoints").glob("best-*.ckpt"))) == 1


def test_karate_runs_offline(tmp_path):
    assert_ok(_train(tmp_path, "model=gcn", "data=karate", "trainer.max_steps=50", *FAST))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert 0.0 <= metrics["test/acc"] <= 1.0 and metrics["train/loss"] < 1.4  # below log 4


def test_karate_link_prediction_runs(tmp_path):
    assert_ok(_train(tmp_path, "model=gcn", "data=karate", "task=link", "trainer.max_steps=30",
                     *FAST))  # fmt: skip
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert {"train/loss", "val/auroc", "test/auroc"} <= set(metrics)
    assert 0.0 <= metrics["test/auroc"] <= 1.0


def test_cora_link_prediction_learns(tmp_path, cora):
    """PyG's link_pred example reaches ~0.9 test ROC-AUC on Cora (0.91 here after 100 epochs)."""
    assert_ok(_train(tmp_path, "model=gcn", *cora, "task=link", "model.net.hidden=64",
                     "model.net.dropout=0.0", "model.optim.weight_decay=0", "trainer.max_steps=50",
                     *FAST))  # fmt: skip
    assert json.loads((tmp_path / "metrics.json").read_text())["test/auroc"] > 0.8  # 0.87 here


def test_inductive_node_classification_runs(tmp_path, cora):
    assert_ok(_train(tmp_path, "model=gcn", *cora, "data.inductive=true", "trainer.max_steps=30",
                     *FAST))  # fmt: skip
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["test/acc"] > 0.4
    assert {"test/cosine_similarity", "test/dirichlet_energy"} <= set(metrics)


def test_task_the_data_cannot_serve(tmp_path):
    proc = _train(tmp_path / "run", "model=gcn", "data=karate", "task=graph_regression", *FAST)
    assert_one_error_line(proc, "task='graph_regression' does not fit a single graph")


def test_egnn_without_positions(tmp_path):
    proc = _train(tmp_path / "run", "model=egnn", "data=karate", *FAST)
    assert_one_error_line(proc, "egnn needs node positions")


def test_missing_planetoid_without_download(tmp_path):
    """A mirror without Cora ($DATA_MIRROR an empty folder) and downloads off: one line."""
    empty = tmp_path / "empty-mirror"
    empty.mkdir()
    proc = _train(tmp_path / "run", "model=gcn", "data=planetoid",
                  f"paths.data_dir={tmp_path}/data", "data.download=false", *FAST,
                  env={"DATA_MIRROR": str(empty)})  # fmt: skip
    raw = tmp_path / "data" / "raw" / "planetoid" / "Cora" / "raw"
    assert_one_error_line(
        proc, "dataset planetoid/Cora: ind.cora.x", f"not found in {raw}", "DATA_MIRROR",
        f"the mirror {empty}/planetoid/Cora/raw lacks 8 of them",
        "downloads are off (data.download=false)",
    )  # fmt: skip
    left = [f for f in (tmp_path / "data").rglob("*") if f.is_file()]
    assert [f.name for f in left] == [".prepare.lock"]  # src.train's lock, empty; nothing else


def test_missing_planetoid_without_mirror(tmp_path):
    """data.mirror=null overrides $DATA_MIRROR (which holds Cora here): nowhere to copy from."""
    proc = _train(tmp_path / "run", "model=gcn", "data=planetoid",
                  f"paths.data_dir={tmp_path}/data", "data.mirror=null", "data.download=false",
                  *FAST)  # fmt: skip
    assert_one_error_line(
        proc, "dataset planetoid/Cora: ind.cora.x", "not found in", "set DATA_MIRROR",
        "raw.githubusercontent.com/kimiyoung/planetoid",
        "(downloads are off (data.download=false))",
    )  # fmt: skip
    assert "the mirror" not in proc.stderr


def test_unknown_layer_isassert_one_error_line(tmp_path):
    proc = _train(tmp_path / "run", "model=gcn", "data=karate", "model.net.layer=sage", *FAST)
    assert_one_error_line(proc, "unknown layer 'sage'")


def test_experiment_presets_hold_the_papers_settings():
    from hydra import compose, initialize_config_dir

    from tests.conftest import ROOT

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        gcn = compose("train", overrides=["experiment=gcn_cora"])
        gat = compose("train", overrides=["experiment=gat_cora"])
    assert gcn.model.net.layer == "gcn" and gcn.data.name == "Cora"
    assert (gcn.model.net.hidden, gcn.model.net.dropout) == (16, 0.5)
    assert (gcn.model.optim.lr, gcn.model.optim.weight_decay) == (0.01, 5e-4)
    assert gcn.trainer.max_steps == 200 and gcn.trainer.gradient_clip_val is None
    assert gat.model.net.layer == "gat" and gat.model.net.activation == "elu"
    assert (gat.model.net.heads, gat.model.net.hidden, gat.model.net.out_heads) == (8, 8, 1)
    assert (gat.model.net.dropout, gat.model.net.attn_dropout) == (0.6, 0.6)
    assert (gat.model.optim.lr, gat.model.optim.weight_decay) == (0.005, 5e-4)
    assert gat.callbacks.model_checkpoint.patience == 100  # val loss and accuracy both stalled
    for cfg in (gcn, gat):
        assert cfg.callbacks.model_checkpoint.monitor == "val/acc"
        assert cfg.callbacks.model_checkpoint.mode == "max"
