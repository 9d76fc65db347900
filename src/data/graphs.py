"""Graphs for node classification (Bishop, sec. 13.1.2): one graph, some nodes labelled.

Transductive, full-batch training as in Kipf & Welling (2017) and Veličković et al. (2018): every
step sees the whole graph (all node features x, all edges), and boolean masks pick the nodes
whose labels count, `train_mask` for the loss and `val_mask` / `test_mask` for the evaluation.
Each dataloader therefore yields the one graph once: an epoch is one optimisation step.

    python -m src.train model=gcn data=planetoid data.raw_root=../shared/data/planetoid
    python -m src.train model=gcn data=karate        # built into PyG: offline everywhere

Planetoid (Cora, CiteSeer, PubMed; Yang et al. 2016) comes through PyG's
`torch_geometric.datasets.Planetoid(root, name)`, which reads `<root>/<name>/raw/ind.<name>.*`
(fetching them when they are absent and the network is there) and writes
`<root>/<name>/processed/`. `root` is therefore a writable folder under data/; a read-only copy
of the raw files elsewhere (`raw_root`, laid out as `<raw_root>/<name>/raw/`) is copied into it
first. Features are row-normalised (`NormalizeFeatures`), as both papers do.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from src.utils.errors import PipelineError

log = logging.getLogger(__name__)

PLANETOID = ("Cora", "CiteSeer", "PubMed")
PLANETOID_SPLITS = ("public", "full", "random")
PLANETOID_RAW = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
MASKS = ("train_mask", "val_mask", "test_mask")


def _single(batch: list):
    return batch[0]  # a "batch" of one graph is the graph itself


class FullGraphDataModule(pl.LightningDataModule):
    """One graph for training, validation and testing; subclasses build it in `load()`.

    A batch is a `torch_geometric.data.Data` with x (N, F), edge_index (2, E), y (N,) and the
    boolean masks train_mask, val_mask, test_mask (N,).
    """

    def __init__(self):
        super().__init__()
        self._data = None

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
        return {"in_channels": self.data.num_features, "num_classes": int(self.data.y.max()) + 1}

    def _loader(self) -> DataLoader:
        return DataLoader([self.data], batch_size=1, collate_fn=_single)

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()

    def test_dataloader(self) -> DataLoader:
        return self._loader()


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
        raw_root: str | None = None,
        download: bool = True,
        split: str = "public",
        num_train_per_class: int = 20,
        num_val: int = 500,
        num_test: int = 1000,
        split_seed: int = 0,
        normalize_features: bool = True,
    ):
        super().__init__()
        canonical = {n.lower(): n for n in PLANETOID}
        if name.lower() not in canonical:
            raise PipelineError(f"unknown Planetoid dataset {name!r}; choose one of {PLANETOID}")
        if split not in PLANETOID_SPLITS:
            raise PipelineError(f"unknown split {split!r}; choose one of {PLANETOID_SPLITS}")
        name = canonical[name.lower()]
        self.save_hyperparameters(logger=False)
        self.name, self.root = name, Path(root)
        self.raw_dir = self.root / name / "raw"  # where PyG reads; processed/ goes beside it

    def raw_files(self, raw_dir: Path) -> list[Path]:
        return [raw_dir / f"ind.{self.name.lower()}.{suffix}" for suffix in PLANETOID_RAW]

    def _copy_raw(self) -> None:
        """Copy `<raw_root>/<name>/raw/ind.*` into `<root>/<name>/raw/` (once)."""
        source = Path(self.hparams.raw_root).expanduser() / self.name / "raw"
        missing = [f.name for f in self.raw_files(source) if not f.is_file()]
        if missing:
            raise PipelineError(
                f"Planetoid {self.name} raw files missing in {source}: {', '.join(missing)} "
                f"(data.raw_root must hold {self.name}/raw/ind.{self.name.lower()}.*)"
            )
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        for src, dst in zip(self.raw_files(source), self.raw_files(self.raw_dir), strict=True):
            if not dst.is_file() or dst.stat().st_size != src.stat().st_size:
                tmp = dst.with_name(dst.name + ".part")
                shutil.copyfile(src, tmp)
                tmp.replace(dst)  # never a half-copied file under its real name

    def load(self):
        from torch_geometric.datasets import Planetoid
        from torch_geometric.transforms import NormalizeFeatures

        hp = self.hparams
        if hp.raw_root:
            self._copy_raw()
        have_raw = all(f.is_file() for f in self.raw_files(self.raw_dir))
        hint = (
            f"set data.raw_root to a folder holding {self.name}/raw/ind.{self.name.lower()}.* "
            "(e.g. ../shared/data/planetoid)"
        )
        if not have_raw and not hp.download:
            raise PipelineError(
                f"Planetoid {self.name} not found in {self.raw_dir} and data.download=false; {hint}"
            )
        try:
            # the random split draws with torch's global generator: make it a function of
            # split_seed alone, and leave the run's random stream as it was
            with torch.random.fork_rng():
                torch.manual_seed(hp.split_seed)
                dataset = Planetoid(
                    str(self.root),
                    self.name,
                    split=hp.split,
                    num_train_per_class=hp.num_train_per_class,
                    num_val=hp.num_val,
                    num_test=hp.num_test,
                    transform=NormalizeFeatures() if hp.normalize_features else None,
                )
        except Exception as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if have_raw:  # e.g. a truncated or foreign file
                raise PipelineError(
                    f"cannot read Planetoid {self.name} from {self.root / self.name} ({reason})"
                ) from e
            raise PipelineError(
                f"could not download Planetoid {self.name} into {self.raw_dir} ({reason}); "
                f"offline, {hint}"
            ) from e
        return dataset[0]  # the transform runs here, once


class KarateClubDataModule(FullGraphDataModule):
    """Zachary's karate club (34 members, 78 friendships, one-hot node features), labelled by
    the 4 communities of Kipf & Welling's modularity clustering, from PyG's built-in `KarateClub`.

    PyG marks one training node per community. Here the split is drawn with `split_seed`:
    `num_train_per_class` nodes of each community train (1, as in PyG), `num_val` of the rest
    validate and the remaining nodes test (with the defaults 4 / 10 / 20 nodes).
    """

    def __init__(self, num_train_per_class: int = 1, num_val: int = 10, split_seed: int = 0):
        super().__init__()
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
