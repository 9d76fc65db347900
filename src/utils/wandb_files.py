"""Read back an offline wandb run (``<run dir>/wandb/offline-run-*/run-*.wandb``) without a server.

wandb 0.31 ships a reader for its transaction log in its own CLI:

    wandb leet inspect --json PATH             # one JSON object per record
    wandb leet inspect --summary --json PATH   # name, tags, config, summary, state, exit code

This module runs both (as ``python -m wandb``, so the wandb of this interpreter is used) and
gathers what a check needs into an :class:`OfflineRun`. The summary object has no run group; it
comes from the ``run`` record of the log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class OfflineRun:
    path: Path  # the offline-run-* folder
    run_id: str
    name: str
    project: str
    group: str
    tags: list[str]
    config: dict[str, Any]
    summary: dict[str, Any]  # the final value of every logged key
    history: list[dict[str, Any]] = field(default_factory=list)  # one dict per logged step
    state: str = ""
    exit_code: int | None = None

    def logged(self, key: str) -> list[Any]:
        """Every value logged under `key`, in the order of the history steps."""
        return [row[key] for row in self.history if key in row]


def offline_runs(wandb_parent: Path) -> list[Path]:
    """The offline-run-* folders under `<wandb_parent>/wandb`, oldest first."""
    return sorted((Path(wandb_parent) / "wandb").glob("offline-run-*"))


def leet_inspect(path: Path, *, summary: bool = False, env: dict[str, str] | None = None) -> str:
    """stdout of `wandb leet inspect --json [--summary] PATH`; raises when the CLI fails.

    The CLI is kept offline (no telemetry to a server) whatever the caller's WANDB_MODE is.
    """
    args = [sys.executable, "-m", "wandb", "leet", "inspect", "--json"]
    if summary:
        args.append("--summary")
    full_env = {**os.environ, **(env or {}), "WANDB_MODE": "offline"}
    proc = subprocess.run(
        [*args, str(path)], env=full_env, capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} {path} failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout


def records(path: Path, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The records of the run's .wandb log, each as {"num", "type", <type>: {...}}."""
    return [json.loads(line) for line in leet_inspect(path, env=env).splitlines() if line.strip()]


def read_offline_run(path: Path, env: dict[str, str] | None = None) -> OfflineRun:
    """Read an offline run folder (or its .wandb file) through the wandb CLI."""
    path = Path(path)
    info = json.loads(leet_inspect(path, summary=True, env=env))
    recs = records(path, env=env)
    run_records = [r["run"] for r in recs if r.get("type") == "run"]
    if not run_records:
        raise ValueError(f"no run record in {path}")
    history = [r["history"].get("item", {}) for r in recs if r.get("type") == "history"]
    history.sort(key=lambda row: row.get("_step", 0))
    return OfflineRun(
        path=path if path.is_dir() else path.parent,
        run_id=info.get("run_id", ""),
        name=info.get("name", ""),
        project=info.get("project", ""),
        group=run_records[0].get("run_group", ""),
        tags=list(info.get("tags") or []),
        config=info.get("config") or {},
        summary=info.get("summary") or {},
        history=history,
        state=info.get("state", ""),
        exit_code=info.get("exit_code"),
    )


def link_into(run_folder: Path, wandb_dir: Path) -> Path:
    """A relative symlink wandb_dir/<run folder's name> -> run_folder, so that one folder lists
    every run (`wandb leet outputs/wandb`, `wandb sync outputs/wandb/offline-run-*`) while each
    run's files stay in its own run folder."""
    wandb_dir.mkdir(parents=True, exist_ok=True)
    link = wandb_dir / run_folder.name
    if not link.is_symlink():
        link.symlink_to(os.path.relpath(run_folder, wandb_dir), target_is_directory=True)
    return link
