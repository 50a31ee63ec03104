"""Atomic file writes: the one helper every writer of GEM_HOME uses.

A reader (or a resumed run after a crash) sees the old file or the new one, never half of one:
the content goes to a uniquely named temporary file in the same directory (so concurrent writers of
one path never share a temporary name), is flushed to disk, then `os.replace`d over the target.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write (ending with `path`'s suffix: torch.export.save checks it); on success it
    replaces `path`, on an error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:  # on disk before the rename: a crash cannot leave an empty target
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode())


def write_json(path: str | Path, obj: Any, **dumps: Any) -> Path:
    """JSON (indent 2, non-JSON values as str unless `dumps` says otherwise)."""
    return write_text(path, json.dumps(obj, **{"indent": 2, "default": str, **dumps}))


def torch_save(obj: Any, path: str | Path) -> Path:
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
    return Path(path)
