"""Datasets of many small graphs for graph-level tasks (Bishop, sec. 13.1.3): one label per graph.

Inductive, mini-batch training: each graph is an example, and PyG's `DataLoader` packs a batch
of B graphs into one disconnected graph, a `torch_geometric.data.Batch` with

    x          float (N, F)     node features of all B graphs, stacked
    edge_index long  (2, E)     edges, renumbered into the stacked node list
    edge_attr  float (E, D_e)   edge features, where the dataset has them
    pos        float (N, 3)     coordinates, where the dataset has them (molecules)
    batch      long  (N,)       the graph each node belongs to, 0..B-1, for the readout
    y          long  (B,)       class of each graph (classification), or
               float (B, T)     T targets of each graph (regression)

and `model_kwargs` tells the model `task`, `in_channels` (F), `out_channels` (classes or T),
`edge_channels` (D_e, 0 without) and, for regression, `target_mean` / `target_std` (T floats of
the training split), so that it can standardise its targets.

The train/val/test split is fixed: it is drawn once with `split_seed` and saved as JSON beside
the processed data, `<root>/<name>/splits/<spec>.json`, so that the DVC prepare stage
(`python -m src.prepare data=tudataset ...`) produces the dataset and its splits, and every
later run (any model, any machine) reads the same graphs for training and evaluation.

    python -m src.prepare data=tudataset data.name=MUTAG

TUDataset (Morris et al. 2020; MUTAG, PROTEINS, NCI1, IMDB-BINARY, ...; any name of the
collection) comes through PyG's `torch_geometric.datasets.TUDataset(root, name)`, reading
`<name>_*.txt` from their home `data/raw/TUDataset/<name>/raw/` (filled by
`src.data.sources.fetch`: the mirror, else a download) and writing `<root>/<name>/processed/`.
Molecules from MoleculeNet are in src/data/molecules.py.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytorch_lightning as pl
import torch

from src.data import sources
from src.data.graphs import ends_with_newline, reading_raw_from, reason, write_json
from src.utils.errors import PipelineError

log = logging.getLogger(__name__)

TASKS = ("graph_classification", "graph_regression")
SPLITS = ("train", "val", "test")
FEATURELESS = ("degree", "constant")


def kfold(labels: torch.Tensor | None, n: int, num_folds: int, seed: int) -> list[list[int]]:
    """Split range(n) into `num_folds` folds, seeded; stratified when `labels` (n,) are given.

    Stratified: the members of each class are shuffled, the classes laid end to end, and the
    i-th graph of that order goes to fold i mod k. Each class is then spread over the folds as
    evenly as possible (counts differ by at most 1), and so are the fold sizes: the properties
    of sklearn's StratifiedKFold, which draws the GIN code's folds (the draw itself differs).
    """
    g = torch.Generator().manual_seed(seed)
    if labels is None:
        order = torch.randperm(n, generator=g)
    else:
        members = [(labels == c).nonzero().view(-1) for c in labels.unique(sorted=True)]
        order = torch.cat([m[torch.randperm(len(m), generator=g)] for m in members])
    return [order[i::num_folds].sort().values.tolist() for i in range(num_folds)]


@contextmanager
def _removed_on_failure(folder: Path) -> Iterator[None]:
    """Remove `folder`, and the folders above it the block created, when the block fails: PyG
    makes processed/ before it reads a raw file and saves data.pt before any check here, and
    a folder left behind would look prepared."""
    created = None
    for p in (folder, *folder.parents):
        if p.exists():
            break
        created = p
    try:
        yield
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


def check_finite(dataset, name: str) -> None:
    """NaN or infinite targets or features (a raw file's `nan`, 1e999, a value past float32's
    range) would show only as a NaN loss, far from their cause."""
    for key, what in [("y", "targets"), ("x", "node features"), ("edge_attr", "edge features"),
                      ("pos", "coordinates")]:  # fmt: skip
        value = getattr(dataset, key, None)  # the stored tensor of all graphs, not transformed
        if value is not None and value.is_floating_point() and not value.isfinite().all():
            raise PipelineError(f"{name} has {what} that are not finite (NaN or infinite)")


class GraphSetDataModule(pl.LightningDataModule):
    """Many graphs, batched by PyG's DataLoader, with a fixed split saved beside the dataset.

    Subclasses set `self.name`, `self.dataset_dir` (`<root>/<name>`, holding raw/, processed/
    and splits/) and implement `load()` (the PyG InMemoryDataset), `split_spec` (the split's
    file name, without .json) and `make_splits()` (what that file holds); `pick()` turns the
    file's content into the train/val/test index lists.
    """

    def __init__(self, batch_size: int, num_workers: int, task: str | None):
        super().__init__()
        if task is not None and task not in TASKS:
            raise PipelineError(
                f"task {task!r} is not a task of a graph-set dataset; choose one of {TASKS} "
                "(or null for the dataset's own)"
            )
        if batch_size < 1:
            raise PipelineError(f"data.batch_size={batch_size} must be at least 1")
        self.batch_size, self.num_workers, self.requested_task = batch_size, num_workers, task
        self._dataset = None
        self._splits = None

    # ------------------------------------------------------------ what subclasses provide

    def load(self):
        raise NotImplementedError

    @property
    def split_spec(self) -> str:
        raise NotImplementedError

    def make_splits(self) -> dict:
        raise NotImplementedError

    def pick(self, saved: dict) -> dict[str, list[int]]:
        return {split: saved[split] for split in SPLITS}

    def natural_task(self) -> str:
        """The dataset's own task: regression for float targets, else classification."""
        return TASKS[1] if self.dataset.y.is_floating_point() else TASKS[0]

    # ------------------------------------------------------------ the data

    @property
    def dataset(self):
        """The whole PyG InMemoryDataset, fetched and processed on first use; processing that
        fails, or gives values that are not finite, leaves no processed folder behind."""
        if self._dataset is None:
            with _removed_on_failure(self.dataset_dir / "processed"):
                dataset = self.load()
                check_finite(dataset, self.name)
            self._dataset = dataset
            self.task  # noqa: B018  a task the dataset cannot serve fails here, before any split
        return self._dataset

    @property
    def task(self) -> str:
        task = self.natural_task()
        if self.requested_task not in (None, task):
            raise PipelineError(
                f"{self.name} is a {task} dataset: task={self.requested_task!r} is not supported"
            )
        return task

    @property
    def targets(self) -> torch.Tensor:
        """Every graph's target, in dataset order: long (G,) classes or float (G, T) values."""
        y = self.dataset.y
        if self.task == TASKS[0]:
            return y.view(-1).long()
        return y.view(len(self.dataset), -1).float()

    def trivial_targets(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The targets of the training graphs and of `split`'s."""
        return self.targets[self.splits["train"]], self.targets[self.splits[split]]

    @property
    def splits_path(self) -> Path:
        return self.dataset_dir / "splits" / f"{self.split_spec}.json"

    @property
    def splits(self) -> dict[str, torch.Tensor]:
        """train/val/test graph indices (long tensors), read from the saved split, which is
        drawn and written on first use."""
        if self._splits is None:
            n, path = len(self.dataset), self.splits_path
            if path.is_file():
                saved = json.loads(path.read_text())
                if saved.get("num_graphs") != n:
                    raise PipelineError(
                        f"the saved split {path} is for {saved.get('num_graphs')} graphs, but "
                        f"{self.name} has {n}; delete it to draw a new one"
                    )
            else:
                saved = {"num_graphs": n, **self.make_splits()}
                write_json(path, saved)
                log.info("%s: split saved to %s", self.name, path)
            self._splits = {
                k: torch.tensor(v, dtype=torch.long) for k, v in self.pick(saved).items()
            }
            for split, index in self._splits.items():
                if len(index) == 0:
                    raise PipelineError(f"{self.name} has no graphs in its {split} split")
            log.info(
                "%s: %d graphs, %d node features, %d edge features, task %s; "
                "train/val/test graphs %s",
                self.name, n, self.in_channels, self.edge_channels, self.task,
                "/".join(str(len(self._splits[s])) for s in SPLITS),
            )  # fmt: skip
        return self._splits

    @property
    def in_channels(self) -> int:
        return self.dataset[0].x.size(1)

    @property
    def edge_channels(self) -> int:
        edge_attr = self.dataset[0].get("edge_attr")
        return 0 if edge_attr is None else edge_attr.size(1)

    @property
    def model_kwargs(self) -> dict:
        """What the model needs to know about the data (train.py passes it to the model)."""
        kwargs = {"task": self.task, "in_channels": self.in_channels}
        y = self.targets
        if self.task == TASKS[0]:
            kwargs["out_channels"] = int(y.max()) + 1
        else:
            train = y[self.splits["train"]]
            kwargs["out_channels"] = y.size(1)
            kwargs["target_mean"] = train.mean(0).tolist()
            kwargs["target_std"] = train.std(0).tolist()
        kwargs["edge_channels"] = self.edge_channels
        return kwargs

    # ------------------------------------------------------------ Lightning's hooks

    def prepare_data(self) -> None:
        self.splits  # noqa: B018  fetch, process and split once, so that model_kwargs can be read

    def setup(self, stage: str | None = None) -> None:
        self.splits  # noqa: B018

    def _loader(self, split: str):
        from torch_geometric.loader import DataLoader

        return DataLoader(
            self.dataset[self.splits[split]],
            batch_size=self.batch_size,
            shuffle=split == "train",
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self):
        return self._loader("train")

    def val_dataloader(self):
        return self._loader("val")

    def test_dataloader(self):
        return self._loader("test")


class TUFeatures:
    """What TUDataset graphs go through on access (PyG's `transform`), so that every graph has
    float node features x and only non-empty edge features.

    x is the one-hot node label (and, with use_node_attr, the node attributes). Graphs without
    either (the social networks: IMDB-BINARY, COLLAB, REDDIT-...) get, as in the GIN paper, a
    one-hot of the node's degree, (N, max_degree + 1) with max_degree over the whole dataset
    (`fill="degree"`), or a constant 1, (N, 1) (`fill="constant"`, GIN's choice for REDDIT,
    whose degrees run into the thousands). Edge features of zero width (no edge labels) are
    dropped; regression targets become (1, T) per graph, so that a batch holds (B, T).
    """

    def __init__(self, fill: str | None, max_degree: int, regression: bool):
        self.fill, self.max_degree, self.regression = fill, max_degree, regression

    def __call__(self, data):
        from torch_geometric.utils import degree, one_hot

        if self.fill == "degree":
            deg = degree(data.edge_index[0], data.num_nodes, dtype=torch.long)
            data.x = one_hot(deg, num_classes=self.max_degree + 1)
        elif self.fill == "constant":
            data.x = torch.ones(data.num_nodes, 1)
        if data.get("edge_attr") is not None and data.edge_attr.size(1) == 0:
            del data.edge_attr
        if self.regression:
            data.y = data.y.view(1, -1).float()
        return data


class TUDataModule(GraphSetDataModule):
    """A dataset of the TUDataset collection by name (MUTAG, PROTEINS, NCI1, IMDB-BINARY, ...),
    split for k-fold cross-validation as in the GIN paper (Xu et al. 2019).

    The graphs are dealt into `num_folds` folds with `split_seed`, stratified by class (plain
    shuffled folds for regression targets); run `fold` trains on the other folds and holds this
    one out. The held-out fold is both the val and the test split: GIN reports the accuracy on
    the held-out folds at the one epoch where its mean over the 10 folds is best, so a run logs
    val/acc (= test/acc) per epoch on its fold and the sweep over fold=0..9 picks the epoch. The
    epoch is thus chosen on the test folds, which flatters the figures (Errica et al. 2020);
    it is the protocol the published numbers use.
    """

    def __init__(
        self,
        root: str,
        name: str = "MUTAG",
        raw_dir: str = "data/raw",
        mirror: str | None = None,
        download: bool = True,
        task: str | None = None,
        use_node_attr: bool = False,
        featureless: str = "degree",
        num_folds: int = 10,
        fold: int = 0,
        split_seed: int = 0,
        batch_size: int = 32,
        num_workers: int = 0,
    ):
        super().__init__(batch_size, num_workers, task)
        if featureless not in FEATURELESS:
            raise PipelineError(f"unknown featureless={featureless!r}; choose one of {FEATURELESS}")
        if num_folds < 2:
            raise PipelineError(f"data.num_folds={num_folds} must be at least 2")
        if not 0 <= fold < num_folds:
            raise PipelineError(
                f"data.fold={fold} is out of range: the {num_folds} folds are 0..{num_folds - 1}"
            )
        self.save_hyperparameters(logger=False)
        self.name, self.root = sources.plain_name(name), Path(root)
        self.dataset_dir = self.root / name  # PyG's processed/ and the splits/

    def load(self):
        from torch_geometric.datasets import TUDataset
        from torch_geometric.utils import degree

        hp = self.hparams
        raw = sources.fetch(sources.tudataset(self.name), hp.raw_dir, hp.mirror, hp.download)
        fresh = not (self.dataset_dir / "processed" / "data.pt").is_file()
        if fresh:  # what PyG's reader takes on trust, checked before it processes the files
            for f in sorted(raw.glob(f"{self.name}_*.txt")):
                empty = f.stat().st_size == 0
                if empty or not ends_with_newline(f):
                    why = "is empty" if empty else "does not end with a newline"
                    raise PipelineError(
                        f"cannot read TUDataset {self.name} in {raw} ({f.name} {why}: cut off?)"
                    )
        try:
            dataset = reading_raw_from(TUDataset, raw)(
                str(self.root), self.name, use_node_attr=hp.use_node_attr
            )
        except Exception as e:  # e.g. a truncated or foreign file
            raise PipelineError(f"cannot read TUDataset {self.name} in {raw} ({reason(e)})") from e
        for i in range(len(dataset) if fresh else 0):
            g = dataset.get(i)  # PyG keeps an edge to a node number past its graph's nodes
            if g.num_edges and int(g.edge_index.max()) >= g.num_nodes:
                raise PipelineError(
                    f"cannot read TUDataset {self.name} in {raw} (graph {i + 1} has an edge to "
                    f"its node {int(g.edge_index.max()) + 1}, but {g.num_nodes} nodes)"
                )
        x = dataset.get(0).get("x")  # get(): the stored graph, before any transform
        fill = hp.featureless if x is None or x.size(1) == 0 else None
        max_degree = 0
        if fill == "degree":
            graphs = (dataset.get(i) for i in range(len(dataset)))
            max_degree = max(int(degree(g.edge_index[0], g.num_nodes).max()) for g in graphs)
        regression = dataset.y.is_floating_point()
        dataset.transform = TUFeatures(fill, max_degree, regression)
        return dataset

    @property
    def split_spec(self) -> str:
        kind = "stratified" if self.task == TASKS[0] else "random"
        return f"{kind}-{self.hparams.num_folds}fold-seed{self.hparams.split_seed}"

    def make_splits(self) -> dict:
        hp = self.hparams
        labels = self.targets if self.task == TASKS[0] else None
        return {"folds": kfold(labels, len(self.dataset), hp.num_folds, hp.split_seed)}

    def pick(self, saved: dict) -> dict[str, list[int]]:
        folds = saved["folds"]
        held_out = folds[self.hparams.fold]
        train = sorted(i for k, fold in enumerate(folds) if k != self.hparams.fold for i in fold)
        return {"train": train, "val": held_out, "test": held_out}
