"""StepTime: the predicted time of one layout's optimizer step and what it is made of, as
timing.fast.step_time() reads it off a row of the batched model's named parts
(timing.parts.StepArrays)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.hardware.axes import AXES


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTime:
    """The predicted time of one optimizer step and what it is made of (seconds).

    compute_s: matmuls, attention and element-wise kernels of every micro-batch on the
    slowest stage; comm_s: the exposed (not overlapped) communication per axis; bubble_s:
    pipeline fill and drain, (p-1)/v micro-batch times (Narayanan et al. 2021, Sec. 2.2:
    the bubble fraction of 1F1B is (p-1)/m, of the interleaved schedule (p-1)/(v m));
    optimizer_s: the optimizer update.
    """

    compute_s: float
    comm_s: dict[str, float] = field(default_factory=dict)
    bubble_s: float
    optimizer_s: float
    micro_batch_s: float          # one micro-batch, forward and backward, on the slowest stage
    step_time_s: float
    tokens_per_step: int
    n_gpus: int
    model_flops: float
    hardware_flops: float
    peak_flops_per_s: float
    placement: tuple[str, ...] = AXES
    # under an FP8 recipe (training.fp8): the FP8 dense peak (NVFP4: FP4); mfu stays against peak_flops_per_s (BF16)
    fp8_peak_flops_per_s: float | None = None
    # Efficiency.step_time_factor already in step_time_s (plan --time-confidence plans at the
    # interval's upper end): step_time_s / step_time_factor is the model's own prediction
    step_time_factor: float = 1.0
    # the regime whose measured error bars apply (timing.intervals.regime_of; "": the default ones)
    regime: str = ""
    # the sustained MFU ceiling the step obeys (timing.efficiency.mfu_ceiling; None: none applies)
    mfu_ceiling: float | None = None

    @property
    def predicted_step_time_s(self) -> float:
        """The model's step time before any --time-confidence margin: what the error bars
        (timing.intervals) are centred on, since their residuals are of that prediction."""
        return self.step_time_s / self.step_time_factor

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def model_flops_per_s_per_gpu(self) -> float:
        return self.model_flops / self.step_time_s / self.n_gpus

    @property
    def hardware_flops_per_s_per_gpu(self) -> float:
        return self.hardware_flops / self.step_time_s / self.n_gpus

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation (Chowdhery et al. 2022, PaLM, App. B)."""
        return self.model_flops_per_s_per_gpu / self.peak_flops_per_s

    @property
    def mfu_fp8(self) -> float | None:
        """MFU against the low-precision dense peak (None without an FP8 or NVFP4 recipe): the
        same model FLOPs over the FP8 peak (twice the BF16 one on Hopper and Blackwell, gpus.toml),
        or under NVFP4 the FP4 peak (timing.fast.low_precision_peak)."""
        if self.fp8_peak_flops_per_s is None:
            return None
        return self.model_flops_per_s_per_gpu / self.fp8_peak_flops_per_s

    @property
    def hfu(self) -> float:
        return self.hardware_flops_per_s_per_gpu / self.peak_flops_per_s

    @property
    def at_mfu_ceiling(self) -> bool:
        """Whether the sustained MFU ceiling sets the step: its MFU before any --time-confidence
        margin is the ceiling (timing.terms.floored_s). Such a step is the model FLOPs at that rate
        on any layout, so a plan there costs the same GPU-hours at any GPU count."""
        return self.mfu_ceiling is not None and self.mfu * self.step_time_factor >= self.mfu_ceiling * (1 - 1e-9)

    def train_time_s(self, tokens: float) -> float:
        """Time to train on ``tokens`` tokens at this step time (Narayanan et al. Eq. 4)."""
        return tokens / self.tokens_per_s
