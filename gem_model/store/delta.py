"""One writer per Delta partition: the commit path every writer of the lake goes through.

The daily schedule and the landing sensor can launch the same partition, and Dagster pools are per
asset (run-tag limits need the daemon), so the guarantee lives here, for every caller: a writer
holds an OS file lock on its partition (and a shared lock on its table) under $GEM_HOME/locks for
the whole read-write-commit; OPTIMIZE/VACUUM takes the table lock exclusively, so it never overlaps
a write of the same table. Writers on other hosts (an object-store lake) are serialised by delta-rs's
conflict detection: a CommitFailedError is retried with backoff. The version returned is the one
this write's own commit created, found in the table history by a write id stored in the commit info
(never re-read as "the latest", which may be another writer's).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import polars as pl
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, SchemaMismatchError

from gem_model.store.paths import gem_home

log = logging.getLogger(__name__)
WRITE_ID_KEY = "gem_write_id"  # commit-info key that identifies one write in the table history
COMMIT_ATTEMPTS = 6  # first try + retries of a write whose commit conflicted with another writer's
BACKOFF_S = 0.2  # first retry delay; doubles each time, with jitter so two losers do not collide again
_LOCK_NAME_RE = re.compile(r"[^A-Za-z0-9_.=-]+")


def _lock_dir(uri: str) -> Path:
    """Lock files of one table, keyed by its URI: two lakes under one GEM_HOME do not share locks."""
    d = gem_home() / "locks" / "lake" / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:16]
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextlib.contextmanager
def _flock(path: Path, exclusive: bool) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # Windows: no flock; the commit-conflict retry is the only guard there
        yield
        return
    with open(path, "a") as fh:  # one open file description per holder: threads exclude each other too
        fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def partition_lock(uri: str, *partitions: str) -> Iterator[None]:
    """Exclusive locks on partitions (e.g. "date=2026-11-01__surface=feed"), taken in sorted order so two writers
    of overlapping sets cannot deadlock; a shared lock on their table."""
    d = _lock_dir(uri)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_flock(d / "table.lock", exclusive=False))
        for name in sorted({_LOCK_NAME_RE.sub("_", p) or "_" for p in partitions}):
            stack.enter_context(_flock(d / f"{name}.lock", exclusive=True))
        yield


def table_lock(uri: str) -> contextlib.AbstractContextManager[None]:
    """Exclusive lock on the whole table (maintenance): no partition writer runs while it is held."""
    return _flock(_lock_dir(uri) / "table.lock", exclusive=True)


def commit_version(uri: str, write_id: str, storage_options: dict[str, str] | None = None) -> int:
    """The version of the commit whose info carries `write_id` (newest commits searched first)."""
    table = DeltaTable(uri, storage_options=storage_options)
    for limit in (50, None):
        for entry in table.history(limit):
            if entry.get(WRITE_ID_KEY) == write_id:
                return int(entry["version"])
    raise LookupError(f"{uri}: no commit carries {WRITE_ID_KEY}={write_id}")


def _schema_error(df: pl.DataFrame, uri: str, storage_options: dict[str, str] | None) -> ValueError:
    """What a lake written by an older version lacks (a new counter column, say), and how to rebuild it:
    delta-rs alone says only "number of fields does not match"."""
    table = set(DeltaTable(uri, storage_options=storage_options).schema().to_arrow().names)
    new, gone = sorted(set(df.columns) - table), sorted(table - set(df.columns))
    return ValueError(f"{uri}: this version writes columns the table lacks {new} (and not {gone}); the lake was "
                      "written by another version: re-materialize every partition of the table (`make clean && "
                      "make demo` rebuilds the demo's lake)")


def overwrite_partition(
    df: pl.DataFrame,
    uri: str,
    *,
    partition_by: Sequence[str],
    lock_keys: Sequence[str],
    predicate: str,
    storage_options: dict[str, str] | None = None,
) -> int:
    """Replace the rows matching `predicate` with `df` in one commit under the locks of `lock_keys`; returns the
    version it committed. A conflicting commit is retried whole (the loser's files are left for VACUUM)."""
    write_id = uuid.uuid4().hex
    options: dict = {"partition_by": list(partition_by),
                     "commit_properties": CommitProperties(custom_metadata={WRITE_ID_KEY: write_id})}
    with partition_lock(uri, *lock_keys):
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                df.write_delta(uri, mode="overwrite", storage_options=storage_options,
                               delta_write_options=options | {"predicate": predicate})
                break
            except SchemaMismatchError as err:
                raise _schema_error(df, uri, storage_options) from err
            except CommitFailedError as err:
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise
                delay = BACKOFF_S * 2**attempt * (1 + random.random())
                log.warning("%s %s: commit conflict (%s), retry %d in %.2f s", uri, predicate, err, attempt + 1, delay)
                time.sleep(delay)
        return commit_version(uri, write_id, storage_options)
