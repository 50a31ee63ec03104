"""Loaded at interpreter start (this folder is put first on PYTHONPATH by `bench/gpu_check.sh --dry-run`):
make polars, deltalake, pyarrow, pydantic and dagster unimportable, as on the GPU machine, so the CPU
dry run proves the GPU check needs none of them."""

import sys

BLOCKED = ("polars", "deltalake", "pyarrow", "pydantic", "dagster")


class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: the GPU machine does not have it)")
        return None


sys.meta_path.insert(0, _Block())
