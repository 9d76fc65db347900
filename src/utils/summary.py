"""The end of every benchmark in bench/: its summary printed as the last line, in JSON, and
written to --json's file (the metrics a DVC stage declares) when one is given."""

from __future__ import annotations

import json
from pathlib import Path


def emit_summary(summary: dict, path: Path | None) -> None:
    print(json.dumps(summary))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1) + "\n")
