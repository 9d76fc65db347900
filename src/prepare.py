"""Prepare a dataset without training (the DVC data stages): tokenise text, and so on.

python -m src.prepare data=shakespeare
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from src.utils.config import config_errors, register_resolvers

register_resolvers()


@config_errors
@hydra.main(version_base="1.3", config_path="../conf", config_name="prepare")
def main(cfg: DictConfig) -> None:
    from hydra.utils import instantiate

    from src.utils.errors import report_errors

    with report_errors():
        instantiate(cfg.data, _convert_="all").prepare_data()


if __name__ == "__main__":
    main()
