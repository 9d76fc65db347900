"""Train and test one model on one dataset, as composed by Hydra from conf/.

python -m src.train model=gpt data=text
python -m src.train experiment=gpt_shakespeare_char trainer=ddp_cpu logger=many
python -m src.train --help                     # config groups and options
"""

from __future__ import annotations

import json
import logging
import re
import signal
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from src.utils.config import config_errors, register_resolvers

log = logging.getLogger(__name__)
register_resolvers()
# Lightning 2.6 with torch 2.13 warns about its own use of a torch internal on every run
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit, test the best checkpoint, write metrics.json; returns the final metrics."""
    import pytorch_lightning as pl
    from filelock import FileLock
    from hydra.utils import instantiate
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    from src.utils.checkpoint import (
        AtomicCheckpointIO,
        check_same_model,
        class_path,
        load_checkpoint,
    )
    from src.utils.config import (
        command_line_values,
        instantiate_all,
        instantiate_model,
        print_config_tree,
    )
    from src.utils.errors import PipelineError, exit_1_when_a_child_dies, lost_peer
    from src.utils.resume import Preemption, continue_csv, previous_wandb_id, resolve_ckpt_path

    run_dir = Path(cfg.paths.output_dir)
    if pl.utilities.rank_zero.rank_zero_only.rank == 0:
        print_config_tree(cfg, save_to=run_dir)
    pl.seed_everything(cfg.seed, workers=True)

    datamodule = instantiate(cfg.data, _convert_="all")
    # the model's shape (e.g. vocabulary size) depends on the data; the processes of a torchrun
    # launch prepare one at a time, so that the first prepares and the others find it done
    Path(cfg.paths.data_dir).mkdir(parents=True, exist_ok=True)
    with FileLock(Path(cfg.paths.data_dir) / ".prepare.lock"):
        datamodule.prepare_data()
    model = instantiate_model(cfg.model, datamodule)
    ckpt_path = resolve_ckpt_path(cfg.ckpt_path, run_dir)
    # a run resumed in its own folder goes on in the same wandb run and CSV log
    resumed_here = ckpt_path is not None and run_dir.resolve() in Path(ckpt_path).resolve().parents
    if ckpt_path:
        ckpt = load_checkpoint(ckpt_path, expected_class=class_path(model))
        check_same_model(ckpt, model, ckpt_path)
        if resumed_here and cfg.get("logger") and cfg.logger.get("wandb"):
            with open_dict(cfg):
                cfg.logger.wandb.id = previous_wandb_id(run_dir)
                cfg.logger.wandb.resume = "allow"

    loggers = instantiate_all(cfg.get("logger"))
    for lg in loggers:
        if resumed_here and type(lg).__name__ == "CSVLogger":
            continue_csv(lg, ckpt["global_step"])
    preemption = Preemption(cfg.seed)
    trainer = instantiate(
        cfg.trainer,
        callbacks=[*instantiate_all(cfg.get("callbacks")), preemption],
        logger=loggers or False,
        plugins=[AtomicCheckpointIO()],
    )
    hparams = {**OmegaConf.to_container(cfg, resolve=True), **command_line_values()}
    for lg in loggers:
        lg.log_hyperparams(hparams)
    _link_wandb(loggers, run_dir, Path(cfg.paths.log_dir))

    exit_1_when_a_child_dies()
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        metrics = {**preemption.metrics, **trainer.callback_metrics}
        if cfg.test and not trainer.fast_dev_run:
            best = trainer.checkpoint_callback and trainer.checkpoint_callback.best_model_path
            trainer.test(model, datamodule=datamodule, ckpt_path=best or None, weights_only=True)
            metrics.update(trainer.callback_metrics)
    except SIGTERMException:  # SIGTERM or SIGINT: an unfinished run, resumable
        _close_wandb(loggers, exit_code=preemption.exit_code, preempted=True)
        log.warning("resume with: python -m src.train ... ckpt_path=last hydra.run.dir=%s", run_dir)
        raise SystemExit(preemption.exit_code) from None
    except BaseException as e:
        _close_wandb(loggers, exit_code=1)
        if trainer.world_size > 1 and lost_peer(e):
            if getattr(trainer.strategy.launcher, "procs", None):  # Lightning started the others
                trainer.strategy.launcher.kill(signal.SIGKILL)
            # gloo's "[.../pair.cc:537] Read error ...: Connection reset by peer. This is ..."
            reason = re.sub(r"^\[[^\]]*\] ", "", str(e).strip()).split(". ")[0][:160]
            raise PipelineError(
                f"process {trainer.global_rank} of {trainer.world_size}: another process of this "
                f"run died or stopped answering ({reason}); see its log; resume with ckpt_path=last"
            ) from None
        raise
    _close_wandb(loggers, exit_code=0)

    metrics = {k: float(v) for k, v in sorted(metrics.items())}
    if trainer.is_global_zero:
        (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        log.info("metrics and checkpoints in %s", run_dir)
    return metrics


def _link_wandb(loggers: list, run_dir: Path, log_dir: Path) -> None:
    """List a wandb run kept in a run folder under log_dir (outputs/runs/..., outputs/multiruns/...)
    in log_dir/wandb/ too, where `wandb leet outputs/wandb` shows every run side by side."""
    from src.utils.wandb_files import link_into

    for lg in loggers:
        if type(lg).__name__ == "WandbLogger" and lg._experiment is not None:
            folder = Path(lg.experiment.dir).parent  # <run>/wandb/offline-run-<time>-<id>
            if log_dir.resolve() in run_dir.resolve().parents:
                link_into(folder, log_dir / "wandb")


def _close_wandb(loggers: list, exit_code: int, preempted: bool = False) -> None:
    """Finish the wandb run even when training failed, so that its files are complete."""
    for lg in loggers:
        if type(lg).__name__ == "WandbLogger" and lg._experiment is not None:
            if preempted:
                lg.experiment.mark_preempting()
            lg.experiment.finish(exit_code=exit_code)


@config_errors
@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from src.utils.errors import report_errors

    with report_errors():
        metrics = train(cfg)
        return metrics.get(cfg.optimized_metric)


if __name__ == "__main__":
    main()
