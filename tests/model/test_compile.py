"""torch.compile traces the whole training step (forward, loss, backward) without a graph break:
`kernels.jagged_attention` is a custom op with a fake implementation and registered autograd, and
`max_len` comes from the batch (no `.item()` in the model). The CUDA side is in test_cuda.py."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from gem_model.models import GEM
from tests.model.helpers import make_batch, tiny_model_config

pytestmark = pytest.mark.timeout(300)

LENGTHS = [3, 0, 7, 16, 1, 5]


def _loss(model: GEM, batch) -> torch.Tensor:
    loss, _ = model.loss(model(batch), batch)
    return loss


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = tiny_model_config()
    return GEM(cfg), make_batch(cfg, LENGTHS)


def test_batch_carries_max_len(tiny):
    _, batch = tiny
    assert batch.max_len == max(LENGTHS)
    assert batch.to("cpu").max_len == max(LENGTHS)


def test_forward_and_loss_have_no_graph_break(tiny):
    model, batch = tiny
    torch._dynamo.reset()
    explain = torch._dynamo.explain(_loss)(copy.deepcopy(model), batch)
    assert explain.graph_break_count == 0, [r.reason for r in explain.break_reasons]
    assert explain.graph_count == 1


def test_compiled_forward_backward_equals_eager(tiny):
    model, batch = tiny
    eager, compiled = copy.deepcopy(model), copy.deepcopy(model)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")  # AOT autograd: traces the backward graph too
    step = torch.compile(_loss, backend=counter, fullgraph=True)  # fullgraph: a graph break raises

    ref = _loss(eager, batch)
    ref.backward()
    got = step(compiled, batch)
    got.backward()
    assert counter.frame_count == 1
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
