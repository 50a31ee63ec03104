"""Make `import kernels` resolve to the project package, not to this test directory.

pytest (rootdir import mode) puts ``tests/`` on ``sys.path`` for ``tests/conftest.py``; since
``tests/kernels/`` has no ``__init__.py`` it is then importable as a *namespace* package named
``kernels``, which wins over the editable install's finder when ``pytest`` is run as a script
(``python -m pytest`` adds the repo root and is unaffected).  Putting the repo root on ``sys.path``
makes the regular package win; a namespace shadow imported earlier is dropped.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
if "kernels" in sys.modules and getattr(sys.modules["kernels"], "__file__", None) is None:
    for _name in [n for n in sys.modules if n == "kernels" or n.startswith("kernels.")]:
        del sys.modules[_name]

import os  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# On CUDA the kernel tests' many shapes would each be autotuned (minutes of compiling and timing):
# heuristic configs here; test_jagged_attention_triton.py's autotuned test turns it back on.
os.environ.setdefault("GEM_KERNEL_AUTOTUNE", "0")


@pytest.fixture(autouse=True)
def _single_thread_torch():
    """The kernel tests use tiny tensors: intra-op threads only add overhead (and stall badly
    on a loaded 2-core machine), so run each test single-threaded and restore afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
