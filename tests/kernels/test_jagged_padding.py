"""jagged_to_padded / padded_to_jagged: layout, truncation, round trip and gradients."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import make_offsets

from kernels import jagged_to_padded, padded_to_jagged


def test_jagged_to_padded_layout_and_pad_value():
    values = torch.arange(6, dtype=torch.float32)[:, None].repeat(1, 2)  # [6, 2]
    offsets = make_offsets([2, 0, 4], torch.int32)
    padded = jagged_to_padded(values, offsets, max_len=3, pad_value=-1.0)
    assert padded.shape == (3, 3, 2)
    assert padded[0, :, 0].tolist() == [0, 1, -1]
    assert padded[1, :, 0].tolist() == [-1, -1, -1]
    assert padded[2, :, 0].tolist() == [2, 3, 4]  # truncated: row 5 dropped


@settings(max_examples=12, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(0, 9), min_size=0, max_size=5), extra=st.integers(0, 3))
def test_round_trip(lengths, extra):
    offsets = make_offsets(lengths)
    values = torch.randn(int(offsets[-1]), 3, 2)
    max_len = max(lengths, default=0) + extra
    padded = jagged_to_padded(values, offsets, max_len)
    assert padded.shape == (len(lengths), max_len, 3, 2)
    torch.testing.assert_close(padded_to_jagged(padded, offsets), values)
    # Padding positions hold the pad value.
    mask = torch.arange(max_len)[None, :] < torch.tensor(lengths, dtype=torch.long).reshape(-1, 1)
    assert (padded[~mask] == 0).all()


def test_gradcheck_float64():
    offsets = make_offsets([2, 0, 5, 1])
    values = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x: jagged_to_padded(x, offsets, 4, pad_value=1.5), (values,), fast_mode=True
    )
    padded = torch.randn(4, 5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: padded_to_jagged(x, offsets), (padded,), fast_mode=True)


def test_gradients_of_truncated_rows_are_zero():
    offsets = make_offsets([4])
    values = torch.randn(4, 2, requires_grad=True)
    jagged_to_padded(values, offsets, 2).sum().backward()
    assert values.grad[:2].eq(1).all() and values.grad[2:].eq(0).all()


def test_empty_inputs_are_differentiable():
    values = torch.zeros(0, 4, requires_grad=True)
    padded = jagged_to_padded(values, make_offsets([0, 0]), 3)
    assert padded.shape == (2, 3, 4)
    padded.sum().backward()
    assert values.grad.shape == (0, 4)


def test_padding_errors():
    values = torch.randn(5, 2)
    with pytest.raises(ValueError, match="offsets\\[-1\\]"):
        jagged_to_padded(values, make_offsets([2, 2]), 3)
    with pytest.raises(ValueError, match="int32 or int64"):
        jagged_to_padded(values, torch.tensor([0.0, 5.0]), 3)
    with pytest.raises(ValueError, match="does not fit"):
        padded_to_jagged(torch.randn(1, 3, 2), make_offsets([5]))
    with pytest.raises(ValueError, match="batch"):
        padded_to_jagged(torch.randn(2, 5, 2), make_offsets([5]))
