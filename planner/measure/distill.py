"""`plan measure --teacher`: a real distillation step under PyTorch's MemTracker, beside the
prediction (the student's own model, planner.memory.model, plus planner.memory.distill's terms).

The step is written here, fresh, in the order of torchtune's knowledge-distillation recipes
(``_loss_step``): the student's forward with its own loss (transformers' model with labels,
under autocast for bf16-mixed as planner.measure.trackers runs it), the teacher's forward
under ``torch.no_grad()`` (its weights frozen, in its own 16-bit dtype), the forward KL on the
logits as torchtune's ForwardKLLoss / ForwardKLWithChunkedOutputLoss compute it, a
hidden-state MSE on N layer pairs (the teacher's states captured by forward hooks, the
student's projected to the teacher's width by a trained linear map where they differ), the
backward of their sum, the optimizer step and ``zero_grad(set_to_none=True)``. Two steps run;
the tracker's peak is read as planner.measure.readout reads it. The teacher is replicated
(one process, no process group): the measured row checks the terms the teacher adds on any
layout, which sharding only divides.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

from planner.layouts.layout import Layout
from planner.measure.readout import MeasuredMemory, make_tracker, tracker_result
from planner.models.spec import ModelSpec
from planner.training.posttrain import KD_CHUNKS, DistillSetup
from planner.training.setup import TrainingSetup


def forward_kl(student_logits: Any, teacher_logits: Any, labels: Any, chunks: int = 1) -> Any:
    """Forward KL(teacher || student) per token, averaged over the tokens (the teacher's fp32
    probabilities times the student's fp32 log-probabilities, -inf logits masked), over
    ``chunks`` slices of the sequence one at a time."""
    import torch

    total = student_logits.new_zeros((), dtype=torch.float32)
    n = labels.numel()
    for s, t in zip(student_logits.chunk(chunks, dim=1), teacher_logits.chunk(chunks, dim=1)):
        t_prob = torch.softmax(t, dim=-1, dtype=torch.float32)
        inf = torch.isinf(s)
        s_logp = torch.log_softmax(s, dim=-1, dtype=torch.float32)
        total = total + torch.masked_fill(t_prob * s_logp, inf, 0).sum()
    return -total / n


def _layers(model: Any) -> Any:
    return model.model.layers


def _pairs(n_student: int, n_teacher: int, n: int) -> list[tuple[int, int]]:
    """N layer pairs spread evenly over both depths (the last layer of each span)."""
    return [((i + 1) * n_student // n - 1, (i + 1) * n_teacher // n - 1) for i in range(n)]


@dataclass(frozen=True, kw_only=True, slots=True)
class DistillComparison:
    """The measured step beside the prediction, bytes."""

    predicted_student_bytes: int       # the student's own step, tracked (no overhead)
    predicted_extra_bytes: int         # memory.distill's terms at their larger moment
    measured_bytes: int                # the tracker's peak of the distillation step
    measured_student_bytes: int        # the tracker's peak of the student's own step, alone
    terms: dict[str, int | str]
    measured: MeasuredMemory

    @property
    def predicted_bytes(self) -> int:
        return self.predicted_student_bytes + self.predicted_extra_bytes

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return self.predicted_bytes / self.measured_bytes - 1

    @property
    def extra_error(self) -> float:
        """The teacher's terms against what the teacher added to the measured peak."""
        added = self.measured_bytes - self.measured_student_bytes
        return self.predicted_extra_bytes / added - 1 if added else 0.0


def measure_distill(student_cfg: dict[str, Any], teacher_cfg: dict[str, Any], d: DistillSetup, micro_batch: int,
                    seq_len: int, precision: str = "bf16-mixed", fake: bool = True) -> MeasuredMemory:
    """Run two distillation steps under MemTracker on the CPU (module docstring)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from planner.measure.build import build_model, build_optimizer
    from planner.measure.fakes import stub_scalars
    from planner.measure.trackers import MeasureSetup

    device = torch.device("cpu")
    s_setup = MeasureSetup(hf_config=student_cfg, micro_batch=micro_batch, seq_len=seq_len, precision=precision,
                           fake=fake)
    t_setup = dataclasses.replace(s_setup, hf_config=teacher_cfg,
                                  precision="fp32" if d.teacher_weight_bytes == 4 else "bf16")
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with mode:
        student = build_model(s_setup, device)
        teacher = build_model(t_setup, device)
        teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        pairs = _pairs(student.config.num_hidden_layers, teacher.config.num_hidden_layers, d.kd_hidden_layers)
        h_s, h_t = student.config.hidden_size, teacher.config.hidden_size
        if pairs and h_s != h_t:
            student.kd_projections = torch.nn.ModuleList(
                torch.nn.Linear(h_s, h_t, bias=False, device=device, dtype=next(student.parameters()).dtype)
                for _ in pairs)
        optimizer = build_optimizer(student, s_setup)
        ids = torch.randint(0, student.config.vocab_size, (micro_batch, seq_len), device=device)
        states: dict[str, Any] = {}

        def keep(name: str) -> Any:
            def hook(_m: Any, _inp: Any, out: Any) -> None:
                states[name] = out[0] if isinstance(out, tuple) else out
            return hook

        handles = []
        for i, (si, ti) in enumerate(pairs):
            handles.append(_layers(student)[si].register_forward_hook(keep(f"s{i}")))
            handles.append(_layers(teacher)[ti].register_forward_hook(keep(f"t{i}")))
        tracker = make_tracker(student, optimizer, ids, sharded=False)
        tracker.track_external(teacher)
        autocast: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if precision == "bf16-mixed":
            autocast = torch.autocast("cpu", dtype=torch.bfloat16)
        chunks = KD_CHUNKS if d.kd_loss == "chunked" else 1
        with tracker:
            for step in range(2):
                tracker.step = step + 1
                if step:
                    tracker.reset_mod_stats()
                with autocast:
                    out = student(input_ids=ids, labels=ids)
                    with torch.no_grad():
                        t_logits = teacher(input_ids=ids).logits
                    loss = out.loss + forward_kl(out.logits, t_logits, ids, chunks)
                    for i in range(len(pairs)):
                        s_h = states.pop(f"s{i}")
                        if hasattr(student, "kd_projections"):
                            s_h = student.kd_projections[i](s_h)
                        loss = loss + torch.nn.functional.mse_loss(s_h.float(), states.pop(f"t{i}").float())
                del out, t_logits
                loss.backward()
                del loss
                with stub_scalars() if fake else contextlib.nullcontext():
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        snapshots = tracker.get_tracker_snapshot("peak")
        for h in handles:
            h.remove()
        n_params = sum(p.numel() for p in student.parameters())
    return tracker_result(tracker, snapshots, device, fake=fake, n_params=n_params, rank=0, wall_s=0.0)


def compare_distill(student: ModelSpec, teacher: ModelSpec, student_cfg: dict[str, Any], teacher_cfg: dict[str, Any],
                    setup: TrainingSetup, d: DistillSetup, lay: Layout, fake: bool = True) -> DistillComparison:
    """Predict and measure one distillation step on one process (dp = tp = pp = 1)."""
    from planner.measure import accuracy
    from planner.memory.distill import distill_memory
    from planner.memory.model import per_rank_memory

    lay = accuracy.measured_layout(lay)
    ms = accuracy.measured_setup(setup, lay)
    student_pred = per_rank_memory(student, ms, lay).breakdown.tracked
    extra = distill_memory(student, teacher, ms, d, lay, "replicated")
    got = measure_distill(student_cfg, teacher_cfg, d, lay.micro_batch, lay.seq_len, setup.precision, fake)
    alone = accuracy.compare(student, student_cfg, setup, lay, fake=fake, in_process=True)
    return DistillComparison(predicted_student_bytes=student_pred, predicted_extra_bytes=extra.extra,
                             measured_bytes=got.peak_bytes, measured_student_bytes=alone.measured["peak_bytes"],
                             terms=extra.as_dict(), measured=got)
