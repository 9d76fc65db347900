"""Comparing runs (src.compare) and sweeps: a real Optuna sweep of three short GPT trials through
the normal entry point, each trial its own run folder and its own offline wandb run in the
sweep's group with the swept values as top-level config keys; then src.compare on the sweep, on a
group and on run folders whose curves come only from the wandb log."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from src.compare import main as compare
from src.utils.wandb_files import offline_runs, read_offline_run
from tests.conftest import FAST, assert_ok, run_module

SWEPT = ("model.optim.lr", "model.optim.warmup_steps", "model.net.dropout")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, shakespeare):
    out = tmp_path_factory.mktemp("sweep")
    proc = run_module(
        "src.train", "-m", "hparams_search=gpt_optuna", *FAST, f"data.path={shakespeare}",
        "hydra.sweeper.n_trials=3", "hydra.sweeper.sampler.n_startup_trials=3", "logger=many",
        f"hydra.sweep.dir={out / 'multiruns' / 'lr'}", f"paths.data_dir={out}/data",
        f"paths.log_dir={out}",
    )  # fmt: skip
    assert_ok(proc)
    return out / "multiruns" / "lr"


def val_losses(sweep) -> list[float]:
    return [json.loads((sweep / k / "metrics.json").read_text())["val/loss"] for k in "012"]


def test_every_trial_is_a_finished_run_with_its_own_values(sweep):
    trials = sorted(p for p in sweep.iterdir() if p.name.isdigit())
    assert [p.name for p in trials] == ["0", "1", "2"]
    lrs = set()
    for t in trials:
        assert json.loads((t / "metrics.json").read_text())["val/loss"] > 0
        config = yaml.safe_load((t / "config.yaml").read_text())
        lrs.add(config["model"]["optim"]["lr"])
    assert len(lrs) == 3


def test_the_best_trial_is_written(sweep):
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(min(val_losses(sweep)))
    assert set(best["best_params"]) == set(SWEPT)


def test_each_trial_is_one_wandb_run_in_the_sweep_group_with_swept_keys_on_top(sweep):
    runs = [read_offline_run(offline_runs(sweep / str(k))[0]) for k in range(3)]
    assert len({r.run_id for r in runs}) == 3
    assert {r.group for r in runs} == {f"gpt_shakespeare_char-{sweep.name}"}
    for k, r in enumerate(runs):
        config = yaml.safe_load((sweep / str(k) / "config.yaml").read_text())
        assert r.config["model.optim.lr"] == pytest.approx(config["model"]["optim"]["lr"])
        assert set(SWEPT) <= set(r.config)


def test_every_trial_is_listed_in_one_wandb_folder(sweep):
    links = sorted((sweep.parents[1] / "wandb").iterdir())  # <log_dir>/wandb: what leet browses
    assert len(links) == 3 and all(p.is_symlink() for p in links)
    assert {p.resolve() for p in links} == {offline_runs(sweep / k)[0].resolve() for k in "012"}


def test_compare_a_sweep_shows_the_swept_keys_the_metrics_and_the_curves(sweep, capsys):
    compare(["--sweep", str(sweep), "--md"])
    table = capsys.readouterr().out
    header = table.splitlines()[0]
    assert "val/loss" in table and all(k in table for k in SWEPT)
    best = min(range(3), key=val_losses(sweep).__getitem__)
    assert f"best trial: lr/{best}, val/loss" in table
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 3 or header.count("|") == 3 + 2  # trials as rows or as columns
    assert (sweep / "compare.png").stat().st_size > 10_000


def test_compare_by_group_finds_the_trials(sweep, capsys):
    compare(["--group", "gpt_shakespeare_char", "--root", str(sweep.parents[1]), "--md",
             "--plot", str(sweep.parent / "group.png")])  # fmt: skip
    assert capsys.readouterr().out.count("lr/") >= 3  # the trials' names: <sweep>/<trial>


def test_compare_reads_the_curves_from_wandb_when_there_is_no_csv(sweep, tmp_path, capsys):
    runs = []
    for k in (0, 1):
        run = tmp_path / f"run{k}"
        shutil.copytree(sweep / str(k), run, symlinks=True)
        shutil.rmtree(run / "csv")
        runs.append(str(run))
    compare([*runs, "--metrics", "train/loss", "--plot", str(tmp_path / "c.png")])
    assert "curves:" in capsys.readouterr().out and (tmp_path / "c.png").exists()


def test_compare_bad_input_is_one_error(tmp_path):
    with pytest.raises(SystemExit, match="not a run folder"):
        compare([str(tmp_path)])
    with pytest.raises(SystemExit, match="no runs found"):
        compare(["--group", "nothing", "--root", str(tmp_path)])


def test_the_slurm_launcher_runs_a_sweep_through_submitit_locally(tmp_path, shakespeare):
    """hydra/launcher=local is hydra/launcher=slurm's plugin with submitit's local executor: each
    run a separate process started and watched by submitit, as SLURM's jobs are."""
    sweep = tmp_path / "sweep"
    proc = run_module(
        "src.train", "-m", "hydra/launcher=local", *FAST, f"data.path={shakespeare}",
        "logger=csv", "seed=1,2", f"hydra.sweep.dir={sweep}", f"paths.data_dir={tmp_path}/data",
        f"paths.log_dir={tmp_path}",
    )  # fmt: skip
    assert_ok(proc)
    assert (sweep / ".submitit").is_dir()  # submitit's job folders: its pickled jobs and logs
    seeds = [yaml.safe_load((sweep / k / "config.yaml").read_text())["seed"] for k in "01"]
    assert sorted(seeds) == [1, 2]
    assert all((sweep / k / "metrics.json").exists() for k in "01")


def test_the_slurm_launcher_takes_partition_gpus_time_and_memory_as_overrides():
    proc = run_module(
        "src.train", "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
        "hydra.launcher.gpus_per_node=4", "hydra.launcher.timeout_min=30",
        "hydra.launcher.mem_gb=64", "--cfg", "hydra", "-p", "hydra.launcher",
    )  # fmt: skip
    assert_ok(proc)
    launcher = yaml.safe_load(proc.stdout)
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert (launcher["partition"], launcher["gpus_per_node"]) == ("gpu", 4)
    assert (launcher["timeout_min"], launcher["mem_gb"]) == (30, 64)


def test_the_gnn_optuna_preset_maximises_val_acc_over_four_keys():
    proc = run_module("src.train", "hparams_search=gcn_optuna", "experiment=gcn_cora", "--cfg",
                      "hydra", "-p", "hydra.sweeper")  # fmt: skip
    assert_ok(proc)
    sweeper = yaml.safe_load(proc.stdout)
    assert sweeper["direction"] == "maximize" and sweeper["_target_"].endswith("OptunaSweeper")
    assert set(sweeper["params"]) == {"model.net.hidden", "model.net.dropout", "model.optim.lr",
                                      "model.optim.weight_decay"}  # fmt: skip
