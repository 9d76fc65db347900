"""Molecules as graphs with 3D coordinates (Bishop, sec. 13.3.4): atoms are nodes, bonds edges.

MoleculeNet (Wu et al. 2018) through PyG's `torch_geometric.datasets.MoleculeNet(root, name)`,
which reads the dataset's csv from its home `data/raw/<name>/` (filled by
`src.data.sources.fetch`: the mirror, else a download) and turns each SMILES string into a
graph with `torch_geometric.utils.from_smiles`:
9 integer features per atom (element, chirality, degree, formal charge, hydrogens, radical
electrons, hybridisation, aromatic, in a ring) and 3 per bond (type, stereo, conjugated), each
bond as two directed edges. On access these become float one-hot vectors, x (N, 177) and
edge_attr (E, 30), with the sizes of PyG's `x_map` / `e_map`.

    python -m src.prepare data=esol

`pos` (N, 3) holds coordinates in Å from RDKit, computed once when the dataset is processed
(PyG's `pre_transform`): hydrogens added, one conformer embedded with ETKDG (Riniker & Landrum
2015) from a fixed seed, relaxed with the MMFF94 force field where MMFF has parameters for the
molecule, then the heavy atoms' coordinates, in from_smiles' atom order. Molecules that RDKit
cannot embed get 2D depiction coordinates with z = 0 (their count is logged). ESOL takes about
20 s on 2 CPU cores.

The split is `random` (80/10/10, drawn with `split_seed`; MoleculeNet's choice for ESOL) or
`scaffold` (Bemis & Murcko 1996; MoleculeNet's and OGB's harder split): molecules sharing a
scaffold (the ring systems and the chains linking them) stay together, the largest scaffold
groups fill the training split and the rare scaffolds go to validation and test, so that the
test molecules are structurally unlike the training ones. The scaffold split has no seed.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import torch

from src.data import sources
from src.data.graph_sets import SPLITS, TASKS, GraphSetDataModule
from src.data.graphs import ends_with_newline, reading_raw_from, reason
from src.utils.errors import PipelineError

log = logging.getLogger(__name__)

# the MoleculeNet datasets with one target per molecule: name -> (display name, task)
MOLECULENET = {
    "esol": ("ESOL", TASKS[1]),  # log10 solubility in mol/L (Delaney 2004), 1128 molecules
    "freesolv": ("FreeSolv", TASKS[1]),  # hydration free energy in kcal/mol, 642
    "lipo": ("Lipophilicity", TASKS[1]),  # octanol/water distribution coefficient, 4200
    "bace": ("BACE", TASKS[0]),  # inhibits human β-secretase 1, 1513
    "bbbp": ("BBBP", TASKS[0]),  # penetrates the blood-brain barrier, 2050
    "hiv": ("HIV", TASKS[0]),  # inhibits HIV replication, 41127
}
MULTI_LABEL = ("pcba", "muv", "tox21", "toxcast", "sider", "clintox")
MOLECULE_SPLITS = ("random", "scaffold")
FRACTIONS = (0.8, 0.1, 0.1)  # train / val / test
CONFORMER_SEED = 0


class SmilesParser:
    """PyG's `from_smiles`, counting the SMILES strings RDKit cannot parse: from_smiles turns
    those into graphs without atoms, which MoleculeNet skips."""

    def __init__(self):
        self.seen = self.failed = 0

    def __call__(self, smiles: str):
        from torch_geometric.utils import from_smiles

        data = from_smiles(smiles)
        self.seen += 1
        self.failed += data.num_nodes == 0
        return data


class Conformer:
    """The pre_transform: pos (N, 3) float, Å, for the N heavy atoms of `data.smiles`.

    RDKit parses the SMILES as from_smiles did, so the atoms come in the same order (checked
    against the element column of x); AddHs appends the hydrogens after them, which the
    embedding needs for realistic geometry and which are then dropped again.
    """

    def __init__(self):
        self.flat = 0  # molecules that got 2D coordinates

    def __call__(self, data):
        from rdkit import Chem
        from rdkit.Chem import AllChem

        mol = Chem.AddHs(Chem.MolFromSmiles(data.smiles))
        n = data.num_nodes
        elements = [atom.GetAtomicNum() for atom in mol.GetAtoms()][:n]
        if elements != data.x[:, 0].tolist():  # x_map["atomic_num"][k] = k: column 0 = element
            raise RuntimeError(f"RDKit's atom order differs from from_smiles' for {data.smiles}")
        params = AllChem.ETKDGv3()
        params.randomSeed = CONFORMER_SEED
        embedded = AllChem.EmbedMolecule(mol, params) == 0
        if not embedded:  # e.g. strained cages: start from random coordinates instead
            params.useRandomCoords = True
            embedded = AllChem.EmbedMolecule(mol, params) == 0
        if embedded:
            if AllChem.MMFFHasAllMoleculeParams(mol):
                AllChem.MMFFOptimizeMolecule(mol, maxIters=500)
        else:
            self.flat += 1
            mol = Chem.MolFromSmiles(data.smiles)
            AllChem.Compute2DCoords(mol)  # a depiction: z = 0
        data.pos = torch.tensor(mol.GetConformer().GetPositions()[:n], dtype=torch.float)
        return data

    def __repr__(self) -> str:  # PyG stores it, to notice a dataset processed differently
        return f"Conformer(ETKDGv3, MMFF94, seed={CONFORMER_SEED})"


class OneHotMolecule:
    """The transform on access: from_smiles' integer features as float one-hot vectors, x
    (N, 177) and edge_attr (E, 30), each the concatenation of one one-hot block per feature in
    the order of `x_map` / `e_map`; class labels as long (1,) per molecule, (B,) in a batch."""

    def __init__(self, classification: bool):
        from torch_geometric.utils.smiles import e_map, x_map

        self.classification = classification
        self.sizes = {
            key: torch.tensor([len(values) for values in table.values()])
            for key, table in (("x", x_map), ("edge_attr", e_map))
        }

    def __call__(self, data):
        for key, sizes in self.sizes.items():
            index = data[key] + (sizes.cumsum(0) - sizes)  # column j's values start at its offset
            data[key] = torch.zeros(len(index), int(sizes.sum())).scatter_(1, index, 1.0)
        if self.classification:
            data.y = data.y.view(-1).long()
        return data


def scaffold_groups(smiles: list[str]) -> list[list[int]]:
    """Indices of the molecules sharing a Bemis-Murcko scaffold, largest groups first (ties: the
    group whose first molecule comes later first), as deepchem's / OGB's scaffold split."""
    from rdkit import Chem
    from rdkit.Chem.Scaffolds import MurckoScaffold

    groups: dict[str, list[int]] = {}
    for i, s in enumerate(smiles):
        mol = Chem.MolFromSmiles(s)
        groups.setdefault(MurckoScaffold.MurckoScaffoldSmiles(mol=mol), []).append(i)
    return sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True)


class MoleculeNetDataModule(GraphSetDataModule):
    """A MoleculeNet dataset with one target per molecule: ESOL, FreeSolv, Lipophilicity
    (regression, y float (B, 1)) or BACE, BBBP, HIV (binary classification, y long (B,)).

    """

    def __init__(
        self,
        root: str,
        name: str = "ESOL",
        raw_dir: str = "data/raw",
        mirror: str | None = None,
        download: bool = True,
        task: str | None = None,
        split: str = "random",
        split_seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
    ):
        super().__init__(batch_size, num_workers, task)
        key = "lipo" if name.lower() == "lipophilicity" else name.lower()
        if key in MULTI_LABEL:
            raise PipelineError(
                f"MoleculeNet {name} has several labels per molecule, some of them missing: not "
                f"supported; choose one of {[v[0] for v in MOLECULENET.values()]}"
            )
        if key not in MOLECULENET:
            raise PipelineError(
                f"unknown MoleculeNet dataset {name!r}; choose one of "
                f"{[v[0] for v in MOLECULENET.values()]}"
            )
        if split not in MOLECULE_SPLITS:
            raise PipelineError(f"unknown split {split!r}; choose one of {MOLECULE_SPLITS}")
        self.save_hyperparameters(logger=False)
        self.key, self.name = key, MOLECULENET[key][0]
        self.root = Path(root)
        self.dataset_dir = self.root / key  # PyG's folder: raw/, processed/; splits/ beside

    def natural_task(self) -> str:
        return MOLECULENET[self.key][1]

    def load(self):
        from torch_geometric.datasets import MoleculeNet

        hp = self.hparams
        raw_dataset = sources.moleculenet(self.key)
        raw = sources.fetch(raw_dataset, hp.raw_dir, hp.mirror, hp.download)
        raw_path = raw / raw_dataset.files[0]
        fresh = not (self.dataset_dir / "processed" / "data.pt").is_file()
        if fresh:
            _check_csv(raw_path)
        parser, conformer, start = SmilesParser(), Conformer(), time.perf_counter()
        try:
            with warnings.catch_warnings():  # one per unparsable SMILES: counted and logged below
                warnings.filterwarnings("ignore", message="Skipping molecule")
                dataset = reading_raw_from(MoleculeNet, raw)(
                    str(self.root), self.key, pre_transform=conformer, from_smiles=parser
                )
        except Exception as e:
            if parser.seen and parser.failed == parser.seen:
                raise PipelineError(
                    f"RDKit cannot parse any of the {parser.seen} SMILES strings in {raw_path}"
                ) from e
            raise PipelineError(  # e.g. another dataset's csv
                f"cannot read MoleculeNet {self.name} from {raw_path} ({reason(e)})"
            ) from e
        if parser.seen:  # processed just now
            log.info(
                "%s: %d molecules processed in %.1f s, %d of them without a 3D conformer "
                "(2D coordinates, z = 0)",
                self.name, len(dataset), time.perf_counter() - start, conformer.flat,
            )  # fmt: skip
            if parser.failed:
                log.warning("%s: skipped %d SMILES RDKit cannot parse", self.name, parser.failed)
        dataset.transform = OneHotMolecule(classification=self.task == TASKS[0])
        return dataset

    @property
    def split_spec(self) -> str:
        hp, percent = self.hparams, "-".join(str(round(100 * f)) for f in FRACTIONS)
        seed = f"-seed{hp.split_seed}" if hp.split == "random" else ""
        return f"{hp.split}-{percent}{seed}"

    def make_splits(self) -> dict:
        n = len(self.dataset)
        cut_train, cut_val = FRACTIONS[0] * n, (FRACTIONS[0] + FRACTIONS[1]) * n
        if self.hparams.split == "random":
            g = torch.Generator().manual_seed(self.hparams.split_seed)
            order = torch.randperm(n, generator=g).tolist()
            parts = [order[: int(cut_train)], order[int(cut_train) : int(cut_val)]]
            parts.append(order[int(cut_val) :])
        else:  # whole scaffold groups, largest first, into the first split they still fit in
            parts = [[], [], []]
            for group in scaffold_groups([self.dataset.get(i).smiles for i in range(n)]):
                if len(parts[0]) + len(group) <= cut_train:
                    parts[0] += group
                elif len(parts[0]) + len(parts[1]) + len(group) <= cut_val:
                    parts[1] += group
                else:
                    parts[2] += group
        return {split: sorted(part) for split, part in zip(SPLITS, parts, strict=True)}


def _check_csv(csv: Path) -> None:
    """What PyG's reader would take without a word: a csv that is not UTF-8, one without a line
    after its header (as PyG reads it: non-empty lines), or one cut off mid-line (PyG drops
    whatever follows the last newline)."""
    try:
        text = csv.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise PipelineError(f"{csv} is not UTF-8 text") from None
    if not any(line.strip() for line in text.splitlines()[1:]):
        raise PipelineError(f"{csv} holds no molecules (an empty csv)")
    if not ends_with_newline(csv):
        raise PipelineError(f"{csv} does not end with a newline: cut off?")
