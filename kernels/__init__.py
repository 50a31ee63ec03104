"""Jagged-sequence kernels (imports only torch and triton).

Public API:

* :func:`jagged_attention` ``(q, k, v, offsets, *, causal=False, scale=None)``: softmax
  attention inside each sequence of a jagged batch (Triton on CUDA, PyTorch elsewhere;
  ``GEM_KERNEL_BACKEND=torch|triton`` forces one);
* :func:`jagged_to_padded` ``(values, offsets, max_len, pad_value=0.0)`` and
  :func:`padded_to_jagged` ``(padded, offsets)``: layout conversions;
* :func:`backend_for` ``(tensor)``: which backend ``jagged_attention`` would use.

Set ``TRITON_INTERPRET=1`` *before* importing this package to run the Triton kernels on CPU.
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
