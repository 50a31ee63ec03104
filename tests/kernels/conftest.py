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
