"""The wandb logger: a training run without an API key logs offline into its run directory, and
what it logged (metrics, name, group, tags, the resolved config) matches the run's own outputs.

The offline run is read back with wandb's CLI, `wandb leet inspect --json [--summary]`
(src/utils/wandb_files.py), so no server and no network are involved.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from src.utils import config
from src.utils.config import wandb_offline
from src.utils.wandb_files import OfflineRun, offline_runs, read_offline_run
from tests.conftest import SHAKESPEARE

ROOT = Path(__file__).resolve().parents[1]


def _is_wandb_var(name: str) -> bool:
    """WANDB_MODE, WANDB_API_KEY, WANDB_PROJECT, ...: any of them would change the run."""
    return name.startswith("WANDB_") or name == "NETRC"


def _isolated_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without any wandb setting, with HOME and wandb's folders in tmp."""
    env = {k: v for k, v in os.environ.items() if not _is_wandb_var(k)}
    home = tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        WANDB_DIR=str(tmp / "wandb_dir"),
        WANDB_CACHE_DIR=str(tmp / "wandb_cache"),
        WANDB_CONFIG_DIR=str(tmp / "wandb_config"),
        WANDB_DATA_DIR=str(tmp / "wandb_data"),
        HYDRA_FULL_ERROR="1",
        **extra,
    )
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        Path(env[var]).mkdir(parents=True, exist_ok=True)
    return env


def _train(run_dir: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    if not SHAKESPEARE.exists():
        pytest.skip(f"dataset missing in the mirror: {SHAKESPEARE}")
    cmd = [
        sys.executable, "-m", "src.train",
        "experiment=gpt_shakespeare_char", f"data.path={SHAKESPEARE}", "debug=limit",
        f"hydra.run.dir={run_dir}", f"paths.data_dir={run_dir}/data", "logger=wandb",
        "callbacks.progress_bar.refresh_rate=0",
        *overrides,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory) -> tuple[Path, OfflineRun, dict[str, str]]:
    """One short training logged by wandb with no API key (so offline), read back by the CLI."""
    tmp = tmp_path_factory.mktemp("wandb")
    env = _isolated_env(tmp)
    run_dir = tmp / "run"
    _train(run_dir, env)
    runs = offline_runs(run_dir)
    assert len(runs) == 1, list((run_dir / "wandb").iterdir())
    assert len(list(runs[0].glob("run-*.wandb"))) == 1
    return run_dir, read_offline_run(runs[0], env=env), env


def test_run_without_api_key_is_offline_inside_the_run_dir(wandb_run):
    run_dir, run, env = wandb_run
    assert run.path.parent == run_dir / "wandb"
    assert run.path.name.endswith(f"-{run.run_id}")
    assert run.state == "finished" and run.exit_code == 0
    assert run.project == "bishop-dl"
    # nothing of wandb's (login, settings, cache) went to the home folder
    home = Path(env["HOME"])
    assert not [p for p in home.rglob("*") if "wandb" in p.name or p.name == ".netrc"]


def test_logged_metrics_match_metrics_json(wandb_run):
    run_dir, run, _ = wandb_run
    metrics = json.loads((run_dir / "metrics.json").read_text())
    expected = {"train/loss", "train/ppl", "train/tokens_per_sec", "val/loss", "val/ppl"}
    assert expected <= set(metrics)
    missing = set(metrics) - set(run.summary)
    assert not missing, f"in metrics.json but never logged to wandb: {sorted(missing)}"
    for key, value in metrics.items():
        logged = run.logged(key)
        assert logged, f"{key} is in the summary but in no history step"
        assert math.isclose(logged[-1], value, rel_tol=1e-6), (key, logged[-1], value)
        assert math.isclose(run.summary[key], value, rel_tol=1e-6), (key, run.summary[key], value)
    # a history, not only final values: a step per training step and one validation per epoch
    assert len(run.logged("train/loss")) == 20  # debug=limit: max_steps=20, log_every_n_steps=1
    assert len(run.logged("val/loss")) == 2  # steps_per_epoch=10 → 2 epochs
    steps = run.logged("trainer/global_step")
    assert steps == sorted(steps) and steps[-1] == 19
    # the attention-map image of each validation (wandb flattens media into <key>.<field>)
    assert run.logged("val/attention._type") == ["images/separated"] * 2


def test_run_name_group_and_tags(wandb_run):
    run_dir, run, _ = wandb_run
    assert re.fullmatch(r"gpt-shakespeare-[0-9a-f]{6}", run.name), run.name
    assert run.group == "gpt_shakespeare_char"
    assert sorted(run.tags) == ["gpt", "shakespeare"]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert run.name == saved["logger"]["wandb"]["name"]  # the one run_id of this run


def test_full_resolved_config_is_logged(wandb_run):
    run_dir, run, _ = wandb_run
    config = run.config
    # train.py logs OmegaConf.to_container(cfg, resolve=True): the groups stay nested
    assert config["model"]["net"]["n_layer"] == 4
    assert config["data"]["block_size"] == 64
    assert config["experiment_name"] == "gpt_shakespeare_char"
    assert config["logger"]["wandb"]["offline"] is True
    assert config["paths"]["output_dir"] == str(run_dir)
    # and it is the same config as <run dir>/config.yaml, key for key
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    for key, value in saved.items():
        assert key in config, key
        assert config[key] == value, key


def test_disabled_mode_trains_without_wandb_files(tmp_path):
    env = _isolated_env(tmp_path, WANDB_MODE="disabled")
    run_dir = tmp_path / "run"
    fast = ["trainer.max_steps=4", "data.steps_per_epoch=2", "trainer.limit_val_batches=1",
            "model.generation.max_new_tokens=20"]  # fmt: skip
    _train(run_dir, env, *fast)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert {"train/loss", "val/loss"} <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values())
    assert not offline_runs(run_dir)
    assert not list(tmp_path.rglob("*.wandb"))


# -- the `wandb_offline` resolver ----------------------------------------------------------------


@pytest.fixture
def bare_env(tmp_path, monkeypatch) -> Path:
    """No wandb variable, and a HOME without .netrc; returns HOME."""
    for var in [k for k in os.environ if _is_wandb_var(k)]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def server_up(monkeypatch) -> None:
    """Pretend the wandb server answers: the tests have no network."""
    monkeypatch.setattr(config.socket, "create_connection", lambda *a, **k: io.BytesIO())


def _write_netrc(home: Path, text: str) -> None:
    path = home / ".netrc"
    path.write_text(text)
    path.chmod(0o600)  # netrc refuses a file with a password that others can read


@pytest.mark.parametrize(
    ("mode", "offline"), [("offline", True), ("dryrun", True), ("online", False)]
)
def test_wandb_offline_explicit_mode_wins(bare_env, monkeypatch, mode, offline):
    monkeypatch.setenv("WANDB_MODE", mode)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    _write_netrc(bare_env, "machine api.wandb.ai login user password " + "y" * 40 + "\n")
    assert wandb_offline() is offline


def test_wandb_offline_without_any_key(bare_env):
    assert not (bare_env / ".netrc").exists()
    assert wandb_offline() is True


def test_wandb_offline_with_api_key_env(bare_env, monkeypatch, server_up):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_offline() is False


def test_wandb_offline_with_api_key_but_no_network(bare_env, monkeypatch):
    """A key is not enough: a server that does not answer within a second means offline."""

    def unreachable(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(config.socket, "create_connection", unreachable)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_offline() is True


def test_wandb_offline_empty_mode_is_unset(bare_env, monkeypatch, server_up):
    monkeypatch.setenv("WANDB_MODE", "")
    assert wandb_offline() is True
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_offline() is False


@pytest.mark.parametrize(
    ("netrc", "offline"),
    [
        ("machine api.wandb.ai login user password " + "y" * 40 + "\n", False),  # `wandb login`
        ("machine example.com login user password secret\n", True),  # another host only
        ("bogus api.wandb.ai\n", True),  # malformed: offline rather than an error
    ],
)
def test_wandb_offline_reads_netrc(bare_env, netrc, offline, server_up):
    _write_netrc(bare_env, netrc)
    assert wandb_offline() is offline
