"""Measure one rank's memory by running a real training step of a transformers model in PyTorch.

The planner's formulas are estimates; this module is their referee. It builds the model from a
Hugging Face ``config.json`` dict with ``transformers``, runs ``n_steps`` full training steps
(forward with the model's own loss, backward, optimizer step, ``zero_grad(set_to_none=True)``)
and reads PyTorch's own memory trackers (``torch.distributed._tools.mem_tracker.MemTracker`` and
``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``), which attribute every tensor
storage to a category (parameters, gradients, optimizer state, activations, temporaries, ...).

By default (``fake=True``) the step runs under ``FakeTensorMode``: tensors carry shapes, dtypes
and devices but no data, so a 70B model costs a few hundred MiB of host memory, while the tracker
still sees every allocation. On a small model the fake result equals the real one to the byte.

What can be measured this way
-----------------------------
Data parallelism on one rank, with a fake process group (``torch.distributed`` backend
``"fake"``: collectives return at once and move no data) standing in for the other ranks:

- ``sharding="none"``: replicated weights, gradients and optimizer state (DDP / ZeRO-0). One
  replicated rank holds what a single device holds, so ``dp`` does not change the result. DDP's
  own gradient buckets are *not* included: DDP's C++ reducer needs real storage and does not run
  on fake tensors (``run_distributed_cuda`` on real GPUs wraps the model in DDP and does see them
  in ``max_allocated_bytes``).
- ``sharding="grad-op"``: FSDP2 ``fully_shard(reshard_after_forward=False)`` on each decoder
  block and on the root; weights, gradients and optimizer state sharded over ``dp``, and the
  all-gathered weights kept from forward until backward (ZeRO-2-like, FSDP's SHARD_GRAD_OP).
- ``sharding="full"``: FSDP2 ``fully_shard`` (ZeRO-3 / FULL_SHARD): weights are all-gathered
  block by block and freed again after each block's forward and backward.

What cannot be measured this way
--------------------------------
- Tensor parallelism and pipeline parallelism: ``transformers`` models are built whole, and
  nothing here splits their matrices across ranks (TP) or their layers across stages (PP, which
  also needs a schedule deciding how many micro-batches' activations each stage holds). Running
  the whole model would measure the wrong thing, so these layouts are left to the formulas.
- Context parallelism (sequence split across ranks inside attention) and expert parallelism
  (experts placed on different ranks, with all-to-all token routing) likewise need the model's
  code rewritten for the split; plain ``transformers`` models do not do it.
- Allocator effects (fragmentation, the caching allocator's reserved-but-unused memory, NCCL and
  CUDA context memory) exist only on a real GPU: see ``max_reserved_bytes`` on the CUDA path.

What each category holds
------------------------
The trackers label a storage when it is created, by who created it, and relabel a few later
(gradients, FSDP buffers). In the planner's terms (CATEGORIES maps the names):

- weights: "Parameter" (MemTracker: every module parameter, in its stored dtype: fp32 for "fp32"
  and "bf16-mixed", bf16 for "bf16"); "Sharded Param" (FSDP2: this rank's fp32/bf16 shard, dim 0
  padded to a multiple of dp) + "Unsharded Param" (FSDP2: the all-gathered full parameters of the
  groups now unsharded, in the compute dtype, i.e. bf16 under bf16-mixed; the root group's
  embedding, final norm and lm_head stay unsharded through forward and backward).
  NOT here: autocast's bf16 weight copies in replicated bf16-mixed. Autocast casts each Linear
  weight once per forward and the matmul saves the copy for backward, so they count as
  activations (2 bytes per Linear weight element, embedding and norms excluded).
- gradients: "Gradient" (param.grad, labelled by a hook as it is produced; before that it is a
  temporary); "Unsharded Grad" (FSDP2: a group's full-size gradients, compute dtype, until they
  are reduce-scattered) + "Sharded Grad" (this rank's shard, in reduce dtype fp32 under
  bf16-mixed). With zero_grad(set_to_none=True) they are 0 during forward.
- optimizer: "Optstate"/"OptState": every tensor in optimizer.state (AdamW exp_avg, exp_avg_sq
  in the params' dtype, plus a 4-byte step per parameter tensor; SGD momentum; Adafactor row and
  column statistics) AND every tensor allocated inside optimizer.step() (foreach=False: one
  parameter's transients at a time, e.g. AdamW's denominator). So at a peak inside the step this
  is the states plus the largest parameter's transients.
- activations: "Activation": every tensor created by an op in forward (not only those autograd
  saves) while it lives: saved inputs of each op, attention outputs/logsumexp (sdpa) or scores and
  probabilities (eager), the causal mask and RoPE tables if built, the logits, their fp32 copy in
  the loss, log-softmax, the loss itself; and, with recompute, the tensors rebuilt by the
  recompute in backward.
- temporaries: "Temp": every tensor created in backward outside a recompute: gradients of
  activations (the loss's fp32 logits gradient first), gradients of parameters until labelled
  "Gradient", FSDP2's cast/copy scratch in backward.
- buffers: "Buffer" (module buffers, e.g. RoPE inv_freq) + "All Gather" (FSDP2: the flat
  all-gather output before it is copied out into the unsharded parameters; a prefetched group's
  sits here) + "Reduce Scatter" (FSDP2: the flat reduce-scatter input, gradients cast to the
  reduce dtype).
- inputs: "Other" (MemTracker: tensors given to track_external, i.e. the token ids, which are
  also the labels) / "Inputs" (FSDPMemTracker.track_inputs).

The training loop drops the model's output (and with it the bf16 logits) before backward and
keeps only the loss, as torchtitan and the HF Trainer do.

Dropout runs as it does on a GPU (``_gpu_dropout_kernels``): a 1-byte mask per dropout, and,
under fake tensors, attention with dropout through the fused kernel. The CPU's own dropout
keeps a noise tensor of the input's dtype, and its scaled_dot_product_attention falls back to
the math kernel's s x s probabilities when dropout is on: tensors no GPU keeps (GPT-2 large,
fp32, 4 x 1024 tokens: 9.5 GiB over its 36 blocks).

Only this module imports torch and transformers, and only inside functions: importing
``planner.measure.trackers`` costs nothing.

Command line: ``python -m planner.measure.trackers '<MeasureSetup as JSON>'`` prints ``MeasuredMemory`` as
JSON, so a caller can measure in a fresh process whose peak no earlier run has touched.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import UserError
from planner.measure.build import (
    build_finetuned,
    build_model,
    build_optimizer,
    checkpoint_blocks,
    shard,
)
from planner.measure.cpu_matmul import float32_cpu_matmuls
from planner.measure.fakes import separate_dtensor_propagation, stub_scalars
from planner.measure.images import check_measurable, image_batch, is_vlm
from planner.measure.readout import MeasuredMemory, make_tracker, tracker_result

SHARDINGS = ("none", "grad-op", "full")
METHODS = ("full", "lora", "freeze")
PRECISIONS = ("fp32", "bf16-mixed", "bf16")
OPTIMIZERS = ("adamw", "sgd", "adafactor")
RECOMPUTES = ("none", "full")
ATTENTIONS = ("sdpa", "eager")




@dataclass(frozen=True, kw_only=True, slots=True)
class MeasureSetup:
    """One training step to measure, for one data-parallel rank.

    hf_config: a Hugging Face ``config.json`` as a dict (must hold ``model_type``).
    dp: data-parallel degree: the fake process group's world size when sharded. A replicated
        rank holds the same whatever dp is, so with sharding "none" dp changes nothing here.
    sharding: "none" (replicated, ZeRO-0), "grad-op" (FSDP2, reshard_after_forward=False,
        ZeRO-2-like), "full" (FSDP2 fully_shard, ZeRO-3).
    precision: "fp32"; "bf16-mixed" (fp32 params, bf16 compute: FSDP2
        MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) when sharded,
        torch.autocast(bf16) when not); "bf16" (pure bf16 params and optimizer state).
    optimizer: "adamw", "sgd" (momentum 0.9) or "adafactor" (torch.optim.Adafactor).
    recompute: "none" or "full" (checkpoint every decoder block, use_reentrant=False).
    attention: "sdpa" or "eager" (the model's attention implementation).
    fake: run under FakeTensorMode (no data, any size); False runs real tensors, on the
        current CUDA device when there is one, else on the CPU.
    n_steps: training steps run under the tracker; the peak is over all of them, so with the
        default 2 the optimizer state exists for the whole of the second step. (The first step
        creates AdamW's states lazily inside its optimizer step.)
    method: "full"; "lora" (peft.get_peft_model with LoraConfig(r=lora_rank,
        lora_alpha=lora_alpha, target_modules=lora_targets or PEFT's default,
        lora_dropout=lora_dropout) over a base built in 16 bits, or fp32 for "fp32"; PEFT keeps
        the adapters in fp32); "freeze" (the base in 16 bits, only the last ``trainable_layers``
        blocks train, upcast to fp32 as LLaMA-Factory's freeze tuning does).
    """

    hf_config: dict[str, Any]
    dp: int = 1
    sharding: str = "none"
    micro_batch: int = 1
    seq_len: int = 1024
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    recompute: str = "none"
    attention: str = "sdpa"
    fake: bool = True
    n_steps: int = 2
    method: str = "full"
    lora_rank: int = 8
    lora_alpha: int = 8
    lora_targets: list[str] | None = None
    lora_dropout: float = 0.0
    trainable_layers: int = 2
    # FSDP2 only: micro-batches run before the step's last one with
    # set_requires_gradient_sync(False) (what torch.distributed.pipelining's schedules do for
    # every backward, stage.py backward_maybe_with_nosync): their unsharded gradients accumulate
    no_sync_micro_batches: int = 0
    # a vision-language model (planner.measure.images): images in each sequence, image side frozen
    images_per_sample: int = 0
    freeze_vision: bool = True

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("method", self.method, METHODS),
            ("sharding", self.sharding, SHARDINGS),
            ("precision", self.precision, PRECISIONS),
            ("optimizer", self.optimizer, OPTIMIZERS),
            ("recompute", self.recompute, RECOMPUTES),
            ("attention", self.attention, ATTENTIONS),
        ):
            if value not in allowed:
                raise UserError(f"measure: unknown {name} {value!r}; choose one of {', '.join(allowed)}")
        for name, count in (("dp", self.dp), ("micro_batch", self.micro_batch),
                            ("seq_len", self.seq_len), ("n_steps", self.n_steps)):
            if not isinstance(count, int) or count < 1:
                raise UserError(f"measure: {name} must be a positive integer, got {count!r}")
        if not isinstance(self.hf_config, Mapping) or "model_type" not in self.hf_config:
            raise UserError("measure: hf_config must be a config.json dict with a 'model_type' key")
        if self.no_sync_micro_batches and not self.sharded:
            raise UserError("measure: no_sync_micro_batches needs FSDP2 (sharding grad-op or full)")
        if is_vlm(dict(self.hf_config)):
            check_measurable(dict(self.hf_config), self.fake)
        if self.optimizer == "adafactor" and self.sharded:
            # torch.optim.Adafactor squares a row norm in place (norm(...).square_()); on FSDP2's
            # DTensor shards that norm is a partial sum and DTensor refuses the in-place op.
            raise UserError("measure: torch.optim.Adafactor does not run on FSDP2-sharded "
                            "parameters; use sharding='none' or another optimizer")

    @property
    def sharded(self) -> bool:
        """True when the step runs under FSDP2 (a process group and a device mesh)."""
        return self.sharding != "none"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> MeasureSetup:
        data = json.loads(text)
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise UserError(f"measure: unknown MeasureSetup keys {sorted(unknown)}")
        return cls(**data)


def measure(setup: MeasureSetup, module_snapshots: list[tuple[str, str, dict[str, int]]] | None = None
            ) -> MeasuredMemory:
    """Run ``setup.n_steps`` training steps and return rank 0's memory by category (bytes).

    ``module_snapshots``: where given, the tracker's last snapshot per module (its fully
    qualified name) and state (FSDPMemTracker: PEAK_FW, BEF_PRE_BW, ..., PEAK_BW; MemTracker:
    its own states) is appended, bytes per category on the device: the per-module breakdown
    that tells which moment of the step the peak is (bench/accuracy.py --modules).

    Sharded setups create a fake process group of ``setup.dp`` ranks and destroy it afterwards,
    so measure() can be called repeatedly in one process; it refuses to run when a process group
    already exists. Peaks are the tracker's, which is fresh per call; for CUDA's own
    max_memory_allocated, call it in a fresh process (``python -m planner.measure.trackers``).
    """
    import torch
    import torch.distributed as dist

    if setup.fake or not torch.cuda.is_available():
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", torch.cuda.current_device())
    if not setup.sharded:
        return _measure_rank(setup, device, mesh=None, rank=0, ddp=False, module_snapshots=module_snapshots)

    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise UserError("measure: a torch.distributed process group already exists; "
                        "measure in a fresh process (python -m planner.measure.trackers)")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=setup.dp)
    try:
        mesh = init_device_mesh(device.type, (setup.dp,))
        return _measure_rank(setup, device, mesh=mesh, rank=0, ddp=False, module_snapshots=module_snapshots)
    finally:
        dist.destroy_process_group()


def _module_snapshots(tracker: Any) -> list[tuple[str, str, dict[str, int]]]:
    """(module, state, bytes per category) from the tracker's per-module stats
    (torch.distributed._tools.mem_tracker: memory_tracking[module].snapshots[state], a list of
    {device: {category: bytes}}; the last snapshot of each state, devices summed)."""
    out = []
    for stats in tracker.memory_tracking.values():
        for state, snaps in stats.snapshots.items():
            if not snaps:
                continue
            total: dict[str, int] = {}
            for per_device in snaps[-1].values():
                for category, nbytes in per_device.items():
                    key = str(category).rsplit(".", 1)[-1]
                    total[key] = total.get(key, 0) + int(nbytes)
            out.append((stats.mod_fqn, str(state).rsplit(".", 1)[-1], total))
    return out


def run_distributed_cuda(setup: MeasureSetup, nproc: int) -> list[MeasuredMemory]:
    """Measure for real on ``nproc`` local GPUs with torchrun and NCCL; one result per rank.

    Needs ``setup.fake`` False and ``setup.dp == nproc``. Each rank runs the same step as
    measure() on its own GPU, with real collectives (DDP for sharding "none", FSDP2 otherwise),
    and writes its MeasuredMemory as JSON; this function gathers them, rank order.
    """
    import subprocess
    import tempfile

    if setup.fake:
        raise UserError("run_distributed_cuda: set fake=False (it measures real GPUs)")
    if setup.dp != nproc:
        raise UserError(f"run_distributed_cuda: dp={setup.dp} must equal nproc={nproc}")
    repo_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="planner-measure-") as out_dir:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "-m", "planner.measure.trackers",
               "--worker-out", out_dir, setup.to_json()]
        subprocess.run(cmd, check=True, env=env)
        return [MeasuredMemory.from_json(Path(out_dir, f"rank{r}.json").read_text())
                for r in range(nproc)]


def _distributed_worker(setup: MeasureSetup, out_dir: str) -> None:
    """One torchrun rank of run_distributed_cuda: NCCL, real tensors, its result to out_dir."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    try:
        mesh = init_device_mesh("cuda", (world_size,)) if setup.sharded else None
        result = _measure_rank(setup, device, mesh=mesh, rank=rank,
                               ddp=not setup.sharded and world_size > 1)
        Path(out_dir, f"rank{rank}.json").write_text(result.to_json())
    finally:
        dist.destroy_process_group()


def _measure_rank(setup: MeasureSetup, device: Any, *, mesh: Any, rank: int, ddp: bool,
                  module_snapshots: list[tuple[str, str, dict[str, int]]] | None = None) -> MeasuredMemory:
    """Build model, optimizer and inputs for one rank, run the steps under a tracker, read it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    t0 = time.perf_counter()
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    fake_mode = FakeTensorMode() if setup.fake else contextlib.nullcontext()
    # the fp32 products sit beneath the tracker's mode, entered further in (cpu_matmul's doc)
    with (fake_mode, _unpacked_sequences(), separate_dtensor_propagation(setup.fake),
          _gpu_dropout_kernels(device, fake=setup.fake),
          float32_cpu_matmuls(enabled=not setup.fake and device.type == "cpu")):
        model = build_model(setup, device) if setup.method == "full" else build_finetuned(setup, device)
        n_params = sum(p.numel() for p in model.parameters())
        vocab_size = model.config.get_text_config().vocab_size
        if setup.recompute == "full":
            checkpoint_blocks(model)
        if mesh is not None:
            shard(model, setup, mesh)
        elif ddp:
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model, device_ids=[device.index])
        optimizer = build_optimizer(model, setup)
        ids: Any = torch.randint(0, vocab_size, (setup.micro_batch, setup.seq_len), device=device)
        if is_vlm(setup.hf_config):
            ids = image_batch(model, setup.micro_batch, setup.seq_len, setup.images_per_sample, device)
        tracker = make_tracker(model, optimizer, ids["input_ids"] if isinstance(ids, dict) else ids,
                               sharded=mesh is not None)
        with tracker:
            for step in range(setup.n_steps):
                tracker.step = step + 1
                if step:
                    tracker.reset_mod_stats()  # the trackers refuse a second root forward otherwise
                _train_step(model, optimizer, ids, setup, device, tracker.reset_mod_stats)
        snapshots = tracker.get_tracker_snapshot("peak")
        if module_snapshots is not None:
            module_snapshots.extend(_module_snapshots(tracker))
        step_times = _timed_steps(model, optimizer, ids, setup, device) if on_cuda and not setup.fake else []
    result = tracker_result(tracker, snapshots, device, fake=setup.fake, n_params=n_params, rank=rank,
                            wall_s=time.perf_counter() - t0)
    return dataclasses.replace(result, step_times_s=step_times)


TIMED_STEPS = 3     # after the tracked steps (which warm up kernels and the allocator)


def _timed_steps(model: Any, optimizer: Any, ids: Any, setup: MeasureSetup, device: Any) -> list[float]:
    """Wall seconds of TIMED_STEPS more training steps outside the tracker (its module hooks cost
    time), each between two torch.cuda.synchronize() calls."""
    import torch

    out = []
    for _ in range(TIMED_STEPS):
        torch.cuda.synchronize(device)
        t = time.perf_counter()
        _train_step(model, optimizer, ids, setup, device)
        torch.cuda.synchronize(device)
        out.append(time.perf_counter() - t)
    return out


@contextlib.contextmanager
def _gpu_dropout_kernels(device: Any, *, fake: bool) -> Iterator[None]:
    """On the CPU, run dropout the way a GPU does, so the tracker sees a GPU's tensors.

    The planner predicts GPU memory; two CPU code paths keep more for backward than CUDA's:

    - ``F.dropout``: ATen's ``dropout`` takes the fused ``native_dropout`` kernel only on
      CUDA (and XPU, lazy, privateuse1 devices; aten/src/ATen/native/Dropout.cpp,
      ``is_fused_kernel_acceptable``). On the CPU it multiplies by a noise tensor of the
      input's dtype and autograd keeps that: 4 bytes per element in fp32 instead of CUDA's
      1-byte bool mask. Measured on GPT-2 large (fp32, 4 x 1024 tokens): 270 MiB per block
      more than a GPU keeps, 9.5 GiB over 36 blocks. Here ``F.dropout`` calls
      ``torch.native_dropout`` (which has a CPU kernel too, with a bool mask).
    - ``F.scaled_dot_product_attention`` with ``dropout_p > 0``: the CPU's fused (flash)
      kernel refuses dropout, so PyTorch falls back to the math kernel, which keeps the
      b x heads x s x s probabilities, the dropout noise and the dropped-out probabilities.
      CUDA's flash and memory-efficient kernels apply dropout inside the kernel and keep
      only the output, a fp32 log-sum-exp per head and row, and the RNG seed and offset
      (Dao et al. 2022, arXiv:2205.14135, Sec. 3.1 and Alg. 2). Under fake tensors the
      call goes to the CPU flash op (``_scaled_dot_product_flash_attention_for_cpu``)
      whose fake kernel ignores dropout: the tensors a GPU's flash kernel keeps, less its
      16 bytes of RNG state. A real CPU run cannot do this (that kernel refuses dropout),
      so it keeps the math kernel.

    - ``F.scaled_dot_product_attention`` with a value head narrower than the query/key head
      (multi-head latent attention: DeepSeek-V3's v_head_dim 128 against qk 192): the CPU's
      flash kernel wants one head size, so PyTorch falls back to the math kernel and keeps fp32
      copies of Q, K, V, the b x heads x s x s scores and probabilities (seen under fake tensors
      on the tiny DeepSeek-V3 config: 8 MiB of fp32 scores per block at 2 x 512 tokens). Under
      fake tensors V is padded to the query's head size, the flash op runs and its output is
      cut back to V's width, which is what transformers does for flash attention on a GPU
      (transformers 5.24.0 integrations/flash_attention.py: "pad value to the query head dim
      (e.g. MLA, where v_head_dim < qk_head_dim) and crop the output"). The padded V (n_heads x (qk - v) more 16-bit
      elements per token than the planner's flash figure) is kept; a GPU's memory-efficient
      kernel, which takes the narrow V as it is, would not keep it.

    Nothing changes on a GPU, nor for models without dropout or MLA.
    """
    if device.type != "cpu":
        yield
        return
    from unittest import mock

    import torch
    import torch.nn.functional as F

    cpu_dropout, cpu_sdpa = F.dropout, F.scaled_dot_product_attention

    def dropout(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if not training or inplace or not 0.0 < p < 1.0:
            return cpu_dropout(x, p, training, inplace)
        return torch.native_dropout(x, p, True)[0]

    def sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
             is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
        narrow_v = value.shape[-1] < query.shape[-1]
        if not fake or (dropout_p == 0.0 and not narrow_v) or enable_gqa or query.shape[1] != key.shape[1]:
            return cpu_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        v_width = value.shape[-1]
        if narrow_v:    # MLA: pad V to the q/k head size, as transformers does for flash attention
            value = F.pad(value, [0, query.shape[-1] - v_width])
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
        return out[..., :v_width] if narrow_v else out

    # module attributes, not a TorchFunctionMode: checkpoint's recompute in backward runs
    # outside a mode entered in forward and would rebuild different tensors
    with mock.patch.object(F, "dropout", dropout), mock.patch.object(F, "scaled_dot_product_attention", sdpa):
        yield


@contextlib.contextmanager
def _unpacked_sequences() -> Iterator[None]:
    """Tell transformers our rows are not packed sequences, so fake and real runs match.

    transformers' masking_utils.find_packed_sequence_indices reads the position ids' values to
    decide whether a row packs several sequences. Fake tensors have no values, so it assumes they
    might, and builds a (batch, 1, seq, seq) mask a real run never builds. Our inputs are one
    sequence per row, so the answer is always "not packed" (None).
    """
    from unittest import mock

    import transformers.masking_utils as masking_utils

    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        yield
        return
    with mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None):
        yield


def _train_step(model: Any, optimizer: Any, ids: Any, setup: MeasureSetup, device: Any,
                new_forward: Any = None) -> None:
    """Forward with the model's own loss, backward, optimizer step, zero_grad(set_to_none);
    ``new_forward`` (the tracker's reset_mod_stats) before each forward after the first."""
    import torch

    autocast: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if setup.precision == "bf16-mixed" and not setup.sharded:
        autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    for i in range(setup.no_sync_micro_batches):       # FSDP2 no-sync accumulation
        if i and new_forward is not None:
            new_forward()
        model.set_requires_gradient_sync(False)
        out = model(**ids) if isinstance(ids, dict) else model(input_ids=ids, labels=ids)
        loss = out.loss
        del out
        loss.backward()
        del loss
    if setup.no_sync_micro_batches:
        model.set_requires_gradient_sync(True)
        if new_forward is not None:
            new_forward()
    with autocast:
        out = model(**ids) if isinstance(ids, dict) else model(input_ids=ids, labels=ids)
    loss = out.loss
    del out  # drop the logits, as a training loop that keeps only the loss does
    loss.backward()
    del loss
    with stub_scalars() if setup.fake else contextlib.nullcontext():
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m planner.measure.trackers '<MeasureSetup JSON>'``: print MeasuredMemory as JSON."""
    parser = argparse.ArgumentParser(prog="python -m planner.measure.trackers", description=main.__doc__)
    parser.add_argument("setup", help="MeasureSetup as JSON (hf_config holds the config.json dict)")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)  # set by run_distributed_cuda
    parser.add_argument("--nproc", type=int, default=0,
                        help="real CUDA run on this many local GPUs (torchrun); prints the most loaded rank")
    args = parser.parse_args(argv)
    try:
        setup = MeasureSetup.from_json(args.setup)
    except (UserError, json.JSONDecodeError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.worker_out:
        _distributed_worker(setup, args.worker_out)
        return 0
    if args.nproc:
        ranks = run_distributed_cuda(setup, args.nproc)
        print(max(ranks, key=lambda r: r.max_allocated_bytes or r.peak_bytes).to_json())
        return 0
    print(measure(setup).to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
