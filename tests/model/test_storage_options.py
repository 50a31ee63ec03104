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


def _all_providers(env: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AZURE_STORAGE_ACCOUNT_KEY", "GOOGLE_SERVICE_ACCOUNT"):
        env.setenv(name, "x")


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket/lake", {"AWS_ACCESS_KEY_ID": "x", **S3_COMMIT_OPTIONS}),
        ("s3a://bucket/lake", {"AWS_ACCESS_KEY_ID": "x", **S3_COMMIT_OPTIONS}),
        ("az://container/lake", {"AZURE_STORAGE_ACCOUNT_KEY": "x"}),
        ("abfs://container/lake", {"AZURE_STORAGE_ACCOUNT_KEY": "x"}),
        ("abfss://container/lake", {"AZURE_STORAGE_ACCOUNT_KEY": "x"}),
        ("adl://container/lake", {"AZURE_STORAGE_ACCOUNT_KEY": "x"}),
        ("gs://bucket/lake", {"GOOGLE_SERVICE_ACCOUNT": "x"}),
        ("gcs://bucket/lake", {"GOOGLE_SERVICE_ACCOUNT": "x"}),
    ],
)
def test_each_scheme_gets_only_its_providers_variables(clean_env, uri, expected):
    _all_providers(clean_env)
    assert storage_options(uri) == expected
    assert storage_options(uri + "/events") == expected


def test_local_lake_gets_no_credentials_even_when_set(clean_env, tmp_path):
    _all_providers(clean_env)
    assert storage_options() is None  # the default lake under GEM_HOME
    assert storage_options(str(tmp_path / "lake" / "events")) is None
    assert storage_options("file:///tmp/lake/events") is None


def test_dynamodb_locking_provider_is_refused_with_a_reason(clean_env):
    clean_env.setenv("GEM_LAKE_URI", "s3://bucket/lake")
    clean_env.setenv("AWS_S3_LOCKING_PROVIDER", "dynamodb")
    with pytest.raises(ObjectStoreConfigError, match="conditional writes"):
        storage_options()


def test_credentials_in_the_lake_uri_are_refused_without_echoing_them(clean_env):
    from gem_model.store.paths import lake_root
    from gem_pipelines.resources import LakeResource

    clean_env.setenv("GEM_LAKE_URI", "s3://AKIA1:topsecret@bucket/lake")
    # refused where the URI is first read (the demo prints it, training records it), not at the first table
    for read in (storage_options, lake_root, LakeResource().uri, LakeResource(root="gs://k:topsecret@b/lake").uri):
        with pytest.raises(ObjectStoreConfigError) as err:
            read()
        assert "topsecret" not in str(err.value)
    clean_env.setenv("GEM_LAKE_URI", "abfss://lake@account.dfs.core.windows.net/gem")  # Azure's container@account
    assert lake_root() == "abfss://lake@account.dfs.core.windows.net/gem"
    clean_env.setenv("GEM_LAKE_URI", "abfss://lake:topsecret@account.dfs.core.windows.net/gem")
    with pytest.raises(ObjectStoreConfigError):
        lake_root()
