"""One chunk of a corpus encoded in a worker process (src/data/corpus.py hands them out). Kept
free of torch and of the rest of the pipeline, so that a worker starts in a fraction of a second
and holds only the tokenizer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from src.utils.errors import PipelineError
from src.utils.files import atomic_file

GROUP = 1 << 20  # characters given to the tokenizer at once: its encodings take ~100 B a token

_tokenizer = None
_eos = None


def start_worker(tokenizer_json: str, eos: str) -> None:
    """The process's tokenizer, from its JSON, and the id of the end-of-document token."""
    global _tokenizer, _eos
    from tokenizers import Tokenizer

    _tokenizer = Tokenizer.from_str(tokenizer_json)
    _eos = _tokenizer.token_to_id(eos)


def encode_chunk(job: tuple) -> int:
    """Encode one chunk's pieces (text, ends a document, its split or `all`) and write its token
    files (`<index>.<part>.bin`), then `<index>.json` with their lengths: the chunk is done once
    that exists. Returns the chunk's index."""
    folder, index, dtype, pieces = job
    files, counts = {}, {}
    try:
        for group in _groups(pieces):
            encodings = _tokenizer.encode_batch([text for text, _, _ in group])
            for enc, (_, ends, part) in zip(encodings, group, strict=True):
                if part not in files:
                    files[part] = open(Path(folder) / f"{index:06d}.{part}.bin", "wb")  # noqa: SIM115
                ids = np.asarray([*enc.ids, _eos] if ends else enc.ids, dtype=dtype)
                files[part].write(ids.tobytes())
                counts[part] = counts.get(part, 0) + len(ids)
    except OSError as e:
        raise PipelineError(f"cannot write {folder}: {e.strerror or e}") from None
    finally:
        for f in files.values():
            f.close()
    with atomic_file(Path(folder) / f"{index:06d}.json") as done:
        done.write_text(json.dumps(counts))
    return index


def _groups(pieces: list[tuple]) -> Iterator[list[tuple]]:
    """Consecutive pieces of about GROUP characters together."""
    group, n = [], 0
    for piece in pieces:
        group.append(piece)
        n += len(piece[0])
        if n >= GROUP:
            yield group
            group, n = [], 0
    if group:
        yield group
