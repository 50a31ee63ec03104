"""Storage options for the lake: credentials only from the environment, Delta's S3 commit protocol in one place.

How delta-rs 1.6 commits on S3: version N of a table is the object `_delta_log/<N>.json`, written with a
conditional PUT (`If-None-Match: *`, object_store's `conditional_put`). Of two writers racing for one
version exactly one wins; the loser re-reads the log, checks for conflicts and retries at N+1 (an append)
or fails with CommitFailedError (an overwrite of the same partition), so no commit is ever lost. Amazon S3
has conditional writes since 2024, and so do MinIO, Cloudflare R2 and moto 5.2 (the tests' server): one
configuration for all of them. delta-rs 1.x removed the DynamoDB locking provider
(`AWS_S3_LOCKING_PROVIDER=dynamodb` only logs an error there, see delta-io/delta-rs discussion 4482), and
`AWS_S3_ALLOW_UNSAFE_RENAME` no longer changes how commits are made; a store without conditional writes
cannot take Delta commits from delta-rs 1.6 at all (`conditional_put: disabled` fails every commit).

The options are never logged and never part of Dagster config or metadata: call sites pass them straight
to deltalake / polars.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

_URI_RE = re.compile(r"^[a-z][a-z0-9+.-]*://")

# Environment prefixes deltalake and polars read credentials and endpoints from, per URI scheme: a store gets
# only its own provider's variables (AWS keys never travel to a gs:// request, nor to a local lake).
S3_SCHEMES = ("s3", "s3a")
SCHEME_PREFIXES: dict[str, str] = {
    **dict.fromkeys(S3_SCHEMES, "AWS_"),
    **dict.fromkeys(("az", "abfs", "abfss", "adl", "azure"), "AZURE_"),
    **dict.fromkeys(("gs", "gcs"), "GOOGLE_"),
}
# The S3 commit protocol (see the module docstring): put-if-absent on the log, etag-matched updates.
S3_COMMIT_OPTIONS = {"conditional_put": "etag"}


class ObjectStoreConfigError(ValueError):
    """The lake URI or the environment asks for something delta-rs 1.6 cannot do safely."""


def is_uri(location: str) -> bool:
    return bool(_URI_RE.match(location)) and not location.startswith("file://")


# Azure's URIs name the container before an @ (abfss://<container>@<account>.dfs.core.windows.net/...): no secret
_AT_IS_CONTAINER = ("abfs", "abfss")


def check_lake_uri(uri: str) -> str:
    """Refuse credentials inside the URI (s3://key:secret@bucket): they would end up in logs and metadata."""
    parts = urlsplit(uri)
    if is_uri(uri) and "@" in parts.netloc and (parts.password is not None or parts.scheme not in _AT_IS_CONTAINER):
        raise ObjectStoreConfigError(
            "the lake URI must not carry credentials (user:secret@...); set them in the environment (AWS_* etc.)"
        )
    return uri


def resolve_storage_options(uri: str) -> dict[str, str] | None:
    """deltalake / polars `storage_options` for `uri`: only its provider's variables (SCHEME_PREFIXES); None for a
    local lake or a scheme without variables set."""
    uri = check_lake_uri(uri)
    scheme = urlsplit(uri).scheme if is_uri(uri) else ""
    prefix = SCHEME_PREFIXES.get(scheme)
    opts = {k: v for k, v in os.environ.items() if prefix and k.startswith(prefix) and v}
    if scheme in S3_SCHEMES:
        if opts.get("AWS_S3_LOCKING_PROVIDER", "").lower() == "dynamodb":
            raise ObjectStoreConfigError(
                "AWS_S3_LOCKING_PROVIDER=dynamodb: delta-rs 1.6 no longer has a DynamoDB lock and would ignore it; "
                "it commits with S3 conditional writes (If-None-Match). Unset the variable."
            )
        opts.update(S3_COMMIT_OPTIONS)
    return opts or None
