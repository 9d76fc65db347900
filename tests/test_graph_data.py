"""Graph-level data (src/data/graph_sets.py, src/data/molecules.py): MUTAG with stratified k-fold
splits, ESOL with one-hot features and RDKit 3D coordinates, the saved splits, the batch and
model_kwargs contract, `python -m src.prepare data=tudataset` end to end, and bad input.

MUTAG and ESOL are copied from the data mirror ($DATA_MIRROR; skipped where it lacks them) into
`<root>/raw/`, their raw home (data/raw's layout), and processed under roots in the tests' tmp
folders; nothing is downloaded. ESOL is processed once for the session (~20 s on 2 cores, nearly
all of it the 3D embedding); other datasets here are a few tiny files written by the tests into
a raw folder of their own."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch

from src.data.graph_sets import TUDataModule, kfold
from src.data.molecules import Conformer, MoleculeNetDataModule
from src.utils.errors import PipelineError
from tests.conftest import MIRROR, assert_ok, assert_one_error_line, run_module

MUTAG_RAW = MIRROR / "TUDataset" / "MUTAG" / "raw"  # the mirror's copy: data/raw's layout
SPLITS = ("train", "val", "test")


def tu(root: Path, **kwargs) -> TUDataModule:
    """A TUDataset under `root` whose raw files are at home in `root`/raw (never data/raw)."""
    return TUDataModule(root=str(root), raw_dir=str(root / "raw"), **kwargs)


def esol(root: Path, **kwargs) -> MoleculeNetDataModule:
    """ESOL under `root` (the esol_root fixture: its csv is in `root`/raw/esol/)."""
    return MoleculeNetDataModule(root=str(root), raw_dir=str(root / "raw"), **kwargs)


@pytest.fixture(scope="module")
def mutag_root(tmp_path_factory) -> Path:
    """A root with MUTAG copied from the mirror into its raw/, processed, and its default folds
    saved."""
    if not (MUTAG_RAW / "MUTAG_A.txt").exists():
        pytest.skip(f"dataset missing in the mirror: {MUTAG_RAW}")
    root = tmp_path_factory.mktemp("tudataset")
    tu(root, mirror=str(MIRROR), download=False).prepare_data()
    return root


def write_tu(raw_dir: Path, name: str, graphs: list[list[tuple[int, int]]], **files: list) -> None:
    """A TUDataset in its raw home `raw_dir`/TUDataset/<name>/raw/, in PyG's raw layout: `graphs`
    as undirected edge lists on nodes 1, 2, ... numbered per graph; `files` are the other
    columns (graph_labels, graph_attributes, ...)."""
    raw, edges, indicator, offset = raw_dir / "TUDataset" / name / "raw", [], [], 0
    for g, graph in enumerate(graphs, start=1):
        n = max(max(e) for e in graph)
        edges += [(offset + a, offset + b) for a, b in graph] + [
            (offset + b, offset + a) for a, b in graph
        ]
        indicator += [g] * n
        offset += n
    raw.mkdir(parents=True)
    (raw / f"{name}_A.txt").write_text("".join(f"{a}, {b}\n" for a, b in edges))
    for part, column in {"graph_indicator": indicator, **files}.items():
        (raw / f"{name}_{part}.txt").write_text("".join(f"{v}\n" for v in column))


def write_csv(raw_dir: Path, smiles: list[str]) -> Path:
    """ESOL's csv in its raw home `raw_dir`/esol/, in ESOL's layout (the target second to last,
    the SMILES last)."""
    path = raw_dir / "esol" / "delaney-processed.csv"
    path.parent.mkdir(parents=True)
    rows = [f"mol{i},{-i / 2},{s}" for i, s in enumerate(smiles)]
    path.write_text("\n".join(["Compound ID,measured log solubility,smiles", *rows, ""]))
    return path


# ---------------------------------------------------------------- TUDataset: MUTAG


def test_mutag_batches_follow_the_contract(mutag_root):
    dm = tu(mutag_root, batch_size=16)
    dm.setup("fit")
    assert len(dm.dataset) == 188
    assert dm.model_kwargs == {
        "task": "graph_classification", "in_channels": 7, "out_channels": 2, "edge_channels": 4,
    }  # fmt: skip
    batch = next(iter(dm.train_dataloader()))
    assert batch.num_graphs == 16 and batch.y.shape == (16,) and batch.y.dtype == torch.long
    assert batch.x.dtype == torch.float and batch.x.shape == (batch.num_nodes, 7)
    assert torch.equal(batch.x.sum(1), torch.ones(batch.num_nodes))  # one-hot atom types
    assert batch.edge_attr.shape == (batch.num_edges, 4) and batch.edge_attr.dtype == torch.float
    assert batch.edge_index.shape == (2, batch.num_edges) and batch.batch.shape == (
        batch.num_nodes,
    )
    assert sum(len(b.y) for b in dm.val_dataloader()) == len(dm.splits["val"])


def test_mutag_folds_partition_the_dataset_and_are_stratified(mutag_root):
    saved = json.loads(
        (mutag_root / "MUTAG" / "splits" / "stratified-10fold-seed0.json").read_text()
    )
    folds = saved["folds"]
    assert saved["num_graphs"] == 188 and len(folds) == 10
    assert sorted(i for fold in folds for i in fold) == list(range(188))
    assert {len(fold) for fold in folds} == {18, 19}
    y = tu(mutag_root).targets
    per_class = torch.stack([torch.bincount(y[fold], minlength=2) for fold in folds])
    assert per_class.sum(0).tolist() == [63, 125]
    assert (per_class.max(0).values - per_class.min(0).values).max() <= 1  # GIN's protocol
    for k in (0, 9):
        splits = tu(mutag_root, fold=k).splits
        assert splits["val"].tolist() == folds[k] and torch.equal(splits["val"], splits["test"])
        assert sorted(splits["train"].tolist() + folds[k]) == list(range(188))


def test_mutag_folds_depend_on_the_seed_alone(mutag_root, tmp_path):
    other_root = tu(tmp_path, mirror=str(MIRROR), download=False)
    same = tu(mutag_root)
    assert torch.equal(other_root.splits["train"], same.splits["train"])
    assert (tmp_path / "raw" / "TUDataset" / "MUTAG" / "raw" / "MUTAG_A.txt").is_file()
    reseeded = tu(mutag_root, split_seed=1)
    assert not torch.equal(reseeded.splits["train"], same.splits["train"])
    assert (mutag_root / "MUTAG" / "splits" / "stratified-10fold-seed1.json").is_file()
    y = torch.tensor([0, 1] * 10)
    assert kfold(y, 20, 4, seed=3) == kfold(y, 20, 4, seed=3) != kfold(y, 20, 4, seed=4)


def test_saved_splits_are_reused(mutag_root):
    path = mutag_root / "MUTAG" / "splits" / "stratified-5fold-seed0.json"
    tu(mutag_root, num_folds=5).prepare_data()
    saved = json.loads(path.read_text())
    saved["folds"] = saved["folds"][::-1]
    path.write_text(json.dumps(saved))
    assert tu(mutag_root, num_folds=5).splits["val"].tolist() == saved["folds"][0]
    path.write_text(json.dumps({**saved, "num_graphs": 100}))
    with pytest.raises(PipelineError, match="is for 100 graphs, but MUTAG has 188"):
        tu(mutag_root, num_folds=5).prepare_data()


def test_graphs_without_node_features_and_regression_targets(tmp_path):
    """No node labels: one-hot degrees (or a constant); graph attributes: regression, y (B, 1),
    target mean and std of the training folds."""
    graphs = [[(1, 2), (2, 3)], [(1, 2), (1, 3), (1, 4)], [(1, 2)], [(1, 2), (2, 3), (3, 1)]]
    write_tu(tmp_path / "raw", "TOY", graphs, graph_attributes=[0.5, 1.5, 2.5, 4.5])
    dm = tu(tmp_path, name="TOY", num_folds=2, batch_size=4, download=False)
    kwargs = dm.model_kwargs
    train = torch.tensor([0.5, 1.5, 2.5, 4.5])[dm.splits["train"]]
    assert kwargs == {
        "task": "graph_regression", "in_channels": 4, "out_channels": 1, "edge_channels": 0,
        "target_mean": [train.mean().item()], "target_std": [train.std().item()],
    }  # fmt: skip
    star = dm.dataset[1]
    assert star.x.tolist() == [[0, 0, 0, 1], [0, 1, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0]]
    assert "edge_attr" not in star and star.y.shape == (1, 1)
    batch = next(iter(dm.train_dataloader()))
    assert batch.y.shape == (2, 1) and batch.y.dtype == torch.float
    constant = tu(tmp_path, name="TOY", num_folds=2, featureless="constant", download=False)
    assert torch.equal(constant.dataset[1].x, torch.ones(4, 1))
    with pytest.raises(PipelineError, match="TOY is a graph_regression dataset"):
        tu(tmp_path, name="TOY", task="graph_classification", download=False).prepare_data()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(fold=10), r"data\.fold=10 is out of range: the 10 folds are 0\.\.9"),
        (dict(num_folds=1), "num_folds=1 must be at least 2"),
        (dict(task="node"), "task 'node' is not a task of a graph-set dataset"),
        (dict(featureless="zeros"), "unknown featureless='zeros'"),
        (dict(batch_size=0), "batch_size=0 must be at least 1"),
    ],
)
def test_bad_tu_settings(tmp_path, kwargs, message):
    with pytest.raises(PipelineError, match=message):
        tu(tmp_path, **kwargs)


def test_missing_tu_data(tmp_path, monkeypatch):
    import urllib.error
    import urllib.request

    empty = tmp_path / "empty-mirror"
    empty.mkdir()
    home = re.escape(str(tmp_path / "a" / "raw" / "TUDataset" / "MUTAG" / "raw"))
    with pytest.raises(
        PipelineError,
        match=rf"^dataset TUDataset/MUTAG: MUTAG_A\.txt, .* not found in {home}; .*DATA_MIRROR.*"
        rf"the mirror {re.escape(str(empty))}/TUDataset/MUTAG/raw lacks 5 of them; downloads are "
        r"off \(data\.download=false\)\)$",
    ):
        tu(tmp_path / "a", mirror=str(empty), download=False).prepare_data()
    with pytest.raises(
        PipelineError, match=r"not found in .*\(downloads are off \(data\.download=false\)\)$"
    ):
        tu(tmp_path / "b", download=False).prepare_data()

    # offline or an unknown name: the download fails (every URL fails here: urlopen raises)
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network in the tests")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(
        PipelineError,
        match=r"^dataset TUDataset/NOPE: NOPE_A\.txt, NOPE_graph_indicator\.txt not found in "
        r".*DATA_MIRROR.*could not download https://www\.chrsmrrs\.com/graphkerneldatasets/"
        r"NOPE\.zip: no network in the tests",
    ):
        tu(tmp_path / "c", name="NOPE").prepare_data()
    assert not [f for f in tmp_path.rglob("*") if f.is_file()]  # nothing half-written


def test_unreadable_tu_files(tmp_path):
    """Raw files that are there but are not a TUDataset: one line naming the raw folder."""
    write_tu(tmp_path / "raw", "BAD", [[(1, 2)]])
    (tmp_path / "raw" / "TUDataset" / "BAD" / "raw" / "BAD_A.txt").write_text("not, numbers\n")
    home = re.escape(str(tmp_path / "raw" / "TUDataset" / "BAD" / "raw"))
    with pytest.raises(PipelineError, match=rf"cannot read TUDataset BAD in {home} \("):
        tu(tmp_path, name="BAD", download=False).prepare_data()


def test_prepare_stage_writes_dataset_and_folds(tmp_path):
    """Raw files copied from $DATA_MIRROR into data/raw/TUDataset/MUTAG/raw/, the processed
    dataset and its folds under data/processed/tudataset/MUTAG/ (paths.data_dir in tmp)."""
    if not (MUTAG_RAW / "MUTAG_A.txt").exists():
        pytest.skip(f"dataset missing in the mirror: {MUTAG_RAW}")
    data = tmp_path / "data"
    common = ["data=tudataset", f"paths.data_dir={data}", "data.download=false"]
    assert_ok(run_module("src.prepare", *common))
    assert (data / "raw" / "TUDataset" / "MUTAG" / "raw" / "MUTAG_A.txt").is_file()
    dataset = data / "processed" / "tudataset" / "MUTAG"
    assert (dataset / "processed" / "data.pt").is_file()
    assert (dataset / "splits" / "stratified-10fold-seed0.json").is_file()
    assert not (dataset / "raw").exists()  # raw files stay in their home
    assert_one_error_line(run_module("src.prepare", *common, "data.fold=10"), "data.fold=10 is out")


# ---------------------------------------------------------------- MoleculeNet: ESOL


def test_esol_batches_follow_the_contract(esol_root):
    dm = esol(esol_root)
    assert len(dm.dataset) == 1128
    kwargs = dm.model_kwargs
    assert {k: kwargs[k] for k in ("task", "in_channels", "out_channels", "edge_channels")} == {
        "task": "graph_regression", "in_channels": 177, "out_channels": 1, "edge_channels": 30,
    }  # fmt: skip
    y = dm.targets[dm.splits["train"]]
    assert kwargs["target_mean"] == pytest.approx([y.mean().item()])  # train split only
    assert kwargs["target_std"] == pytest.approx([y.std().item()])
    assert kwargs["target_mean"] != pytest.approx([dm.targets.mean().item()])
    batch = next(iter(dm.train_dataloader()))
    n, e = batch.num_nodes, batch.num_edges
    assert batch.y.shape == (64, 1) and batch.y.dtype == torch.float
    assert batch.x.shape == (n, 177) and batch.edge_attr.shape == (e, 30)
    for features, ones in ((batch.x, 9), (batch.edge_attr, 3)):  # one 1 per integer feature
        assert features.dtype == torch.float and set(features.unique().tolist()) == {0.0, 1.0}
        assert torch.equal(features.sum(1), torch.full((len(features),), float(ones)))
    assert batch.pos.shape == (n, 3) and batch.pos.dtype == torch.float


def test_esol_coordinates_are_3d(esol_root):
    """Bonded C, N, O atoms lie 1.2-1.6 Å apart (C-C 1.54, aromatic 1.39, C=C 1.34, C-O 1.43,
    C=O 1.21), so coordinates and atom order match; bonds to Cl, S, P, Br, I are longer (1.7 to
    2.15). And the molecules are not flat depictions: sp3 atoms put atoms out of any plane."""
    dm = esol(esol_root)
    first_row, other, thick = [], [], 0
    for i in range(len(dm.dataset)):
        data = dm.dataset.get(i)  # stored: x[:, 0] is the element
        src, dst = data.edge_index
        length = (data.pos[src] - data.pos[dst]).norm(dim=1)
        cno = torch.isin(data.x[src, 0], torch.tensor([6, 7, 8]))
        cno &= torch.isin(data.x[dst, 0], torch.tensor([6, 7, 8]))
        first_row.append(length[cno])
        other.append(length[~cno])
        thick += data.num_nodes >= 4 and torch.linalg.svdvals(data.pos - data.pos.mean(0))[2] > 0.3
    first_row, other = torch.cat(first_row), torch.cat(other)
    assert (
        len(first_row) > 27000 and ((first_row > 1.15) & (first_row < 1.6)).float().mean() > 0.999
    )
    assert other.min() > 1.2 and other.max() < 2.3
    assert thick > 500


def test_conformer_falls_back_to_2d(monkeypatch):
    from rdkit.Chem import AllChem
    from torch_geometric.utils import from_smiles

    monkeypatch.setattr(AllChem, "EmbedMolecule", lambda *args: -1)
    conformer = Conformer()
    data = conformer(from_smiles("CC(C)O"))
    assert conformer.flat == 1 and data.pos.shape == (4, 3)
    assert torch.equal(data.pos[:, 2], torch.zeros(4)) and data.pos[:, :2].abs().sum() > 0


@pytest.mark.parametrize("split", ["random", "scaffold"])
def test_esol_splits_are_disjoint_and_cover(esol_root, split):
    from rdkit.Chem.Scaffolds import MurckoScaffold

    dm = esol(esol_root, split=split)
    splits = {k: v.tolist() for k, v in dm.splits.items()}
    assert sorted(i for k in SPLITS for i in splits[k]) == list(range(1128))
    assert [len(splits[k]) for k in SPLITS] == pytest.approx([902, 113, 113], abs=2)
    assert dm.splits_path.is_file()
    if split == "random":
        assert torch.equal(esol(esol_root).splits["test"], dm.splits["test"])
        reseeded = esol(esol_root, split_seed=1)
        assert not torch.equal(reseeded.splits["test"], dm.splits["test"])
    else:
        scaffolds = {
            k: {MurckoScaffold.MurckoScaffoldSmiles(dm.dataset.get(i).smiles) for i in splits[k]}
            for k in SPLITS
        }
        assert not scaffolds["train"] & scaffolds["val"]
        assert not scaffolds["train"] & scaffolds["test"]
        assert not scaffolds["val"] & scaffolds["test"]


def test_unparsable_smiles_are_skipped_and_counted(tmp_path, caplog):
    write_csv(tmp_path / "raw", ["CCO", "not a molecule", "c1ccccc1", "C1CC"])
    with caplog.at_level(logging.INFO, logger="src.data.molecules"):
        dm = esol(tmp_path, download=False)
        assert len(dm.dataset) == 2
    assert "skipped 2 SMILES RDKit cannot parse" in caplog.text
    assert dm.dataset[1].pos.shape == (6, 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(name="NOPE"), "unknown MoleculeNet dataset 'NOPE'"),
        (dict(name="Tox21"), "MoleculeNet Tox21 has several labels per molecule"),
        (dict(split="stratified"), "unknown split 'stratified'"),
        (dict(task="node"), "task 'node' is not a task of a graph-set dataset"),
        (
            dict(mirror="/nonexistent", download=False),
            r"^dataset esol: delaney-processed\.csv not found in .*/raw/esol; .*DATA_MIRROR.*"
            r"the mirror /nonexistent/esol lacks 1 of them",
        ),
        (
            dict(download=False),
            r"^dataset esol: delaney-processed\.csv not found in .*/raw/esol; put the files there "
            r"\(from https://.*\), or set DATA_MIRROR .*\(downloads are off \(data\.download=false",
        ),
    ],
)
def test_bad_molecule_settings(tmp_path, kwargs, message):
    with pytest.raises(PipelineError, match=message):
        esol(tmp_path, **kwargs).prepare_data()


def test_bad_molecule_files(tmp_path, esol_root):
    empty = write_csv(tmp_path / "a" / "raw", [])
    with pytest.raises(PipelineError, match=rf"{re.escape(str(empty))} holds no molecules"):
        esol(tmp_path / "a", download=False).prepare_data()
    junk = write_csv(tmp_path / "b" / "raw", ["not a molecule", "C1CC"])
    with pytest.raises(
        PipelineError,
        match=rf"RDKit cannot parse any of the 2 SMILES strings in {re.escape(str(junk))}",
    ):
        esol(tmp_path / "b", download=False).prepare_data()
    foreign = write_csv(tmp_path / "c" / "raw", ["CCO"])
    foreign.write_text("name,smiles,solubility\nethanol,CCO,high\n")  # another csv's columns
    with pytest.raises(
        PipelineError, match=rf"cannot read MoleculeNet ESOL from {re.escape(str(foreign))} \("
    ):
        esol(tmp_path / "c", download=False).prepare_data()
    with pytest.raises(PipelineError, match="ESOL is a graph_regression dataset"):
        esol(esol_root, task="graph_classification").prepare_data()
