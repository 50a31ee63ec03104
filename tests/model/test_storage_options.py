"""gem_model/store/object_store.py: credentials only from the environment, Delta's S3 commit protocol set once."""

from __future__ import annotations

import pytest

from gem_model.store.object_store import S3_COMMIT_OPTIONS, ObjectStoreConfigError
from gem_model.store.paths import storage_options


@pytest.fixture
def clean_env(monkeypatch, gem_home):
    import os

    for k in list(os.environ):
        if k.startswith(("AWS_", "AZURE_", "GOOGLE_")):
            monkeypatch.delenv(k)
    return monkeypatch


def test_local_lake_without_object_store_env_has_no_options(clean_env):
    assert storage_options() is None


def test_s3_lake_takes_credentials_from_env_and_the_commit_protocol(clean_env):
    clean_env.setenv("GEM_LAKE_URI", "s3://bucket/lake")
    clean_env.setenv("AWS_ACCESS_KEY_ID", "AKIA1")
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", "sec")
    clean_env.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    clean_env.setenv("AWS_REGION", "")  # empty variables are not options
    opts = storage_options()
    assert opts == {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "sec",
                    "AWS_ENDPOINT_URL": "http://127.0.0.1:9", **S3_COMMIT_OPTIONS}
    # a table URI under another scheme gets the credentials but not the S3 commit settings
    assert storage_options("gs://bucket/lake/events") == {k: v for k, v in opts.items() if k.startswith("AWS_")}


def test_dynamodb_locking_provider_is_refused_with_a_reason(clean_env):
    clean_env.setenv("GEM_LAKE_URI", "s3://bucket/lake")
    clean_env.setenv("AWS_S3_LOCKING_PROVIDER", "dynamodb")
    with pytest.raises(ObjectStoreConfigError, match="conditional writes"):
        storage_options()


def test_credentials_in_the_lake_uri_are_refused_without_echoing_them(clean_env):
    clean_env.setenv("GEM_LAKE_URI", "s3://AKIA1:topsecret@bucket/lake")
    with pytest.raises(ObjectStoreConfigError) as err:
        storage_options()
    assert "topsecret" not in str(err.value)
