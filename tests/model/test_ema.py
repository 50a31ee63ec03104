"""The weights' moving average (gem_model.train.ema): its ramp, its decay, and a swap that always gives back."""

from __future__ import annotations

import pytest
import torch

from gem_model.train.ema import WeightAverage


def test_average_is_bias_corrected_then_decays_at_the_configured_rate():
    model = torch.nn.Linear(3, 1)
    ema = WeightAverage(model, decay=0.9)
    for step in range(100):
        with torch.no_grad():
            model.weight.fill_(float(step))
        ema.update()
        # the bias-corrected average: step i weighs 0.9^(step - i), normalized
        w = torch.tensor([0.9 ** (step - i) for i in range(step + 1)], dtype=torch.float64)
        expected = float((w * torch.arange(step + 1, dtype=torch.float64)).sum() / w.sum())
        torch.testing.assert_close(ema.shadow[0], torch.full_like(ema.shadow[0], expected), rtol=1e-5, atol=1e-4)
    assert ema.rate() == pytest.approx(0.9, abs=1e-4)  # the horizon has reached 1 / (1 - decay) steps
    assert float(model.weight.detach()[0, 0]) == 99.0  # the live weights are untouched


def test_swap_gives_the_average_inside_and_the_live_weights_back_even_on_error():
    model = torch.nn.Linear(2, 1)
    ema = WeightAverage(model, decay=0.5)
    live = model.weight.detach().clone()
    with torch.no_grad():
        ema.shadow[0].fill_(7.0)
    with pytest.raises(RuntimeError, match="boom"), ema.swapped():
        assert bool((model.weight == 7.0).all())
        raise RuntimeError("boom")
    torch.testing.assert_close(model.weight.detach(), live)
    ema.copy_to_model()
    assert bool((model.weight == 7.0).all())


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5])
def test_a_decay_outside_zero_one_is_refused(decay):
    with pytest.raises(ValueError, match="ema_decay"):
        WeightAverage(torch.nn.Linear(2, 1), decay=decay)
