"""Images and recordings in a column of a Hugging Face dataset, for the image and audio data
modules (`data.hub`): a saved dataset folder (`save_to_disk`), Parquet or JSON Lines files, or a
Hub name (fetched once into the datasets cache). The media stay encoded (the column cast to
`Image(decode=False)` or `Audio(decode=False)`): preparation reads a chunk's bytes at a time from
the Arrow files and its workers decode them (Pillow, soundfile), so memory is set by the chunk,
not by the dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from src.utils.errors import PipelineError

BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
# a dataset's split names -> this project's (src.data.text.SPLITS), in their order
SPLIT_NAMES = {"train": "train", "validation": "val", "valid": "val", "val": "val",
               "dev": "val", "test": "test"}  # fmt: skip


def open_media(name: str, config: str | None, column: str, kind: str) -> dict:
    """{split: datasets.Dataset} of dataset `name`, its splits named train, val and test (one
    without splits is train), its `column` (kind "image" or "audio") left encoded: {"bytes",
    "path"} per row."""
    import datasets

    path = Path(name).expanduser()
    try:
        if path.is_dir() and any((path / f).exists() for f in ("state.json",
                                                               "dataset_dict.json")):  # fmt: skip
            ds = datasets.load_from_disk(str(path))
        elif path.suffix in BUILDERS:
            ds = datasets.load_dataset(BUILDERS[path.suffix], data_files=str(path))
        else:
            ds = datasets.load_dataset(name, config)
    except (OSError, ValueError) as e:  # missing files, unknown names, no network
        raise PipelineError(f"data.hub={name!r}: {str(e).splitlines()[0]}") from None
    parts = dict(ds) if isinstance(ds, datasets.DatasetDict) else {"train": ds}
    if unknown := sorted(set(parts) - set(SPLIT_NAMES)):
        raise PipelineError(f"data.hub={name!r}: splits {unknown} are not train, validation or "
                            "test")  # fmt: skip
    feature = datasets.Image(decode=False) if kind == "image" else datasets.Audio(decode=False)
    for split, table in parts.items():
        if column not in table.column_names:
            columns = ", ".join(table.column_names)
            raise PipelineError(f"data.hub={name!r} ({split}): no column {column!r} (columns: "
                                f"{columns}); set data.{kind}_column")  # fmt: skip
        parts[split] = table.cast_column(column, feature)
    order = ("train", "val", "test")
    return dict(sorted(((SPLIT_NAMES[s], t) for s, t in parts.items()),
                       key=lambda kv: order.index(kv[0])))  # fmt: skip


def media_labels(parts: dict, column: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """Each split's labels (int64 (N,)) and the class names: a ClassLabel column's names, or the
    sorted distinct values of any other column."""
    import datasets

    first = next(iter(parts.values()))
    if column not in first.column_names:
        raise PipelineError(f"no label column {column!r} (columns: {', '.join(first.column_names)})"
                            "; set data.label_column")  # fmt: skip
    feature = first.features[column]
    values = {s: np.asarray(t.with_format("numpy")[column]) for s, t in parts.items()}
    if isinstance(feature, datasets.ClassLabel):
        return {s: v.astype(np.int64) for s, v in values.items()}, list(feature.names)
    classes = sorted({str(v) for vs in values.values() for v in vs})
    index = {c: i for i, c in enumerate(classes)}
    return {s: np.array([index[str(v)] for v in vs], np.int64) for s, vs in values.items()}, classes


def blobs(table, column: str, rows) -> list[dict]:
    """The encoded media of `rows` of a table from open_media: {"bytes", "path"} each."""
    return table.select_columns([column])[[int(r) for r in rows]][column]


def blob_name(item: str | dict) -> str:
    """How an error names a file, or a row of a dataset."""
    if isinstance(item, dict):
        return item.get("path") or "a row of data.hub"
    return str(item)
