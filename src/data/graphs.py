"""Single graphs for node classification and link prediction (Bishop, sec. 13.1.2-13.1.3).

Full-batch training as in Kipf & Welling (2017) and Veličković et al. (2018): every step sees the
whole graph, and each dataloader yields one graph once, so an epoch is one optimisation step.

task="node": boolean masks pick the nodes whose labels count, `train_mask` for the loss and
`val_mask` / `test_mask` for the evaluation. Transductive by default (training sees the features
and edges of every node, labels of the training nodes only); with inductive=true training sees
only the subgraph without the val and test nodes, which are new nodes at evaluation (GraphSAGE's
setting, Hamilton et al. 2017).

task="link": PyG's RandomLinkSplit holds out a seeded fraction of the edges for validation and
for testing, each with as many node pairs that are not edges; message passing at training time
uses the training edges only (at test time the training and validation edges).

    python -m src.train model=gcn data=planetoid
    python -m src.train model=gcn data=planetoid task=link
    python -m src.train model=gcn data=karate        # built into PyG: offline everywhere

Planetoid (Cora, CiteSeer, PubMed; Yang et al. 2016) comes through PyG's
`torch_geometric.datasets.Planetoid(root, name)`, reading the raw files `ind.<name>.*` from their
home `data/raw/planetoid/<name>/raw/` (filled by `src.data.sources.fetch`: the mirror, else a
download) and writing `<root>/<name>/processed/`. Features are row-normalised
(`NormalizeFeatures`), as both papers do.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from src.data import sources
from src.utils.errors import PipelineError
from src.utils.files import atomic_file

log = logging.getLogger(__name__)

PLANETOID = ("Cora", "CiteSeer", "PubMed")
PLANETOID_SPLITS = ("public", "full", "random")
MASKS = ("train_mask", "val_mask", "test_mask")


def reading_raw_from(cls: type, raw_dir: Path) -> type:
    """PyG's dataset class `cls`, reading its raw files from `raw_dir` (the dataset's home under
    data/raw) rather than from `<root>/<name>/raw`: raw files stay in one place, and PyG writes
    only its processed files under `root`, each atomically (PyG takes an existing processed
    file as done, so a kill during its save must not leave half of one)."""
    from torch_geometric.io import fs

    def process(self) -> None:
        save = fs.torch_save  # every file PyG's processing writes goes through it

        def atomic_save(data, path: str) -> None:
            with atomic_file(Path(path)) as tmp:
                save(data, str(tmp))

        fs.torch_save = atomic_save
        try:
            cls._process(self)
        finally:
            fs.torch_save = save

    attributes = {"raw_dir": property(lambda self: str(raw_dir)), "_process": process}
    return type(cls.__name__, (cls,), attributes)


def write_json(path: Path, obj) -> None:
    """Write JSON atomically (tmp file + replace): readers see the old file or the whole new one."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(obj))


def reason(e: Exception) -> str:
    """The first line of an exception's message, for a one-line PipelineError."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def ends_with_newline(path: Path) -> bool:
    """Whether a raw text file ends with a newline: PyG's readers (TUDataset's, MoleculeNet's)
    drop whatever follows the last one, so a file cut off mid-line would lose that line."""
    with path.open("rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return True  # empty: nothing to lose
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Draws inside are a function of `seed` alone, whichever generator PyG uses (torch, NumPy or
    Python's), and the run's random streams continue afterwards as if nothing had been drawn."""
    state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        try:
            yield
        finally:
            random.setstate(state[0])
            np.random.set_state(state[1])


def _single(batch: list):
    return batch[0]  # a "batch" of one graph is the graph itself


class FullGraphDataModule(pl.LightningDataModule):
    """One graph for training, validation and testing; subclasses build it in `load()`.

    A batch is a `torch_geometric.data.Data` with x (N, F), edge_index (2, E), y (N,) and the
    boolean masks train_mask, val_mask, test_mask (N,); for task="link" also edge_label_index
    (2, P), the node pairs to score, and edge_label (P,), 1 for an edge and 0 for a non-edge.
    """

    TASKS = ("node", "link")

    def __init__(
        self,
        task: str | None = None,
        inductive: bool = False,
        link_val: float = 0.05,
        link_test: float = 0.1,
        split_seed: int = 0,
    ):
        super().__init__()
        task = task or "node"
        if task not in self.TASKS:
            raise PipelineError(
                f"task={task!r} does not fit a single graph; choose one of {self.TASKS}"
            )
        self.task, self.inductive = task, inductive
        self.link_val, self.link_test, self.split_seed = link_val, link_test, split_seed
        self._data = None
        self._splits = None

    def load(self):
        raise NotImplementedError

    @property
    def data(self):
        if self._data is None:
            data = self.load()
            for mask in MASKS:
                if int(getattr(data, mask).sum()) == 0:
                    raise PipelineError(f"the graph has no nodes in its {mask}")
            log.info(
                "graph: %d nodes, %d edges, %d features, %d classes; train/val/test nodes %s",
                data.num_nodes, data.num_edges, data.num_features, int(data.y.max()) + 1,
                "/".join(str(int(getattr(data, m).sum())) for m in MASKS),
            )  # fmt: skip
            self._data = data
        return self._data

    def prepare_data(self) -> None:
        self.data  # noqa: B018  fetch / process once, so that model_kwargs can be read

    @property
    def model_kwargs(self) -> dict:
        """What the model needs to know about the data (train.py passes it to the model)."""
        kwargs = {"task": self.task, "in_channels": self.data.num_features}
        if self.task == "node":
            kwargs["out_channels"] = int(self.data.y.max()) + 1  # classes
        return kwargs

    def trivial_targets(self, split: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The classes of the training nodes and of `split`'s (node task; None for links)."""
        if self.task != "node":
            return None
        data = self.data
        return data.y[data.train_mask], data.y[data[f"{split}_mask"]]

    @property
    def splits(self) -> dict:
        """The graph each stage sees: {"train": Data, "val": Data, "test": Data}."""
        if self._splits is None:
            data = self.data
            if self.task == "link":
                from torch_geometric.transforms import RandomLinkSplit

                split = RandomLinkSplit(
                    num_val=self.link_val,
                    num_test=self.link_test,
                    is_undirected=data.is_undirected(),
                    add_negative_train_samples=False,  # drawn afresh at every training step
                )
                with seeded(self.split_seed):
                    train, val, test = split(data)
            elif self.inductive:  # training never sees the val and test nodes or their edges
                train = data.subgraph(~(data.val_mask | data.test_mask))
                val = test = data
            else:
                train = val = test = data
            self._splits = {"train": train, "val": val, "test": test}
        return self._splits

    def _loader(self, stage: str) -> DataLoader:
        return DataLoader([self.splits[stage]], batch_size=1, collate_fn=_single)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")


class PlanetoidDataModule(FullGraphDataModule):
    """Cora, CiteSeer or PubMed citation graphs: papers are nodes, citations undirected edges,
    bag-of-words features, the paper's topic as label.

    split="public": Planetoid's fixed split (20 labelled nodes per class for training, 500 for
    validation, 1000 for testing) that both papers use; "full": every node outside val and test
    trains; "random": `num_train_per_class`, `num_val`, `num_test` drawn with `split_seed`.
    """

    def __init__(
        self,
        root: str,
        name: str = "Cora",
        raw_dir: str = "data/raw",
        mirror: str | None = None,
        download: bool = True,
        split: str = "public",
        num_train_per_class: int = 20,
        num_val: int = 500,
        num_test: int = 1000,
        split_seed: int = 0,
        normalize_features: bool = True,
        task: str | None = None,
        inductive: bool = False,
        link_val: float = 0.05,
        link_test: float = 0.1,
    ):
        super().__init__(task, inductive, link_val, link_test, split_seed)
        canonical = {n.lower(): n for n in PLANETOID}
        if name.lower() not in canonical:
            raise PipelineError(f"unknown Planetoid dataset {name!r}; choose one of {PLANETOID}")
        if split not in PLANETOID_SPLITS:
            raise PipelineError(f"unknown split {split!r}; choose one of {PLANETOID_SPLITS}")
        name = canonical[name.lower()]
        self.save_hyperparameters(logger=False)
        self.name, self.root = name, Path(root)

    def load(self):
        from torch_geometric.datasets import Planetoid
        from torch_geometric.transforms import NormalizeFeatures

        hp = self.hparams
        raw = sources.fetch(sources.planetoid(self.name), hp.raw_dir, hp.mirror, hp.download)
        try:
            with seeded(hp.split_seed):  # the random split
                dataset = reading_raw_from(Planetoid, raw)(
                    str(self.root),
                    self.name,
                    split=hp.split,
                    num_train_per_class=hp.num_train_per_class,
                    num_val=hp.num_val,
                    num_test=hp.num_test,
                    transform=NormalizeFeatures() if hp.normalize_features else None,
                )
        except Exception as e:  # e.g. a truncated or foreign file
            raise PipelineError(f"cannot read Planetoid {self.name} in {raw} ({reason(e)})") from e
        return dataset[0]  # the transform runs here, once


class KarateClubDataModule(FullGraphDataModule):
    """Zachary's karate club (34 members, 78 friendships, one-hot node features), labelled by
    the 4 communities of Kipf & Welling's modularity clustering, from PyG's built-in `KarateClub`.

    PyG marks one training node per community. Here the split is drawn with `split_seed`:
    `num_train_per_class` nodes of each community train (1, as in PyG), `num_val` of the rest
    validate and the remaining nodes test (with the defaults 4 / 10 / 20 nodes).
    """

    def __init__(
        self,
        num_train_per_class: int = 1,
        num_val: int = 10,
        split_seed: int = 0,
        task: str | None = None,
        inductive: bool = False,
        link_val: float = 0.05,
        link_test: float = 0.1,
    ):
        super().__init__(task, inductive, link_val, link_test, split_seed)
        self.save_hyperparameters(logger=False)

    def load(self):
        from torch_geometric.datasets import KarateClub

        hp = self.hparams
        data = KarateClub()[0]
        n, g = data.num_nodes, torch.Generator().manual_seed(hp.split_seed)
        train = torch.zeros(n, dtype=torch.bool)
        for c in range(int(data.y.max()) + 1):
            nodes = (data.y == c).nonzero().view(-1)
            train[nodes[torch.randperm(len(nodes), generator=g)[: hp.num_train_per_class]]] = True
        rest = (~train).nonzero().view(-1)
        rest = rest[torch.randperm(len(rest), generator=g)]
        if not 0 < hp.num_val < len(rest):
            raise PipelineError(
                f"data.num_val={hp.num_val} must leave nodes for testing: {len(rest)} are not "
                "training nodes"
            )
        data.train_mask = train
        data.val_mask = torch.zeros(n, dtype=torch.bool).index_fill_(0, rest[: hp.num_val], True)
        data.test_mask = torch.zeros(n, dtype=torch.bool).index_fill_(0, rest[hp.num_val :], True)
        return data
