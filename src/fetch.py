"""Fetch raw datasets into data/raw/<dataset>/ (the DVC stage `fetch`), from the mirror
($DATA_MIRROR) or the dataset's public source, checked against pinned checksums.

python -m src.fetch tinyshakespeare planetoid/Cora
python -m src.fetch --list
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from src.data import sources
from src.utils.errors import PipelineError


def main(argv: list[str] | None = None) -> None:
    root = os.environ.get("PROJECT_ROOT", ".")  # as paths.root_dir in conf/paths/default.yaml
    p = argparse.ArgumentParser(prog="python -m src.fetch", description=__doc__.split("\n\n")[0])
    names = "registered names (see --list), planetoid/<name> or TUDataset/<name>"
    p.add_argument("datasets", nargs="*", metavar="NAME", help=names)
    p.add_argument("--raw-dir", default=f"{root}/data/raw", help="paths.raw_dir: where they live")
    mirror = f"a folder with data/raw's layout to copy from (${sources.MIRROR_ENV})"
    p.add_argument("--mirror", default=os.environ.get(sources.MIRROR_ENV) or None, help=mirror)
    p.add_argument("--list", action="store_true", help="list the registered datasets")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stdout)

    if args.list or not args.datasets:
        for ds in sources.DATASETS.values():
            print(f"{ds.name:16} data/raw/{ds.folder + '/':24} {ds.about}")
        return
    try:
        for name in args.datasets:
            print(sources.fetch(name, args.raw_dir, args.mirror))
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
