"""Memory and time read one rule for the optimizer's state bytes per parameter
(planner.memory.params.optimizer_state_bytes).

The bug this guards (issue 31): the memory model counted Adafactor's factored moment from the
model's shapes and honoured TrainingSetup.optimizer_state_bytes, while the step time's
optimizer update read Adafactor as 0 bytes and ignored the override.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.layouts.layout import Layout
from planner.memory.model import per_rank_memory
from planner.models.spec import load_model
from planner.timing.model import optimizer_update_bytes_per_param
from planner.training.setup import OPTIMIZERS, TrainingSetup

LAY = Layout(dp=8, zero_stage=1, seq_len=1024, grad_accum=8)


def _memory_state_bytes(m, setup: TrainingSetup) -> float:
    """The optimizer bytes per parameter the memory model sized the rank with (its own terms)."""
    return per_rank_memory(m, setup, LAY).terms.view(setup).optimizer_bytes_per_param


@pytest.mark.parametrize("setup", [TrainingSetup(seq_len=1024, global_batch=64, optimizer=o) for o in OPTIMIZERS]
                         + [TrainingSetup(seq_len=1024, global_batch=64, optimizer_state_bytes=4.0),
                            TrainingSetup(seq_len=1024, global_batch=64, optimizer="adafactor",
                                          optimizer_state_bytes=2.0)],
                         ids=lambda s: f"{s.optimizer}-{s.optimizer_state_bytes}")
def test_the_update_reads_and_writes_the_states_memory_holds(setup: TrainingSetup) -> None:
    # the update reads and writes every state byte once (timing.dp.optimizer_update_bytes_per_param):
    # against AdamW's 8 fp32 bytes (Kingma & Ba 2015) the difference is twice the states' difference
    m = load_model("llama3.1-8b")
    base = replace(setup, optimizer="adamw", optimizer_state_bytes=None)
    assert _memory_state_bytes(m, base) == 8.0
    mem_diff = _memory_state_bytes(m, setup) - _memory_state_bytes(m, base)
    time_diff = optimizer_update_bytes_per_param(m, setup) - optimizer_update_bytes_per_param(m, base)
    assert time_diff == pytest.approx(2 * mem_diff, rel=1e-12, abs=1e-12)
    if setup.optimizer_state_bytes is not None:
        assert _memory_state_bytes(m, setup) == setup.optimizer_state_bytes
    elif setup.optimizer == "adafactor":
        assert 0 < _memory_state_bytes(m, setup) < 0.01     # a row and a column per matrix
