"""Delta on S3 (moto's server on 127.0.0.1): the commit protocol of gem_model/store/object_store.py under
concurrent and stale writers, and the lake IO of gem_pipelines/data/lake.py against an object store."""

from __future__ import annotations

import datetime as dt
import threading

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from s3_server import moto_s3  # tests/pipelines/ is on sys.path (rootdir import mode)

from gem_model.store.paths import storage_options, table_uri
from gem_pipelines.data import lake

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as endpoint:
        yield endpoint


@pytest.fixture
def s3_env(s3, monkeypatch):
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return s3


def test_server_honours_conditional_writes(s3):
    """The protocol rests on put-if-absent: a second `If-None-Match: *` PUT of one key must be refused."""
    from botocore.exceptions import ClientError

    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key="probe/once", Body=b"1", IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=s3.bucket, Key="probe/once", Body=b"2", IfNoneMatch="*")
    assert client.get_object(Bucket=s3.bucket, Key="probe/once")["Body"].read() == b"1"


def test_server_lets_one_of_many_racing_conditional_writes_win(s3):
    """Sixteen clients PUT one key with `If-None-Match: *` at once, ten times over: exactly one wins each time
    (moto alone let two win now and then, and CI lost a Delta commit to it: see s3_server.py)."""
    from botocore.exceptions import ClientError

    clients = [s3.client() for _ in range(16)]

    def race(key: str) -> tuple[list[int], list[str]]:
        winners: list[int] = []
        refusals: list[str] = []
        start = threading.Barrier(len(clients))

        def put(i: int) -> None:
            start.wait()
            try:
                clients[i].put_object(Bucket=s3.bucket, Key=key, Body=b"%d" % i, IfNoneMatch="*")
                winners.append(i)
            except ClientError as e:
                refusals.append(e.response["Error"]["Code"])

        threads = [threading.Thread(target=put, args=(i,)) for i in range(len(clients))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return winners, refusals

    for trial in range(10):
        winners, refusals = race(f"race/{trial}")
        assert len(winners) == 1
        assert refusals == ["PreconditionFailed"] * (len(clients) - 1)
        assert clients[0].get_object(Bucket=s3.bucket, Key=f"race/{trial}")["Body"].read() == b"%d" % winners[0]


def test_concurrent_partition_writers_all_commit(s3_env):
    """Eight writers replace eight partitions of one table at once: every commit lands, none is lost."""
    uri = f"{s3_env.lake_uri}/concurrent"
    so = storage_options(uri)
    pl.DataFrame({"surface": ["s0"], "x": [-1]}).write_delta(
        uri, mode="overwrite", storage_options=so, delta_write_options={"partition_by": ["surface"]}
    )
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            pl.DataFrame({"surface": [f"s{i}"] * 3, "x": [i] * 3}).write_delta(
                uri, mode="overwrite", storage_options=so,
                delta_write_options={"partition_by": ["surface"], "predicate": f"surface = 's{i}'"},
            )
        except BaseException as e:  # surfaced below: a thread's exception would vanish otherwise
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    df = pl.read_delta(uri, storage_options=so).sort("surface", "x")
    assert df.group_by("surface").agg(pl.col("x").unique()).sort("surface").rows() == [(f"s{i}", [i]) for i in range(8)]
    assert df.height == 24
    log = sorted(k.rsplit("/", 1)[1] for k in s3_env.keys("lake/concurrent/_delta_log/") if k.endswith(".json"))
    assert log == [f"{v:020d}.json" for v in range(9)]  # one log entry per commit, no gaps, none overwritten


@pytest.mark.parametrize("unsafe_rename", [None, "true"], ids=["default", "AWS_S3_ALLOW_UNSAFE_RENAME"])
def test_stale_writer_cannot_overwrite_a_newer_commit(s3_env, monkeypatch, unsafe_rename):
    """A writer that read version 0 and replaces a partition someone replaced since fails; the winner stays.
    An append from a stale snapshot is rebased onto the newer version instead of replacing it. The
    legacy AWS_S3_ALLOW_UNSAFE_RENAME changes none of this under delta-rs 1.6 (object_store.py)."""
    if unsafe_rename:
        monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", unsafe_rename)
    uri = f"{s3_env.lake_uri}/stale-{unsafe_rename or 'default'}"
    so = storage_options(uri)
    write_deltalake(uri, pa.table({"p": ["a", "b"], "x": [0, 0]}), partition_by=["p"], storage_options=so)
    stale = DeltaTable(uri, storage_options=so)
    write_deltalake(uri, pa.table({"p": ["a"], "x": [1]}), mode="overwrite", predicate="p = 'a'", storage_options=so)
    with pytest.raises(CommitFailedError, match="concurrent"):
        write_deltalake(stale, pa.table({"p": ["a"], "x": [2]}), mode="overwrite", predicate="p = 'a'")
    assert sorted(pl.read_delta(uri, storage_options=so).rows()) == [("a", 1), ("b", 0)]
    assert DeltaTable(uri, storage_options=so).version() == 1

    stale = DeltaTable(uri, storage_options=so)
    write_deltalake(uri, pa.table({"p": ["b"], "x": [3]}), mode="append", storage_options=so)
    write_deltalake(stale, pa.table({"p": ["c"], "x": [4]}), mode="append")
    assert sorted(pl.read_delta(uri, storage_options=so).rows()) == [("a", 1), ("b", 0), ("b", 3), ("c", 4)]
    assert DeltaTable(uri, storage_options=so).version() == 3


def test_lake_io_round_trip_on_s3(s3_env):
    """write_partition / read_partition / table_version / optimize_and_vacuum, with the lake at s3://."""
    from gem_model.store.schemas import ORACLE_SCHEMA

    d = dt.date(2026, 11, 2)
    assert table_uri("oracle").startswith("s3://")
    assert not lake.table_exists("oracle")
    df = pl.DataFrame(
        {"request_id": ["r1", "r2"], "date": [d, d], "surface": ["feed", "feed"], "p_click": [0.1, 0.2],
         "p_conversion": [0.01, 0.02]}
    ).select(list(ORACLE_SCHEMA)).cast(ORACLE_SCHEMA)
    v0 = lake.write_partition(df, "oracle", {"date": d, "surface": "feed"}, ORACLE_SCHEMA)
    v1 = lake.write_partition(df, "oracle", {"date": d, "surface": "feed"}, ORACLE_SCHEMA)  # idempotent
    assert (v0, v1) == (0, 1) and lake.table_version("oracle") == 1
    assert lake.read_partition("oracle", d, "feed").sort("request_id").equals(df)
    assert lake.optimize_and_vacuum("oracle")["version"] >= 1
    assert any(k.startswith("lake/oracle/date=2026-11-02/surface=feed/") for k in s3_env.keys("lake/oracle/"))


def test_store_errors_do_not_carry_the_secret(s3_env):
    """Failures that end up in Dagster's logs (missing bucket, missing table) name the place, not the key."""
    from s3_server import SECRET

    so = storage_options()
    failures = [
        lambda: pl.DataFrame({"x": [1]}).write_delta("s3://no-such-bucket/lake/t", storage_options=so),
        lambda: pl.scan_delta(f"{s3_env.lake_uri}/missing", storage_options=so).collect(),
        lambda: lake.read_partition("events", dt.date(2026, 11, 2)),
    ]
    for fail in failures:
        with pytest.raises(Exception) as err:
            fail()
        assert SECRET not in repr(err.value) and SECRET not in str(err.getrepr(showlocals=False))
