"""An S3-compatible server on 127.0.0.1 (moto's server mode) and the environment that points the lake at it.

Credentials reach the code under test only through the environment, as in production; the secret is a
distinctive string so tests can prove it never lands in logs, metadata or files.

The server runs in a child process, never as a thread of the test process: several deltalake 1.6 calls
(`DeltaTable.history`, `is_deltatable`, the `DeltaStorageHandler` file system) do their HTTP requests while
holding the GIL, so a server thread in the same interpreter can never answer them and each one hangs until
object_store's retries give up ("operation timed out"). A real S3 is always another process.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

BUCKET = "gem-lake"
SECRET = "s3cr3t-must-never-be-logged-7f3a"
ACCESS_KEY = "AKIAGEMTESTKEY000001"


@dataclass(frozen=True)
class S3Endpoint:
    endpoint: str
    bucket: str

    @property
    def lake_uri(self) -> str:
        return f"s3://{self.bucket}/lake"

    def env(self) -> dict[str, str]:
        """AWS_* variables for deltalake/polars, nothing that could reach beyond 127.0.0.1."""
        return {
            "GEM_LAKE_URI": self.lake_uri,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",  # never ask an instance-metadata service for credentials
        }

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET, region_name="us-east-1")

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


# The child: moto's threaded server on a free loopback port; prints the port, stops when stdin closes, so
# a test process that dies takes its server with it. moto 5.2 checks `If-None-Match: *` and then stores the
# key in two steps, so two threads racing for one Delta log version could both win (CI lost a commit that
# way); S3 makes the pair atomic, and one lock around moto's PUT does here.
_SERVE = """
import functools, logging, sys, threading
from moto.s3.responses import S3Response
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
_put, _lock = S3Response.put_object, threading.Lock()
@functools.wraps(_put)
def put_object(self, *args, **kwargs):
    with _lock:
        return _put(self, *args, **kwargs)
S3Response.put_object = put_object
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""


@contextmanager
def moto_s3(bucket: str = BUCKET) -> Iterator[S3Endpoint]:
    """Start moto's server in a child process on 127.0.0.1, create `bucket`, stop it afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = proc.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"moto server did not start (exit code {proc.poll()})")
        s3 = S3Endpoint(f"http://127.0.0.1:{port}", bucket)
        s3.client().create_bucket(Bucket=bucket)
        yield s3
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
