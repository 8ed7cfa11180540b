"""How long the written run trains and its learning-rate schedule: one answer for every stack.

The training length comes from ``--tokens``: optimizer steps = ceil(tokens / (global batch
x sequence length)), samples = steps x global batch. Without ``--tokens`` the files train a
first run of FIRST_RUN_STEPS steps, and say so, so that they launch as written.

The schedule is Llama 2's pretraining recipe (Touvron et al. 2023, arXiv:2307.09288,
Sec. 2.2): linear warmup over 2,000 steps, then cosine decay to 10% of the peak learning
rate at the last step. A run shorter than 20,000 steps warms up over its first 10% instead
(an assumption of the planner: 2,000 warmup steps would be most of a short run). The peak
learning rate is ``EmitOptions.lr``. Each stack gets these same numbers in its own words:

- Megatron-LM: ``--train-samples``, ``--lr``, ``--min-lr``, ``--lr-decay-style cosine``,
  ``--lr-warmup-samples``, ``--lr-decay-samples`` (megatron/training/arguments.py,
  _add_learning_rate_args: sample-based training takes sample-based warmup and decay);
- torchtitan 0.3.0: ``training.steps`` and ``LRSchedulersContainer.Config(warmup_steps,
  decay_type="cosine", min_lr_factor)`` (torchtitan/components/optimizer/lr_scheduler.py);
- DeepSpeed 0.19.8: the ``WarmupCosineLR`` scheduler (total_num_steps, warmup_num_steps,
  cos_min_ratio; deepspeed/runtime/lr_schedules.py); the written train.py stops after
  ``steps`` optimizer steps;
- Hugging Face + accelerate: the written train.py with transformers'
  ``get_cosine_with_min_lr_schedule_with_warmup`` (min_lr_rate) over ``steps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.emit import EmitOptions, chosen
from planner.units import ceil_div

if TYPE_CHECKING:
    from planner.api import PlanResult

FIRST_RUN_STEPS = 1000          # without --tokens: a first run, said in every written file
WARMUP_STEPS = 2000             # Llama 2, Sec. 2.2
SHORT_RUN_WARMUP_FRACTION = 0.1  # assumed: a run under 20,000 steps warms up over its first 10%
MIN_LR_RATIO = 0.1              # Llama 2, Sec. 2.2: decay to 10% of the peak


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """The training length and learning-rate schedule of the written run."""

    steps: int                  # optimizer steps
    samples: int                # sequences: steps x global batch
    tokens: int                 # steps x global batch x sequence length (>= --tokens)
    warmup_steps: int
    peak_lr: float
    min_lr: float
    from_tokens: bool           # False: no --tokens, a first run of FIRST_RUN_STEPS

    @property
    def warmup_samples(self) -> int:
        return self.warmup_steps * (self.samples // self.steps)

    def describe(self) -> str:
        """One line for the written files' comments."""
        why = "from --tokens" if self.from_tokens else f"no --tokens: a first run of {FIRST_RUN_STEPS} steps"
        return (f"{self.steps:,} steps, {self.samples:,} sequences, {self.tokens:,} tokens ({why}); "
                f"lr {self.peak_lr!r} warmed up over {self.warmup_steps:,} steps, cosine decay to "
                f"{self.min_lr!r} (Llama 2 recipe)")


def training_schedule(r: PlanResult, opts: EmitOptions = EmitOptions()) -> Schedule:
    """The run's length from ``r.tokens`` (or FIRST_RUN_STEPS) and its schedule (module docstring)."""
    lay = chosen(r).layout
    tokens_per_step = lay.global_batch * lay.seq_len
    tokens = r.tokens
    steps = max(1, ceil_div(int(tokens), tokens_per_step)) if tokens else FIRST_RUN_STEPS
    # Megatron's OptimizerParamScheduler asserts warmup < decay steps: keep one step of decay
    warmup = min(WARMUP_STEPS, max(1, int(steps * SHORT_RUN_WARMUP_FRACTION)), steps - 1)
    return Schedule(steps=steps, samples=steps * lay.global_batch, tokens=steps * tokens_per_step,
                    warmup_steps=warmup, peak_lr=opts.lr, min_lr=float(f"{opts.lr * MIN_LR_RATIO:.6g}"),
                    from_tokens=bool(tokens))
