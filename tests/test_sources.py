"""Raw datasets (src/data/sources.py): the registry's pins, fetching from the mirror, downloads
from a local HTTP server and file:// URLs (checksums, cut-off transfers, archives), and the one-line
error offline. No test uses the network: downloads go to 127.0.0.1 or to files, and "offline"
is a refused connection to a local port."""

from __future__ import annotations

import hashlib
import http.server
import io
import re
import tarfile
import threading
import urllib.error
import zipfile
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from src.data.sources import DATASETS, Download, RawDataset, fetch, lookup
from src.utils.errors import PipelineError
from tests.conftest import MIRROR, ON_SAMPLES, assert_ok, assert_one_error_line, run_module

# the registered datasets whose mirror copy is the pinned upstream file, byte for byte
IDENTICAL = ["tinyshakespeare", "planetoid/Cora", "TUDataset/MUTAG", "esol", "mnist", "fsdd"]
# every dataset a data module can ask for: the registry and PyG-sourced examples of each family
EVERY = [*DATASETS, "planetoid/CiteSeer", "TUDataset/PROTEINS", "freesolv"]
# environment of a run whose every download is refused at once, without leaving the machine
OFFLINE = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "no_proxy": "", "DATA_MIRROR": None}  # fmt: skip


def in_mirror(name: str) -> RawDataset:
    ds = lookup(name)
    if ds.missing(MIRROR / ds.folder):
        pytest.skip(f"{name} missing in the mirror {MIRROR}")
    return ds


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def unreachable(monkeypatch):
    """Every urlopen fails as a machine without network does; the calls are counted."""
    calls = []

    def refuse(request, *args, **kwargs):
        calls.append(getattr(request, "full_url", request))
        raise urllib.error.URLError("[Errno 101] Network is unreachable")

    monkeypatch.setattr("urllib.request.urlopen", refuse)
    return calls


class TruncatingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files; under /cut/ it promises the whole file but sends half and hangs up."""

    def do_GET(self):
        if not self.path.startswith("/cut/"):
            return super().do_GET()
        data = Path(self.translate_path(self.path[4:])).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    """A local HTTP server over the mirror, on a free port of 127.0.0.1."""
    handler = partial(TruncatingHandler, directory=str(MIRROR))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def served(ds: RawDataset, base: str, **change) -> RawDataset:
    """`ds` with its downloads pointed at the local server's copy of each file."""
    downloads = tuple(
        replace(d, url=f"{base}/{ds.folder}/{d.target}", **change) for d in ds.downloads
    )
    return replace(ds, downloads=downloads)


# --------------------------------------------------------------------------- the registry


# text8's only source publishes its size and its member's CRC-32 (checked as it is extracted),
# over http, and no SHA-256
SIZE_ONLY = {"text8"}


def test_every_registered_download_is_pinned():
    folders = [ds.folder for ds in DATASETS.values()]
    assert len(set(folders)) == len(folders)
    for ds in DATASETS.values():
        assert ds.files and ds.downloads and ds.about, ds.name
        for d in ds.downloads:
            if ds.name in SIZE_ONLY:
                assert d.size and d.archive and d.sha256 is None
                continue
            assert d.url.startswith("https://"), d.url
            assert re.fullmatch(r"[0-9a-f]{64}", d.sha256 or ""), (ds.name, d.url)
            assert d.size and d.size > 0
            assert d.archive or d.target, d.url


@pytest.mark.parametrize("name", IDENTICAL)
def test_pins_match_the_mirror_copies(name):
    """The mirror's files are the upstream ones: their sizes and SHA-256 are the pinned ones."""
    ds = in_mirror(name)
    if ON_SAMPLES and name == "mnist":
        pytest.skip("the repository's MNIST is a 500-image cut, not the upstream file")
    checked = 0
    for d in ds.downloads:
        f = MIRROR / ds.folder / d.target
        if f.is_file():
            assert (f.stat().st_size, sha256(f)) == (d.size, d.sha256), f
            checked += 1
    assert checked >= len(ds.files)


def test_lookup_names_every_family():
    assert lookup("planetoid/CiteSeer").folder == "planetoid/CiteSeer/raw"
    assert lookup("TUDataset/PROTEINS").files == ("PROTEINS_A.txt", "PROTEINS_graph_indicator.txt")
    assert lookup("freesolv").files == ("SAMPL.csv",)
    assert lookup("planetoid/Cora") is DATASETS["planetoid/Cora"]
    with pytest.raises(PipelineError, match="unknown dataset 'nope'"):
        lookup("nope")


# --------------------------------------------------------------------------- the mirror


@pytest.mark.parametrize("name", [*IDENTICAL, "eng-nld", "text8"])
def test_fetch_copies_from_the_mirror_once(tmp_path, name, unreachable):
    ds = in_mirror(name)
    dest = fetch(name, tmp_path / "raw", MIRROR)
    assert dest == tmp_path / "raw" / ds.folder and not ds.missing(dest)
    mirrored = files_under(MIRROR / ds.folder)
    assert [p.relative_to(dest) for p in files_under(dest)] == [
        p.relative_to(MIRROR / ds.folder) for p in mirrored
    ]
    assert not [p for p in (tmp_path / "raw").rglob(".*")]  # no temporary folder left
    # already there: used as it is, with neither mirror nor network
    assert fetch(name, tmp_path / "raw", None, download=False) == dest
    assert unreachable == []


def test_files_already_there_are_never_replaced(tmp_path):
    in_mirror("tinyshakespeare")
    mine = tmp_path / "raw" / "tinyshakespeare" / "input.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("my own corpus")
    fetch("tinyshakespeare", tmp_path / "raw", MIRROR)
    assert mine.read_text() == "my own corpus"


def test_a_mirror_missing_files_falls_back_to_the_download(tmp_path, unreachable):
    """A mirror folder with only some of Cora's files is not used; the error says so."""
    ds = in_mirror("planetoid/Cora")
    partial_mirror = tmp_path / "mirror" / ds.folder
    partial_mirror.mkdir(parents=True)
    (partial_mirror / ds.files[0]).write_bytes((MIRROR / ds.folder / ds.files[0]).read_bytes())
    with pytest.raises(PipelineError, match=r"the mirror .* lacks 7 of them"):
        fetch(ds, tmp_path / "raw", tmp_path / "mirror")
    assert files_under(tmp_path / "raw") == []
    assert len(unreachable) == 1  # the first download failed, the others were not tried


# --------------------------------------------------------------------------- offline


@pytest.mark.parametrize("name", EVERY)
def test_offline_without_the_files_is_one_clear_line(tmp_path, name, unreachable):
    """The dataset, its missing files, where to put them, the URL they come from, the mirror
    setting; and nothing written."""
    ds = lookup(name)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PipelineError) as e:
        fetch(name, tmp_path / "raw", tmp_path / "empty")
    msg = str(e.value)
    assert "\n" not in msg
    for part in (f"dataset {ds.name}:", ds.files[0], str(tmp_path / "raw" / ds.folder),
                 ds.source, "DATA_MIRROR", "Network is unreachable"):  # fmt: skip
        assert part in msg, (part, msg)
    assert files_under(tmp_path / "raw") == []


def test_downloads_off_is_said(tmp_path, unreachable):
    with pytest.raises(PipelineError, match=r"downloads are off \(data\.download=false\)"):
        fetch("esol", tmp_path / "raw", None, download=False)
    assert unreachable == []


def test_cli_fetches_lists_and_fails_offline_in_one_line(tmp_path):
    in_mirror("tinyshakespeare")
    listing = run_module("src.fetch", "--list")
    assert_ok(listing)
    assert all(name in listing.stdout for name in DATASETS)

    raw = tmp_path / "raw"
    proc = run_module("src.fetch", "tinyshakespeare", "--raw-dir", str(raw))  # DATA_MIRROR set
    assert_ok(proc)
    assert (raw / "tinyshakespeare" / "input.txt").is_file()

    assert_one_error_line(run_module("src.fetch", "nope"), "unknown dataset 'nope'")
    offline = run_module("src.fetch", "esol", "--raw-dir", str(raw), env=OFFLINE)
    assert_one_error_line(offline, "dataset esol: delaney-processed.csv not found", "DATA_MIRROR")
    assert not (raw / "esol").exists()


def test_a_run_offline_without_its_data_stops_with_one_line(tmp_path):
    proc = run_module("src.train", "data=shakespeare", f"paths.data_dir={tmp_path}/data",
                      f"hydra.run.dir={tmp_path}/run", "logger=none", env=OFFLINE)  # fmt: skip
    assert_one_error_line(proc, "dataset tinyshakespeare: input.txt not found in", "DATA_MIRROR",
                          "https://raw.githubusercontent.com/karpathy/char-rnn/")  # fmt: skip


# --------------------------------------------------------------------------- downloads


@pytest.mark.parametrize("name", ["tinyshakespeare", "planetoid/Cora", "fsdd"])
def test_download_from_a_local_server(tmp_path, server, name):
    ds = in_mirror(name)  # the files the mirror has (tests/data: 300 of FSDD's 2,500)
    there = tuple(d for d in ds.downloads if (MIRROR / ds.folder / d.target).is_file())
    ds = served(replace(ds, downloads=there), server)
    dest = fetch(ds, tmp_path / "raw")
    assert not ds.missing(dest)
    for d in ds.downloads:
        assert sha256(dest / d.target) == d.sha256
    assert not [p for p in (tmp_path / "raw").rglob(".*")]


def test_checksum_mismatch_leaves_nothing(tmp_path, server):
    ds = in_mirror("planetoid/Cora")
    bad = served(ds, server)
    bad = replace(bad, downloads=(*bad.downloads[:-1], replace(bad.downloads[-1], sha256="0" * 64)))
    with pytest.raises(PipelineError, match=r"has sha256 [0-9a-f]{64}, expected 0{64}"):
        fetch(bad, tmp_path / "raw")
    assert files_under(tmp_path / "raw") == []  # not even the seven files that were right


@pytest.mark.parametrize("pinned_size", [True, False], ids=["pinned size", "no size"])
def test_cut_off_download_leaves_nothing(tmp_path, server, pinned_size):
    ds = in_mirror("tinyshakespeare")
    d = ds.downloads[0]
    cut = replace(d, url=f"{server}/cut/{ds.folder}/{d.target}", sha256=None,
                  size=d.size if pinned_size else None)  # fmt: skip
    with pytest.raises(PipelineError, match=r"could not download|cut-off"):
        fetch(replace(ds, downloads=(cut,)), tmp_path / "raw")
    assert files_under(tmp_path / "raw") == []


def _archive(path: Path, members: dict[str, bytes], kind: str, link: str | None = None) -> str:
    if kind == "zip":
        with zipfile.ZipFile(path, "w") as z:
            for name, data in members.items():
                z.writestr(name, data)
    else:
        with tarfile.open(path, "w:gz") as t:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            if link:
                info = tarfile.TarInfo("pkg/link")
                info.type, info.linkname = tarfile.SYMTYPE, link
                t.addfile(info)
    return path.as_uri()


def test_text8_is_its_zip_archives_one_member(tmp_path):
    url = _archive(tmp_path / "text8.zip", {"text8": b" anarchism originated as a term"}, "zip")
    text8 = DATASETS["text8"]
    size = (tmp_path / "text8.zip").stat().st_size
    dest = fetch(replace(text8, downloads=(replace(text8.downloads[0], url=url, size=size),)),
                 tmp_path / "raw")  # fmt: skip
    assert [p.name for p in files_under(dest)] == ["text8"]


def _archived(url: str, files=("a.txt", "sub/b.txt")) -> RawDataset:
    return RawDataset("toy", "toy", files, (Download(url, archive=True, strip="pkg/"),))


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_archive_is_extracted_without_its_leading_folder(tmp_path, kind):
    members = {"pkg/a.txt": b"a", "pkg/sub/b.txt": b"b", "other/skipped.txt": b"-"}
    url = _archive(tmp_path / f"toy.{kind}", members, kind)
    dest = fetch(_archived(url), tmp_path / "raw")
    assert [p.relative_to(dest).as_posix() for p in files_under(dest)] == ["a.txt", "sub/b.txt"]
    assert (dest / "sub" / "b.txt").read_bytes() == b"b"


@pytest.mark.parametrize(
    ("kind", "member", "link"),
    [("tar", "pkg/../../evil.txt", None), ("zip", "pkg/../../evil.txt", None),
     ("tar", "/tmp/evil-abs.txt", None), ("tar", "pkg/a.txt", "../../evil.txt")],
    ids=["tar ..", "zip ..", "tar absolute", "tar symlink"],
)  # fmt: skip
def test_unsafe_archive_is_refused_and_writes_nothing(tmp_path, kind, member, link):
    url = _archive(tmp_path / f"evil.{kind}", {member: b"x"}, kind, link)
    with pytest.raises(PipelineError, match=r"points outside the folder|is a link"):
        fetch(_archived(url, ("a.txt",)), tmp_path / "raw")
    assert files_under(tmp_path / "raw") == []
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/evil-abs.txt").exists()
