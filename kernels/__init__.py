"""Jagged-sequence kernels (imports only torch and triton): attention inside each sequence of a jagged batch
(Triton on CUDA, PyTorch elsewhere) and jagged <-> padded conversions.  Set ``TRITON_INTERPRET=1`` *before*
importing this package to run the Triton kernels on CPU.
"""

from kernels.jagged_attention import SUPPORTED_HEAD_DIMS, backend_for, jagged_attention
from kernels.jagged_padding import jagged_to_padded, padded_to_jagged

__all__ = [
    "jagged_attention",
    "jagged_to_padded",
    "padded_to_jagged",
    "backend_for",
    "SUPPORTED_HEAD_DIMS",
]
