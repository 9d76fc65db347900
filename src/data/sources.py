"""Raw datasets: where each comes from, and one home for it, `data/raw/<dataset>/` (paths.raw_dir).

`fetch` fills a dataset's folder on first use, in this order:
  1. already there (put there by hand, or by an earlier run): used as it is;
  2. copied from the local mirror, `paths.data_mirror` (environment variable DATA_MIRROR), a
     folder with data/raw's own layout (a lab's shared copy, another clone's data/raw);
  3. downloaded from the dataset's public source into a temporary folder, checked against the
     pinned size and SHA-256, archives extracted (no absolute paths, `..` or links), then moved
     into place file by file, so that a failed or interrupted fetch never leaves a file that
     looks complete.
Offline with nothing there, it stops with one line: the dataset, the files missing, where to put
them, and the URL they come from. Data modules ask `fetch` for a folder and never build URLs.

Datasets PyG knows by name but this registry does not pin (CiteSeer, PROTEINS, FreeSolv, ...)
come from PyG's own sources, which publish no checksums: they are fetched the same way, unchecked.

    python -m src.fetch tinyshakespeare planetoid/Cora     # the DVC stage `fetch`
    python -m src.fetch --list
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from glob import has_magic
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from src.utils.errors import PipelineError

log = logging.getLogger(__name__)

MIRROR_ENV = "DATA_MIRROR"


@dataclass(frozen=True)
class Download:
    """One file from `url`, saved as `target` in the dataset's folder; an archive is extracted
    into the folder instead, its members' leading folder `strip` dropped."""

    url: str
    target: str = ""
    sha256: str | None = None  # None: a PyG source, which publishes no checksum
    size: int | None = None
    archive: bool = False
    strip: str = ""


@dataclass(frozen=True)
class RawDataset:
    """A dataset's files under `folder` (relative to data/raw and to the mirror). `files` must be
    there for it to count as present; a glob such as "recordings/*.wav" must match one file."""

    name: str
    folder: str
    files: tuple[str, ...]
    downloads: tuple[Download, ...]
    about: str = ""  # source, licence and size, for `python -m src.fetch --list`

    def missing(self, folder: Path) -> list[str]:
        def there(f: str) -> bool:
            return any(folder.glob(f)) if has_magic(f) else (folder / f).is_file()

        return [f for f in self.files if not there(f)]

    @property
    def source(self) -> str:
        """Where the files come from, for messages: the URL (or its folder, for many files)."""
        urls = [d.url for d in self.downloads]
        if len(urls) <= 1:
            return urls[0] if urls else "nowhere known"
        return urls[0].rsplit("/", 1)[0] + "/"  # one folder's files


def _github(repo: str, commit: str, path: str) -> str:
    return f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"


def _pinned(repo: str, commit: str, folder: str, files: dict[str, tuple[int, str]]):
    """Downloads of files of one folder of a GitHub repository at a fixed commit."""
    return tuple(
        Download(_github(repo, commit, f"{folder}/{name}"), name, sha256, size)
        for name, (size, sha256) in files.items()
    )


# --------------------------------------------------------------------------- the registry

PLANETOID_SUFFIXES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
PLANETOID_URL = "https://github.com/kimiyoung/planetoid/raw/master/data"  # PyG's source
TU_URL = "https://www.chrsmrrs.com/graphkerneldatasets"  # PyG's source
MOLECULENET_URL = "https://deepchemdata.s3-us-west-1.amazonaws.com/datasets"  # PyG's source
MOLECULENET_CSV = {  # PyG's key -> the csv it reads (and downloads under the same name)
    "esol": "delaney-processed.csv",
    "freesolv": "SAMPL.csv",
    "lipo": "Lipophilicity.csv",
    "bace": "bace.csv",
    "bbbp": "BBBP.csv",
    "hiv": "HIV.csv",
}
MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist"  # torchvision's copy of LeCun's files
FSDD_REPO = ("Jakobovski/free-spoken-digit-dataset", "26eb9aaf76e81b692f806f9140c2d2777410d7a1")
CHECKSUMS = Path(__file__).with_name("checksums")

_CORA = {  # ind.cora.<suffix>: (bytes, sha256)
    "x": (22119, "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab"),
    "tx": (148025, "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a"),
    "allx": (257305, "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543"),
    "y": (4054, "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1"),
    "ty": (28135, "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad"),
    "ally": (47959, "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71"),
    "graph": (59847, "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d"),
    "test.index": (5000, "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875"),
}
_MUTAG = {
    "MUTAG_A.txt": (76940, "d9656ca7493f3445d737c711710bb36fd432dddd1c0ea32e1d4713c86ebd28e2"),
    "MUTAG_edge_labels.txt": (
        14884, "4669ce755075ff86c3240709345745886400908fa637a49310459b9c267b3e56"
    ),
    "MUTAG_graph_indicator.txt": (
        11532, "7d520a4d6c7961c0cdeabe076d8fe27e795b6d373485c9a2b744987e560a2056"
    ),
    "MUTAG_graph_labels.txt": (
        439, "a1518ea39ba3426bd42f57396b9c4baffe68e9adc718caeeab0119c6591a5f2c"
    ),
    "MUTAG_node_labels.txt": (
        6742, "678f429965490e84dd27713017538c995fc05d1621beac910848b600015ee863"
    ),
}  # fmt: skip
_MNIST = {
    "train-images-idx3-ubyte.gz": (
        9912422, "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"
    ),
    "train-labels-idx1-ubyte.gz": (
        28881, "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"
    ),
    "t10k-images-idx3-ubyte.gz": (
        1648877, "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"
    ),
    "t10k-labels-idx1-ubyte.gz": (
        4542, "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"
    ),
}  # fmt: skip
_SHAKESPEARE = {
    "input.txt": (1115394, "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
}
_ESOL = {
    "delaney-processed.csv": (
        96699, "8c06a76f0c6487d29ab0f903e6a7a7139f189ab3c1178f159c8be8964602f189"
    ),
}  # fmt: skip
_ENG_NLD = Download(  # the whole export; the mirror may hold a part of it
    _github("devcem/NMT-seq2seq-with-pytorch", "c7feb6b987c40f4d8c17f98e3ccda271dba82553",
            "data/eng-nld.txt"),
    "eng-nld.tsv", "cfefbe4772f56b2916ab47a7ae4e9f080418d92b4b99d0c994e9bada7b4360e3", 1809959,
)  # fmt: skip
_CIFAR10 = Download(
    "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    sha256="6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
    size=170498071,
    archive=True,
)
CIFAR10_BATCHES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta")


def _fsdd() -> tuple[Download, ...]:
    """The 2,500 pinned FSDD recordings (5 speakers), one download each, from checksums/."""
    rows = (CHECKSUMS / "fsdd.tsv").read_text().splitlines()[1:]  # path, bytes, sha256
    return tuple(
        Download(_github(*FSDD_REPO, path), path, sha256, int(size))
        for path, size, sha256 in (row.split("\t") for row in rows)
    )


DATASETS: dict[str, RawDataset] = {
    ds.name: ds
    for ds in (
        RawDataset(
            "tinyshakespeare", "tinyshakespeare", ("input.txt",),
            _pinned("karpathy/char-rnn", "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e",
                    "data/tinyshakespeare", _SHAKESPEARE),
            "Tiny Shakespeare (Karpathy's char-rnn, MIT; the plays are public domain), 1.1 MB",
        ),
        RawDataset(
            "planetoid/Cora", "planetoid/Cora/raw",
            tuple(f"ind.cora.{s}" for s in PLANETOID_SUFFIXES),
            _pinned("kimiyoung/planetoid", "af6abf468a772cc055bec88c52e4d6f51b7c37e3", "data",
                    {f"ind.cora.{s}": v for s, v in _CORA.items()}),
            "Planetoid Cora (Yang et al. 2016; Sen et al. 2008; repository MIT), 0.6 MB",
        ),
        RawDataset(
            "TUDataset/MUTAG", "TUDataset/MUTAG/raw", tuple(_MUTAG),
            _pinned("pyg-team/pytorch_geometric", "0a4b67297579d3c620a75776344bd98310ca6ce9",
                    "torch_geometric/contrib/degree_quant/redditbinary/MUTAG/raw", _MUTAG),
            "TUDataset MUTAG (Morris et al. 2020; Debnath et al. 1991), 0.1 MB",
        ),
        RawDataset(
            "esol", "esol", tuple(_ESOL),
            _pinned("deepchem/deepchem", "fbe3b911a94a6eb8c84c1a9e7ac67a472c49ea80", "datasets",
                    _ESOL),
            "ESOL solubility (Delaney 2004; MoleculeNet, deepchem MIT), 0.1 MB",
        ),
        RawDataset(
            "eng-nld", "translation", ("eng-nld.tsv",), (_ENG_NLD,),
            "English-Dutch sentence pairs (Tatoeba via manythings.org, CC BY 2.0 FR), 1.8 MB",
        ),
        RawDataset(
            "mnist", "mnist/raw", ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
            tuple(Download(f"{MNIST_URL}/{name}", name, sha256, size)
                  for name, (size, sha256) in _MNIST.items()),
            "MNIST (LeCun et al. 1998; commonly listed as CC BY-SA 3.0), 11 MB",
        ),
        RawDataset(
            "cifar10", "cifar10", tuple(f"cifar-10-batches-py/{b}" for b in CIFAR10_BATCHES),
            (_CIFAR10,), "CIFAR-10, python batches (Krizhevsky 2009), 170 MB",
        ),
        RawDataset(
            # one member, `text8` (10^8 bytes, CRC-32 checked by zipfile as it is extracted; no
            # SHA-256 is published); a copy of its beginning (a data mirror's text8_head.txt.gz)
            # counts too: data.max_chars makes the two the same corpus
            "text8", "text8", ("text8*",),
            (Download("http://mattmahoney.net/dc/text8.zip", size=31344016, archive=True),),
            "text8 (Mahoney 2011: the first 10^8 bytes of English Wikipedia, lowercase letters "
            "and spaces; CC BY-SA), 31 MB zipped",
        ),
        RawDataset(
            "fsdd", "fsdd", ("recordings/*.wav",), _fsdd(),
            "Free Spoken Digit Dataset (Jackson et al., CC BY-SA 4.0): 2,500 pinned recordings "
            "of 5 speakers, 17 MB",
        ),
    )
}  # fmt: skip


def planetoid(name: str) -> RawDataset:
    """Cora (pinned) or another Planetoid graph from PyG's source."""
    key = f"planetoid/{name}"
    if key in DATASETS:
        return DATASETS[key]
    files = tuple(f"ind.{name.lower()}.{s}" for s in PLANETOID_SUFFIXES)
    downloads = tuple(Download(f"{PLANETOID_URL}/{f}", f) for f in files)
    return RawDataset(key, f"{key}/raw", files, downloads, f"Planetoid {name} (PyG's source)")


def tudataset(name: str) -> RawDataset:
    """MUTAG (pinned) or any other dataset of the TUDataset collection from PyG's source."""
    key = f"TUDataset/{name}"
    if key in DATASETS:
        return DATASETS[key]
    files = tuple(f"{name}_{part}.txt" for part in ("A", "graph_indicator"))
    zipped = Download(f"{TU_URL}/{name}.zip", archive=True, strip=f"{name}/")
    return RawDataset(key, f"{key}/raw", files, (zipped,), f"TUDataset {name} (PyG's source)")


def moleculenet(key: str) -> RawDataset:
    """ESOL (pinned) or another single-target MoleculeNet csv from PyG's source."""
    if key in DATASETS:
        return DATASETS[key]
    if key not in MOLECULENET_CSV:
        raise PipelineError(f"no source known for MoleculeNet {key!r}")
    csv = MOLECULENET_CSV[key]
    download = Download(f"{MOLECULENET_URL}/{csv}", csv)
    return RawDataset(key, key, (csv,), (download,), f"MoleculeNet {key} (PyG's source)")


def lookup(name: str) -> RawDataset:
    """A dataset by its name in `python -m src.fetch NAME`."""
    family, _, rest = name.partition("/")
    if name in DATASETS:
        ds = DATASETS[name]
    elif rest and family in ("planetoid", "TUDataset"):
        ds = planetoid(rest) if family == "planetoid" else tudataset(rest)
    elif name in MOLECULENET_CSV:
        ds = moleculenet(name)
    else:
        raise PipelineError(
            f"unknown dataset {name!r}; known: {', '.join(DATASETS)}, planetoid/<name>, "
            f"TUDataset/<name>, {', '.join(k for k in MOLECULENET_CSV if k not in DATASETS)}"
        )
    return ds


# --------------------------------------------------------------------------- fetching


def fetch(
    dataset: str | RawDataset,
    raw_dir: str | Path,
    mirror: str | Path | None = None,
    download: bool = True,
) -> Path:
    """The folder `raw_dir/<dataset's folder>` with the dataset's files in it (see the module's
    docstring for the order tried). Files already there are never replaced."""
    ds = lookup(dataset) if isinstance(dataset, str) else dataset
    dest = Path(raw_dir).expanduser() / ds.folder
    missing = ds.missing(dest)
    if not missing:
        return dest
    tried = []
    if mirror:
        src = Path(mirror).expanduser() / ds.folder
        lacking = ds.missing(src)
        if not lacking:
            log.info("copying %s from the mirror %s -> %s", ds.name, src, dest)
            _install(dest, functools.partial(_copy_tree, src))
            return dest
        tried.append(f"the mirror {src} lacks {len(lacking)} of them")
    if download and ds.downloads:
        mb = sum(d.size or 0 for d in ds.downloads) / 1e6  # 0: sizes not pinned
        log.info("downloading %s (%d file(s)%s) from %s -> %s", ds.name, len(ds.downloads),
                 f", {mb:.1f} MB" if mb else "", ds.source, dest)  # fmt: skip
        try:
            _install(dest, functools.partial(_download_all, ds.downloads))
        except DownloadError as e:
            tried.append(str(e))
        missing = ds.missing(dest)
        if not missing:
            return dest
        if not tried:
            tried.append(f"the download from {ds.source} lacks {', '.join(missing)}")
    elif not download:
        tried.append("downloads are off (data.download=false)")
    shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
    why = f" ({'; '.join(tried)})" if tried else ""
    raise PipelineError(
        f"dataset {ds.name}: {shown} not found in {dest}; put the files there (from "
        f"{ds.source}), or set {MIRROR_ENV} to a folder holding {ds.folder}/{why}"
    )


class DownloadError(Exception):
    """A download that failed, or whose bytes are not the pinned ones."""


def plain_name(name, key: str = "data.name") -> str:
    """`name`, which names a folder under data/ (a processed dataset, a raw dataset's home),
    checked to be one path component: no name such as `../../x` writes outside data/."""
    text = str(name)
    if text in ("", ".", "..") or any(c in text for c in "/\\\0"):
        raise PipelineError(f"{key}={text!r} must name one folder: no /, \\ or ..")
    return text


def data_root(
    root: str | None, dataset: str, raw_dir: str | Path, mirror: str | Path | None
) -> Path:
    """A data module's files: the folder `root` names (data.root), or without it the registered
    dataset, fetched once."""
    if root is None:
        return fetch(dataset, raw_dir, mirror)
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise PipelineError(f"data.root={root}: no such folder")
    return folder


def _install(dest: Path, fill: Callable[[Path], None]) -> None:
    """Let `fill` write into a temporary folder beside `dest`, then move each of its files into
    `dest` unless a file of that name is already there. Nothing is left behind on failure."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        fill(tmp)
        for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
            target = dest / f.relative_to(tmp)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _copy_tree(src: Path, dst: Path) -> None:
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)  # not the mode: a read-only mirror gives writable copies


def _download_all(downloads: tuple[Download, ...], dst: Path) -> None:
    for d in downloads:
        part = dst / ".download.part"
        _download(d, part)
        if d.archive:
            extract(part, dst, d.strip)
            part.unlink()
        else:
            target = dst / d.target
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(part, target)


def _download(d: Download, path: Path) -> None:
    """`d.url` into `path`, streamed and hashed; its size and SHA-256 must be the pinned ones."""
    import urllib.request  # here, not at import: every run imports this module, few download

    digest, size, announced = hashlib.sha256(), 0, None
    request = urllib.request.Request(d.url, headers={"User-Agent": "bishop-pipeline"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r, open(path, "wb") as f:
            announced = r.headers.get("Content-Length")  # None for file:// and chunked replies
            while chunk := r.read(1 << 20):
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
    except Exception as e:  # URLError, a refused connection, a reset
        raise DownloadError(f"could not download {d.url}: {_first_line(e)}") from e
    expected = d.size if d.size is not None else announced and int(announced)
    if expected is not None and size != expected:  # http.client does not raise on a short body
        raise DownloadError(f"{d.url} sent {size} bytes, expected {expected} (a cut-off download)")
    if d.sha256 is not None and digest.hexdigest() != d.sha256:
        raise DownloadError(f"{d.url} has sha256 {digest.hexdigest()}, expected {d.sha256}")


def _first_line(e: BaseException) -> str:
    text = str(getattr(e, "reason", "") or e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# --------------------------------------------------------------------------- archives


def extract(archive: Path, dst: Path, strip: str = "") -> None:
    """Extract a .zip or .tar(.gz) into `dst`, dropping the leading folder `strip` of each member
    (members outside it are skipped). Absolute paths, `..`, links and device files are refused:
    an archive never writes outside `dst`."""
    import zipfile

    members = _zip_members(archive) if zipfile.is_zipfile(archive) else _tar_members(archive)
    root = dst.resolve()
    for name, kind, open_member in members:
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or name.startswith(("\\", "/")):
            raise DownloadError(f"{archive.name}: member {name!r} points outside the folder")
        if kind == "link":
            raise DownloadError(f"{archive.name}: member {name!r} is a link")
        if kind == "other":
            raise DownloadError(f"{archive.name}: member {name!r} is not a file")
        if kind == "dir" or not name.startswith(strip):
            continue
        target = (dst / name[len(strip) :]).resolve()
        if root not in target.parents:
            raise DownloadError(f"{archive.name}: member {name!r} points outside the folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        with open_member() as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out)


Member = tuple[str, str, Callable[[], BinaryIO]]  # name, kind (file/dir/link/other), opener


def _zip_members(archive: Path) -> Iterator[Member]:
    import zipfile

    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            mode = info.external_attr >> 16
            is_link = (mode & 0o170000) == 0o120000
            kind = "link" if is_link else "dir" if info.is_dir() else "file"
            yield info.filename, kind, functools.partial(z.open, info)


def _tar_members(archive: Path) -> Iterator[Member]:
    import tarfile

    if not tarfile.is_tarfile(archive):
        raise DownloadError(f"{archive.name} is neither a zip nor a tar archive")
    with tarfile.open(archive) as tar:
        for m in tar:
            kind = ("link" if m.issym() or m.islnk() else "dir" if m.isdir()
                    else "file" if m.isfile() else "other")  # fmt: skip
            yield m.name, kind, functools.partial(tar.extractfile, m)
