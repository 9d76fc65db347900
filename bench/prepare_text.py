"""Preparing text corpora of growing size: our streaming preparation beside a nanoGPT-style peer
and the tokenizer's bare encoding, on the same files in the same run.

    python bench/prepare_text.py [--sizes 100 400] [--big-gb 0] [--out DIR] [--json FILE]

Corpora: folders of plain text built from the Python standard library's sources (the files of
the default corpus, copied k times over until the folder holds about SIZE MB), the same way as
the issue that asked for this measured them. For each corpus:
  (a) ours: `python -m src.prepare data=text data.path=<folder> data.tokenizer=bpe`, with
      data.num_proc=1 and 2 (BPE of 4096 trained on data.tokenizer_sample=100 MB of it, so that
      the sizes differ only in what is encoded); the tokenizer's training is timed apart (its log);
  (b) the peer, nanoGPT's `data/openwebtext/prepare.py` recipe with our tokenizer: datasets'
      `load_dataset("text", sample_by="document")`, `map` of `encode_batch` with num_proc, the ids
      written to a uint16 memmap in 1,024 slices;
  (c) the tokenizer's bare `encode_batch` over the same files, in 1 and in 2 processes: the
      rate preparation can approach.
Each runs in its own process; peak memory is the largest sum of the proportional set sizes
(PSS) of that process and its children, sampled every 0.1 s. MB/s is MB of text over the wall
time of encoding and writing (the tokenizer's training excluded). `--big-gb N` adds a corpus of
N GB (ours, 2 processes). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import psutil

from src.data.corpus import stdlib_files
from src.utils.summary import emit_summary

ROOT = Path(__file__).resolve().parents[1]

PEER = r"""
import sys, time, numpy as np
from datasets import load_dataset, disable_progress_bars
from tokenizers import Tokenizer
folder, tokenizer, num_proc, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
disable_progress_bars()
t0 = time.perf_counter()
tok = Tokenizer.from_file(tokenizer)
eos = tok.token_to_id("<|endoftext|>")
ds = load_dataset("text", data_dir=folder, sample_by="document", split="train",
                  cache_dir=out + "/cache")
def process(batch):
    ids = [e.ids + [eos] for e in tok.encode_batch(batch["text"])]
    return {"ids": ids, "len": [len(x) for x in ids]}
ds = ds.map(process, batched=True, remove_columns=["text"], num_proc=num_proc)
arr = np.memmap(out + "/train.bin", dtype=np.uint16, mode="w+", shape=(sum(ds["len"]),))
idx = 0
for k in range(1024):
    batch = ds.shard(num_shards=1024, index=k, contiguous=True).with_format("numpy")
    ids = np.concatenate(batch["ids"]) if len(batch) else np.zeros(0, np.uint16)
    arr[idx : idx + len(ids)] = ids
    idx += len(ids)
arr.flush()
print("seconds", time.perf_counter() - t0)
"""

BARE = r"""
import os, sys, time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer
folder, tokenizer, num_proc = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = sorted(str(p) for p in Path(folder).rglob("*.py"))
def encode(part):
    tok = Tokenizer.from_file(tokenizer)
    texts = [Path(f).read_text() for f in part]
    return sum(len(e.ids) for e in tok.encode_batch(texts))
t0 = time.perf_counter()
parts = [files[i : i + 200] for i in range(0, len(files), 200)]
with ProcessPoolExecutor(num_proc) as pool:
    tokens = sum(pool.map(encode, parts))
print("seconds", time.perf_counter() - t0, "tokens", tokens)
"""


def build_corpus(folder: Path, megabytes: float) -> int:
    """Copies of the stdlib's files in numbered subfolders until about `megabytes` MB."""
    root, files, total, k = Path(sysconfig.get_paths()["stdlib"]), stdlib_files(), 0, 0
    while total < megabytes * 1e6:
        for f in files:
            dest = folder / f"{k:03d}" / f.relative_to(root)
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dest)
            total += dest.stat().st_size
        k += 1
    return total


def measured(cmd: list[str], env: dict | None = None) -> dict:
    """Run `cmd`, sampling the PSS of its process tree; its wall time, peak memory and output."""
    env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    peak, t0 = [0], time.perf_counter()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            total = 0
            try:
                for p in [root, *root.children(recursive=True)]:
                    total += p.memory_full_info().pss
            except psutil.Error:
                pass
            peak[0] = max(peak[0], total)
            time.sleep(0.1)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    output = proc.communicate()[0]
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{output[-3000:]}")
    return {"wall": time.perf_counter() - t0, "peak_gb": peak[0] / 1e9, "output": output}


def seconds(output: str, pattern: str) -> float:
    return float(re.findall(pattern, output)[-1])


def ours(folder: Path, data_dir: Path, num_proc: int) -> dict:
    r = measured([sys.executable, "-m", "src.prepare", "data=text", f"data.path={folder}",
                  "data.tokenizer=bpe", "data.tokenizer_sample=100", f"data.num_proc={num_proc}",
                  f"paths.data_dir={data_dir}"])  # fmt: skip
    train = seconds(r["output"], r"trained the bpe tokenizer in ([\d.]+) s")
    encode = seconds(r["output"], r"MB encoded and written in ([\d.]+) s")
    meta = json.loads(next(data_dir.glob("processed/*/meta.json")).read_text())
    tokenizer = next(data_dir.glob("processed/*/tokenizer.json"))
    return {"encode_s": encode, "tokenizer_s": train, "peak_gb": r["peak_gb"],
            "tokens": sum(meta["tokens"].values()), "tokenizer": str(tokenizer)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=float, nargs="+", default=[100, 400], help="corpora, MB")
    p.add_argument("--big-gb", type=float, default=0, help="add a corpus of this many GB")
    p.add_argument("--out", type=Path, help="working folder (default: a temporary one)")
    p.add_argument("--json", type=Path, help="also write the JSON result here (DVC's metrics)")
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_prepare_text."))
    rows = []
    sizes = [*args.sizes, *([args.big_gb * 1000] if args.big_gb else [])]
    for mb in sizes:
        folder = out / f"corpus{mb:g}"
        size = build_corpus(folder, mb) / 1e6
        row = {"corpus_mb": round(size, 1), "files": sum(1 for _ in folder.rglob("*.py"))}
        for n in (1, 2) if mb <= max(args.sizes) else (2,):
            shutil.rmtree(out / "data", ignore_errors=True)
            r = ours(folder, out / "data", n)
            row[f"ours{n}"] = {k: v for k, v in r.items() if k != "tokenizer"}
            row[f"ours{n}"]["mb_per_s"] = size / r["encode_s"]
            print(
                f"{size:,.0f} MB, ours, {n} process(es): {size / r['encode_s']:.2f} MB/s, "
                f"peak {r['peak_gb']:.2f} GB, tokenizer {r['tokenizer_s']:.0f} s",
                flush=True,
            )
            tokenizer = str(shutil.copy(r["tokenizer"], out / "tokenizer.json"))
        if mb > max(args.sizes):
            rows.append(row)
            continue
        for n in (1, 2):
            peer_out = out / "peer"
            shutil.rmtree(peer_out, ignore_errors=True)
            peer_out.mkdir()
            r = measured(
                [sys.executable, "-c", PEER, str(folder), tokenizer, str(n), str(peer_out)]
            )
            secs = seconds(r["output"], r"seconds ([\d.]+)")
            row[f"peer{n}"] = {"mb_per_s": size / secs, "peak_gb": r["peak_gb"]}
            r = measured([sys.executable, "-c", BARE, str(folder), tokenizer, str(n)])
            secs = seconds(r["output"], r"seconds ([\d.]+)")
            row[f"bare{n}"] = {"mb_per_s": size / secs, "peak_gb": r["peak_gb"]}
            print(
                f"{size:,.0f} MB, {n} process(es): peer {row[f'peer{n}']['mb_per_s']:.2f} MB/s "
                f"(peak {row[f'peer{n}']['peak_gb']:.2f} GB), bare encode_batch "
                f"{row[f'bare{n}']['mb_per_s']:.2f} MB/s",
                flush=True,
            )
        shutil.rmtree(out / "peer", ignore_errors=True)
        rows.append(row)
    small, large = rows[0], rows[len(args.sizes) - 1]

    def worst(ratio, keys) -> float:
        return min(ratio(r, *k) for r in rows for k in keys if all(x in r for x in k))

    def rate(r: dict, a: str, b: str) -> float:
        return r[a]["mb_per_s"] / r[b]["mb_per_s"]

    checks = {
        "memory_ratio": large["ours2"]["peak_gb"] / small["ours2"]["peak_gb"],
        "max_peak_gb": max(r[k]["peak_gb"] for r in rows for k in ("ours1", "ours2") if k in r),
        "vs_peer": worst(rate, [("ours2", "peer2")]),
        "vs_bare": worst(rate, [("ours1", "bare1"), ("ours2", "bare2")]),
        "scaling": worst(rate, [("ours2", "ours1")]),
    }
    targets = {"memory_ratio": ("<=", 1.2), "max_peak_gb": ("<=", 1.5), "vs_peer": (">=", 1.0),
               "vs_bare": (">=", 0.8), "scaling": (">=", 1.6)}  # fmt: skip
    for key, (op, target) in targets.items():
        value = checks[key]
        met = value <= target if op == "<=" else value >= target
        print(f"{key}: {value:.2f} against the target {op} {target}: {'met' if met else 'NOT met'}")
    emit_summary({"corpora": rows, "checks": checks}, args.json)
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
