"""Hydra/OmegaConf helpers: resolvers used by conf/, the printed config tree, instantiation."""

from __future__ import annotations

import functools
import netrc
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.syntax import Syntax
from rich.tree import Tree


def wandb_offline() -> bool:
    """Log offline unless wandb can reach its server: an explicit WANDB_MODE wins; otherwise online
    only with an API key (environment, or ~/.netrc from `wandb login`) and a server that answers
    within a second, so that a run never waits on a missing network."""
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode in ("offline", "dryrun")
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    if not os.environ.get("WANDB_API_KEY"):
        try:
            auth = netrc.netrc().authenticators(host)
        except (OSError, netrc.NetrcParseError):
            return True
        if not (auth and auth[2]):  # an entry without a password is no key
            return True
    try:
        socket.create_connection((host, 443), timeout=1).close()
    except OSError:
        return True
    return False


def launched_id() -> str | None:
    """The id shared by every process of one multi-process launch by torchrun (its run id: random
    with --standalone or on one machine, else --rdzv-id), which names their one run folder; None
    otherwise."""
    env = os.environ
    if int(env.get("WORLD_SIZE", "1")) > 1 and "TORCHELASTIC_RUN_ID" in env:
        if env["TORCHELASTIC_RUN_ID"] == "none":
            from src.utils.errors import PipelineError

            raise PipelineError(
                "torchrun on several machines needs --rdzv-id=<job id> (the run folder's "
                "name), or hydra.run.dir=<one folder for all>"
            )
        return f"torchrun-{env['TORCHELASTIC_RUN_ID'][:8]}"
    return None  # srun's tasks: give them one folder, hydra.run.dir=outputs/runs/$SLURM_JOB_ID


def process_rank() -> int:
    """This process's global rank when a launcher (torchrun, srun, Lightning) set it, else 0."""
    env = os.environ
    return int(env.get("RANK", env.get("SLURM_PROCID", env.get("LOCAL_RANK", "0"))))


def rank_file(name: str) -> str:
    """`name` on rank 0; `<stem>.rank<k><suffix>` on rank k (train.log -> train.rank1.log)."""
    k = process_rank()
    return name if k == 0 else f"{Path(name).stem}.rank{k}{Path(name).suffix}"


def run_group(name: str) -> str:
    """The wandb group of a run: `name` (the experiment), and in a sweep `name-<sweep folder>`,
    so that one sweep's trials are one group, apart from other sweeps of the same experiment."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return name
    return f"{name}-{Path(HydraConfig.get().sweep.dir).name}"


def command_line_values() -> dict:
    """This run's key=value overrides of dotted keys (a sweep's swept values among them), parsed,
    e.g. {"model.optim.lr": 0.003}: logged as top-level config keys, so that wandb's run table
    and parallel-coordinates view show them as columns with no setup."""
    import yaml
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    values = {}
    for override in HydraConfig.get().overrides.task:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if "." in key and not key.startswith("hydra."):
            values[key] = yaml.safe_load(value)
    return values


def register_resolvers() -> None:
    resolvers = {
        # cached: one per run; the processes of one torchrun/srun launch share the launch's id
        "run_id": lambda: launched_id() or secrets.token_hex(3),
        "run_time": lambda: "" if launched_id() else time.strftime("%Y-%m-%d_%H-%M-%S_"),
        # the files that only one process of a multi-process run writes
        "rank_zero": lambda value: value if process_rank() == 0 else None,
        "rank_file": rank_file,
        "run_group": run_group,
        "wandb_offline": wandb_offline,
        "path_stem": lambda path, default: Path(path).stem if path else default,
    }
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn, use_cache=name in ("run_id", "run_time"))


def print_config_tree(cfg: DictConfig, save_to: Path | None = None) -> None:
    """Show the resolved config as a rich tree, one branch per config group, and save it."""
    tree = Tree("config", guide_style="dim")
    for key, value in OmegaConf.to_container(cfg, resolve=True).items():
        text = OmegaConf.to_yaml(value) if isinstance(value, (dict, list)) else str(value)
        tree.add(f"[bold]{key}").add(Syntax(text.rstrip(), "yaml", theme="ansi_dark"))
    Console().print(tree)
    if save_to is not None:
        save_to.mkdir(parents=True, exist_ok=True)
        (save_to / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        with open(save_to / "config_tree.log", "w") as f:
            Console(file=f, width=120, color_system=None).print(tree)


def instantiate_all(section: DictConfig | None) -> list:
    """Instantiate every `_target_` entry of a group such as callbacks or logger."""
    from hydra.utils import instantiate

    return [instantiate(c) for c in (section or {}).values() if c and "_target_" in c]


def instantiate_model(model: DictConfig, data: object):
    """The model of `model` shaped by the data module's `model_kwargs` (vocabulary size, image
    size, ...); a model and data that do not go together (model=imagegpt data=fsdd) are one
    error line naming both, not a TypeError from deep inside Hydra."""
    import inspect

    from hydra.utils import get_object, instantiate

    from src.utils.errors import PipelineError

    kwargs, target = data.model_kwargs, get_object(model._target_)  # a class or a factory
    params = inspect.signature(target).parameters.values()
    if all(p.kind != p.VAR_KEYWORD for p in params):
        foreign = sorted(set(kwargs) - {p.name for p in params})
        if foreign:
            raise PipelineError(
                f"{target.__name__} does not train on {type(data).__name__}'s data: the data "
                f"sets {', '.join(foreign)}, which {target.__name__} does not take"
            )
    return instantiate(model, **kwargs, _convert_="all")


def config_errors(main: Callable) -> Callable:
    """An `@hydra.main` entry point whose config errors are one `error: ...` line and exit 1, as
    report_errors makes bad input: an override Hydra cannot parse or apply (a misspelt key, an
    unknown option), a mandatory value left unset, an interpolation that does not resolve.
    Hydra prints these as several lines of its own; with HYDRA_FULL_ERROR=1, set here while
    `main` runs (unless the user set it), it raises them instead."""
    from hydra.errors import CompactHydraException
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        if os.environ.get("HYDRA_FULL_ERROR") == "1":  # the user asked for the traceback
            return main(*args, **kwargs)
        os.environ["HYDRA_FULL_ERROR"] = "1"
        try:
            return main(*args, **kwargs)
        except (CompactHydraException, InterpolationResolutionError, MissingMandatoryValue) as e:
            print(f"error: {_one_line(e)}", file=sys.stderr)
            sys.exit(1)
        finally:
            os.environ.pop("HYDRA_FULL_ERROR", None)

    return wrapper


def _one_line(e: BaseException, cause: bool = False) -> str:
    """Hydra's or OmegaConf's message on one line: the override or key it is about, the message
    without the lines that locate the key or list the search path (a list of options indented
    by tabs joined), and its cause in parentheses."""
    from hydra.errors import OverrideParseException

    text = str(e).split("Config search path:")[0]
    parts: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith(("full_key:", "object_type=")):
            continue
        if line.startswith("\t") and parts and parts[-1].endswith((":", ",")):
            parts[-1] += f" {line.strip()},"  # "Available options in 'data': audio, cifar10, ..."
        else:
            parts.append(line.strip())
    message = " ".join(parts).rstrip(",")
    key = getattr(e, "full_key", None)
    if isinstance(e, OverrideParseException):
        key = f"override {e.override!r}"
    if key and key not in message and not cause:
        message = f"{key}: {message}"
    if e.__cause__ is not None and str(e.__cause__) not in message:
        message += f" ({_one_line(e.__cause__, cause=True)})"
    return message
