"""The n-gram hash never waits for the device it runs on. It is run here on torch's meta device, where
reading any value back (.item(), int(), bool(), .cpu(), .tolist()) raises: a whole step (dead positions,
Qwen EOS barriers, the range check of the token ids, the state for the next step) must go through, so on a
GPU it neither syncs nor breaks a CUDA graph capture."""

from __future__ import annotations

import pytest
import torch

from engram.apps.presets import get_preset


@pytest.mark.parametrize("preset", ["deepseek-v4.1-flash", "qwen4-exp-ple"])
def test_a_step_and_the_next_hash_without_reading_a_device_value(preset: str) -> None:
    spec = get_preset(preset)
    hasher = spec.hasher()
    tokens = 37
    ids = torch.empty(tokens, dtype=torch.int64, device="meta")
    dead = torch.empty(tokens, dtype=torch.bool, device="meta")
    state = hasher.new_state("meta")
    rows, state = hasher.hash_with_state(ids, dead, state)
    rows, state = hasher.hash_with_state(ids[:1], None, state)  # a decode step carries the state on
    assert rows.device.type == "meta" and tuple(rows.shape) == (1, len(spec.layout.layer_ids), spec.layout.columns)
    assert state.history.device.type == "meta" and tuple(state.history.shape) == (hasher.context,)
    assert state.readable.device.type == "meta" and state.readable.dim() == 0


def test_a_fresh_state_lives_where_it_is_asked_to() -> None:
    hasher = get_preset("deepseek-v4.1-flash").hasher()
    state = hasher.new_state()
    assert state.history.tolist() == [hasher.fill_id] * hasher.context and int(state.readable) == 0
    assert hasher.new_state("meta").readable.device.type == "meta"
