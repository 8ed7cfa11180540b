"""The planner against PyTorch's memory trackers on real transformers models.

Each case runs two real training steps under FakeTensorMode with a fake process group
(planner/measure.py) and fails when the predicted per-rank total (less the overhead no
tracker sees) drifts out of +-10% of the tracker's peak. The full grid is
bench/accuracy.py -> docs/accuracy.md.
"""

import pytest
from conftest import require

require("torch")
require("transformers")

from planner.errors import UserError  # noqa: E402
from planner.layouts.layout import Layout  # noqa: E402
from planner.measure import accuracy  # noqa: E402
from planner.models.spec import load_hf_config, load_model  # noqa: E402
from planner.training.setup import TrainingSetup  # noqa: E402

CASES = [
    # model, dp, zero, precision, seq, micro-batch, recompute
    ("qwen2.5-0.5b", 8, 3, "bf16-mixed", 1024, 1, "none"),
    ("qwen2.5-0.5b", 64, 2, "bf16-mixed", 2048, 2, "full"),
    ("gpt2", 1, 0, "fp32", 512, 2, "none"),
    ("llama3.1-8b", 8, 3, "bf16-mixed", 1024, 1, "none"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_total_within_ten_percent(case):
    name, dp, zero, precision, seq, mb, rc = case
    setup = TrainingSetup(seq_len=seq, global_batch=mb * dp, precision=precision)
    lay = Layout(dp=dp, zero_stage=zero, micro_batch=mb, grad_accum=1, seq_len=seq, recompute=rc)
    cmp = accuracy.compare(load_model(name), load_hf_config(name), setup, lay)
    assert abs(cmp.total_error) <= 0.10, [(r.category, r.predicted_bytes, r.measured_bytes) for r in cmp.rows]


@pytest.mark.parametrize("kw, needle", [
    ({"tp": 2}, "--tp 2 cannot be measured"),
    ({"pp": 2}, "--pp 2 cannot be measured"),
    ({"zero_stage": 1, "dp": 8}, "ZeRO-1 has no FSDP2 equivalent"),
    ({"recompute": "selective"}, "selective cannot be measured"),
])
def test_unmeasurable_layouts_say_why(kw, needle):
    m = load_model("llama3.1-8b")
    with pytest.raises(UserError, match=needle):
        accuracy.measurable(m, TrainingSetup(), Layout(**kw))


FAMILY_CONFIGS = __import__("pathlib").Path(__file__).resolve().parent.parent / "bench" / "configs"


@pytest.mark.parametrize("name, dp, zero", [
    pytest.param("tiny-phi3", 1, 0, marks=pytest.mark.slow),
    ("tiny-qwen3", 1, 0),     # its QK norms' saved tensors (memory.attention.qk_norm_saved_bytes); the fast tier's
])                            # measurement under PyTorch's tracker (about a second)
def test_new_family_tiny_rows_within_ten_percent(name, dp, zero):
    """docs/accuracy.md's tiny rows of the 2025-2026 families (bench/accuracy.py), in process."""
    path = str(FAMILY_CONFIGS / f"{name}.json")
    setup = TrainingSetup(seq_len=512, global_batch=2 * dp, precision="bf16-mixed")
    lay = Layout(dp=dp, zero_stage=zero, micro_batch=2, grad_accum=1, seq_len=512, recompute="none")
    cmp = accuracy.compare(load_model(path), load_hf_config(path), setup, lay, in_process=True)
    assert abs(cmp.total_error) <= 0.10, [(r.category, r.predicted_bytes, r.measured_bytes) for r in cmp.rows]
