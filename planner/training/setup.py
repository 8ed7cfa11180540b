"""The training set-up: precision, optimizer, recomputation, attention kernel, overheads.

Every number that is not derived from the architecture lives here as a named field
with a default and its source, so a report can print it and a user can change it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any

from planner.training.finetune import FinetuneSpec
from planner.training.fp8 import Fp8Recipe, recipe
from planner.units import MiB, hash_once, stored_hash, unpickle_hashed

PRECISIONS = ("bf16-mixed", "fp16-mixed", "fp32", "bf16", "fp8", "nvfp4")
OPTIMIZERS = ("adamw", "sgd", "adafactor", "adam8bit", "adamw-bf16-states")
RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")     # Megatron-LM's --recompute-method (TrainingSetup.recompute_method)
ATTENTION = ("flash", "eager")
KERNELS = ("auto", "eager", "fused")
OFFLOAD = ("none", "cpu", "nvme")
# the training stacks (planner.stacks.STACKS reads them here: the training layer sits below it)
STACKS = ("hf", "torchtitan", "megatron", "deepspeed")
# the stack whose memory profile the model follows (planner.stacks); "auto": the kernels'
# profile, as before --stack existed (eager = Hugging Face and DeepSpeed, fused = Megatron-LM)
MEMORY_STACKS = ("auto", *STACKS)
# DeepSpeed's activation checkpointing of the checkpointed blocks' inputs (--stack deepspeed,
# --recompute full): deepspeed/runtime/activation_checkpointing/checkpointing.py (0.19.8)
DS_CHECKPOINTING = ("none", "partitioned", "cpu", "partitioned-cpu")
# When FSDP under a pipeline reduce-scatters the gradients (TrainingSetup.fsdp_pipeline_grad_sync):
# "step": once, after the step's last micro-batch, holding the unsharded gradients until then, as
# PyTorch's pipeline schedules run FSDP2 (torch/distributed/pipelining/stage.py,
# backward_maybe_with_nosync: set_requires_gradient_sync(False) on every backward;
# perform_reduce_grad after the last); "micro-batch": after each micro-batch's backward, into
# sharded gradients accumulated in the reduce dtype, as Llama 3 trained (arXiv:2407.21783,
# Sec. 3.3.2: 'shards optimizer states and gradients'; gradient accumulation over micro-batches
# with the gradients reduce-scattered across the data-parallel workers in FSDP)
FSDP_PIPELINE_GRAD_SYNCS = ("step", "micro-batch")
# How the pipeline's layers are split over its stages (TrainingSetup.pp_balance): "none": the
# planner's even split, extra layers on the middle stages first (layouts.stages.stage_layers);
# "embedding-loss": the embedding and the loss each count as one layer of the split, so the first
# and the last stage hold one transformer layer fewer, and under interleaving the first model
# chunk of the first stage holds only the embedding and the last chunk of the last stage only
# the output projection and the loss: the Llama 3 paper's balancing (arXiv:2407.21783, Sec.
# 3.3.2, 'we reduce one Transformer layer each from the first and the last stages'), and
# megatron-core 0.16.1's account_for_embedding_in_pipeline_split and
# account_for_loss_in_pipeline_split (transformer/transformer_config.py lines 96-102;
# transformer/transformer_block.py get_num_layers_to_build, lines 75-202)
# "embedding-loss-mtp": the embedding, the loss and each MTP module (TrainingSetup.mtp_layers) count
# as one layer of the split, the MTP modules on the last stage: Megatron-Bridge's DeepSeek-V3
# layouts ("Et|(tt|)*30mL" at pp 8, vp 4; megatron-core's own example "Et*3|(tt|)*29,m|L"), written
# as megatron-core's --pipeline-model-parallel-layout (docs/source/api-guide/pipeline_parallel_layout.md;
# transformer/pipeline_parallel_layer_layout.py), which asks no divisibility
PP_BALANCES = ("none", "embedding-loss", "embedding-loss-mtp")
# Megatron-Core's cross entropy (TrainingSetup.cross_entropy; megatron-core 0.16.1
# ModelParallelConfig cross_entropy_loss_fusion and cross_entropy_fusion_impl,
# model_parallel_config.py lines 241-249; language_module.py compute_language_model_loss):
# "native": Megatron-Core's vocab-parallel cross entropy, which keeps the logits' exp in fp32
# for backward (tensor_parallel/cross_entropy.py: vocab_parallel_logits.float(), save_for_backward
# (exp_logits, ...)); "te": Transformer Engine's parallel_cross_entropy, which writes the gradient
# into its 16-bit input in the forward and keeps only that input (transformer_engine/pytorch/
# cross_entropy.py, CrossEntropyFunction.forward: save_for_backward(_input, target, m_d_X_y)).
# Megatron-Bridge's Llama 3 pretraining recipes set "te" (src/megatron/bridge/recipes/llama/
# llama3.py: model_cfg.cross_entropy_fusion_impl = "te")
CROSS_ENTROPIES = ("native", "te")


@dataclass(frozen=True, kw_only=True, slots=True)
class Precision:
    """Bytes per parameter for each copy the training state keeps.

    Mixed precision (Micikevicius et al. 2018, arXiv:1710.03740): 16-bit weights and
    gradients used by the kernels, an fp32 master copy held by the optimizer. The ZeRO
    paper's accounting (Rajbhandari et al. 2019, Sec. 3.1) counts 16-bit gradients;
    FSDP2 with MixedPrecisionPolicy keeps fp32 sharded parameters (which are the
    master copy) and fp32 gradients, and gathers 16-bit copies for compute.

    fp8: bf16 mixed precision whose block linear layers run FP8 GEMMs under a recipe
    (planner.training.fp8: its weight copies, saved inputs, gathers and GEMM rate);
    compute_dtype stays bf16 (attention, the LM head, and the peak MFU is quoted against),
    matmul_dtype is fp8.
    """

    name: str
    weight_bytes: int          # the copy the forward pass reads
    grad_bytes: int
    master_bytes: int          # 0 when the weights are already fp32 or training is pure 16-bit
    activation_bytes: int      # bytes per activation element
    compute_dtype: str         # which tensor-core rate applies: bf16, fp16, fp32
    fp8: Fp8Recipe | None = None   # the FP8 recipe of the blocks' linear layers (precision fp8)

    @property
    def fsdp_grad_bytes(self) -> int:
        """Bytes per element of FSDP2's gradients (the sharded ones and the unsharded ones it
        reduces and accumulates): fp32 under mixed precision, where MixedPrecisionPolicy keeps the
        parameters in the fp32 they were built in and the gradients in their dtype
        (torch/distributed/fsdp/_fully_shard/_fsdp_param.py), else the precision's own."""
        return 4 if self.is_mixed else self.grad_bytes

    @property
    def gather_bytes(self) -> int:
        """Bytes per parameter a ZeRO-3/FSDP all-gather moves (fp8 all-gather: 1)."""
        return self.fp8.gather_bytes if self.fp8 is not None else self.weight_bytes

    @staticmethod
    @lru_cache(maxsize=16)
    def named(name: str, fp8_recipe: str = "rowwise", stack: str = "auto") -> Precision:
        if name == "nvfp4":     # bf16 mixed precision whose block linear layers run NVFP4 GEMMs
            r = recipe("nvfp4", stack)
            return Precision(name="nvfp4", weight_bytes=2, grad_bytes=r.grad_bytes, master_bytes=4,
                             activation_bytes=2, compute_dtype="bf16", fp8=r)
        if name == "fp8":
            r = recipe(fp8_recipe, stack)
            return Precision(name=f"fp8 ({r.name})", weight_bytes=2, grad_bytes=r.grad_bytes, master_bytes=4,
                             activation_bytes=2, compute_dtype="bf16", fp8=r)
        if name in ("bf16-mixed", "fp16-mixed"):
            return Precision(name=name, weight_bytes=2, grad_bytes=2, master_bytes=4,
                             activation_bytes=2, compute_dtype=name[:4])
        if name == "fp32":
            return Precision(name=name, weight_bytes=4, grad_bytes=4, master_bytes=0,
                             activation_bytes=4, compute_dtype="fp32")
        if name == "bf16":
            return Precision(name=name, weight_bytes=2, grad_bytes=2, master_bytes=0,
                             activation_bytes=2, compute_dtype="bf16")
        raise ValueError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")

    @property
    def is_mixed(self) -> bool:
        return self.master_bytes > 0


# SGD's momentum as the planner measures and writes it (ASSUMED, the common 0.9; any value
# above 0 keeps the momentum buffer, the 4 B per parameter of optimizer_state_bytes_per_param)
SGD_MOMENTUM = 0.9


def optimizer_state_bytes_per_param(optimizer: str) -> float:
    """Optimizer state per parameter, excluding the fp32 master copy.

    AdamW: first and second moments in fp32, 8 B (Kingma & Ba 2015; ZeRO paper K=12
    counts them with the 4 B master). SGD with momentum: one fp32 buffer, 4 B.
    8-bit Adam (Dettmers et al. 2022, arXiv:2110.02861): two int8 states plus one fp32
    absmax per 2048-element block for each, 2 + 2*4/2048 B. Adafactor is factored per
    matrix and is counted from the shapes in memory.optimizer_bytes (Shazeer & Stern 2018).
    AdamW with 16-bit moments (adamw-bf16-states): both moments in bf16, 4 B, beside the
    fp32 master; torchtitan 0.3.0 ``optimizer.implementation = "fused_opt_states_bf16"``
    (torchtitan/components/optimizer/optimizer.py: exp_avg and exp_avg_sq created in
    bfloat16, the fused kernel's mixed-precision path), Megatron-LM
    ``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``
    (megatron-core 0.16.1 OptimizerConfig, Transformer Engine FusedAdam); DeepSeek-V3
    trains with BF16 moments (arXiv:2412.19437, Sec. 3.3.4).
    """
    return {"adamw": 8.0, "sgd": 4.0, "adam8bit": 2.0 + 8 / 2048, "adafactor": 0.0,
            "adamw-bf16-states": 4.0}[optimizer]


@dataclass(frozen=True, kw_only=True, slots=True)
class Overheads:
    """Memory no tensor tracker sees, as named parameters with their sources.

    cuda_context_bytes: the CUDA context and the kernel images PyTorch loads; with CUDA
    12 lazy loading it is several hundred MiB (PyTorch "CUDA semantics" notes; NVIDIA
    "CUDA lazy loading" docs). library_workspace_bytes: cuBLAS workspaces (PyTorch keeps
    32 MiB per handle on Hopper, CUBLAS_WORKSPACE_CONFIG) plus cuDNN/flash workspaces.
    nccl_bytes: NCCL's own channel buffers per communicator (NCCL_BUFFSIZE = 4 MiB per
    channel and peer; NCCL environment-variable docs). fragmentation: memory the caching
    allocator reserves but does not hand out, as a fraction of what tensors use;
    practitioners report 5-30% (PyTorch "Understanding CUDA memory usage";
    expandable_segments reduces it).
    """

    cuda_context_bytes: int = 768 * MiB
    library_workspace_bytes: int = 256 * MiB
    nccl_bytes: int = 512 * MiB
    fragmentation: float = 0.10

    def fixed_bytes(self, distributed: Any) -> Any:
        """CUDA context, library workspaces and, on a rank of a distributed job, NCCL, in bytes
        (``distributed`` a bool, or a bool array for an int64 array)."""
        return self.cuda_context_bytes + self.library_workspace_bytes + distributed * self.nccl_bytes

    def fragmentation_bytes(self, tracked_bytes: Any) -> Any:
        """The allocator's reserve on top of ``tracked_bytes`` of tensors (an int or an int64
        array): fragmentation x tracked, rounded down."""
        if isinstance(tracked_bytes, int):
            return int(tracked_bytes * self.fragmentation)
        return (tracked_bytes * self.fragmentation).astype("int64")

    def untracked_bytes(self, tracked_bytes: Any, distributed: Any) -> Any:
        """What a rank whose tensors take ``tracked_bytes`` holds beyond them: the fixed costs
        (fixed_bytes; ``distributed`` a bool or a bool array) plus fragmentation_bytes. The one
        rule the training memory model, its floors and the inference model add on top."""
        return self.fixed_bytes(distributed) + self.fragmentation_bytes(tracked_bytes)


@dataclass(frozen=True, kw_only=True, slots=True)
class Buffers:
    """Communication-buffer sizes, in elements, as the engines configure them.

    DeepSpeed's defaults are reduce_bucket_size = allgather_bucket_size = 5e8 elements
    and stage3_prefetch_bucket_size = 5e7 (DeepSpeed config docs, "ZeRO optimizations");
    the planner defaults to 2e8, which its DeepSpeed config then sets explicitly.
    PyTorch DDP buckets gradients in 25 MiB buckets (DistributedDataParallel
    bucket_cap_mb=25).
    """

    zero_bucket_numel: int = 200_000_000
    ddp_bucket_bytes: int = 25 * MiB


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingSetup:
    """What the user trains with. Defaults: sequence 4096, global batch of 1024
    sequences (4M tokens, as Llama 2/3 pretraining used: Touvron et al. 2023 Sec. 2.2),
    bf16 mixed precision, AdamW, FlashAttention, no recomputation."""

    seq_len: int = 4096
    global_batch: int = 1024          # sequences per optimizer step
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    optimizer_foreach: bool = True    # PyTorch's multi-tensor optimizer path, its default on CUDA
    attention: str = "flash"
    # eager: PyTorch ops as Hugging Face models run them under FSDP/DeepSpeed;
    # fused: Megatron-LM/Transformer Engine kernels (fused norms, SwiGLU, cross entropy);
    # auto: fused for layouts with tp, pp or cp (which need Megatron-style engines), else eager.
    kernels: str = "auto"
    overheads: Overheads = field(default_factory=Overheads)
    buffers: Buffers = field(default_factory=Buffers)
    usable_memory_fraction: float = 1.0   # keep headroom below the card's capacity
    # what trains: full, LoRA, QLoRA or the last blocks (planner.training.finetune)
    finetune: FinetuneSpec = field(default_factory=FinetuneSpec)
    # ZeRO-Offload / ZeRO-Infinity / FSDP CPU offload: where optimizer states and parameters live
    offload_optimizer: str = "none"       # none | cpu | nvme
    offload_params: str = "none"          # none | cpu | nvme
    # bytes per parameter of optimizer state, overriding the optimizer's default (e.g. 4 for
    # Adam moments kept in 16 bits, as torch.optim.AdamW keeps them for 16-bit parameters)
    optimizer_state_bytes: float | None = None
    # ---- the stack's memory profile (issue 16; planner.stacks, planner/memory/activations.py)
    # torchtitan: its Llama 3 block under its own SelectiveAC/FullAC and its chunked loss;
    # megatron: fused kernels; hf, deepspeed, auto: the kernels as --kernels says (today's model)
    stack: str = "auto"
    # checkpoint every k-th block only (the others keep everything): torchtitan <= 0.2's
    # selective_ac_option = "k", Megatron-LM's --recompute-method block over n / k layers
    recompute_every: int = 1
    # Megatron-LM full recomputation (megatron-core 0.16.1 transformer_block.py,
    # _checkpointed_forward; TransformerConfig.recompute_method / recompute_num_layers):
    # "uniform" checkpoints groups of recompute_num_layers layers of each (virtual) pipeline
    # stage, keeping each group's input; "block" checkpoints the first recompute_num_layers
    # layers of each (virtual) stage and keeps everything of the rest. uniform over 1 layer is
    # every block keeping its input (the planner's --recompute full).
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    # Megatron-Core's selective recomputation by module (TransformerConfig.recompute_modules;
    # planner.memory.recompute): () is its default, the core attention
    recompute_modules: tuple[str, ...] = ()
    # layers per virtual pipeline stage the block method counts in, for the step time's
    # recomputed share (0: not fixed, every layer recomputes); memory reads each layout's own
    recompute_chunk_layers: int = 0
    # torch.compile of each block (torchtitan's compile.components = ["model"]; Hugging Face
    # Trainer's torch_compile): the partitioner recomputes pointwise ops instead of saving them
    compile: bool = False
    # DeepSpeed: partition_activations splits each checkpointed input over the model-parallel
    # group, cpu_checkpointing moves it to host memory (DS_CHECKPOINTING)
    ds_checkpointing: str = "none"
    # Megatron-Core's CPU activation offload (megatron-core 0.16.1 model_parallel_config.py
    # cpu_offloading, cpu_offloading_num_layers): the saved activations of this many layers go
    # to pinned host memory in forward and come back in backward (0: none)
    offload_activations: int = 0
    # multi-token prediction modules (DeepSeek-V3, arXiv:2412.19437, Sec. 2.2: each one more
    # Transformer block, a 2h x h projection and two RMSNorms, sharing the embedding and the
    # output head, with its own loss); megatron-core 0.16.1 TransformerConfig.mtp_num_layers puts
    # them on the last pipeline stage (0: none)
    mtp_layers: int = 0
    # FSDP under a pipeline: reduce-scatter once a step or every micro-batch (FSDP_PIPELINE_GRAD_SYNCS)
    fsdp_pipeline_grad_sync: str = "step"
    # the pipeline's layer split (PP_BALANCES): "none", or the embedding and the loss counted as layers;
    # or a layout stated in megatron-core's syntax (--pp-layout, training.pp_layout), which holds an "E"
    pp_balance: str = "none"
    # interleaved 1F1B's micro-batch group: how many micro-batches run through one model chunk
    # before the next chunk (megatron-core 0.16.1 ModelParallelConfig
    # microbatch_group_size_per_vp_stage, default pp: model_parallel_config.py lines 343-361 and
    # 447-448; schedules.py get_pp_rank_microbatches, lines 768-774: rank r's warm-up runs
    # (pp - r - 1) x 2 + (vp - 1) x N chunk forwards). megatron-core accepts N in [pp, the step's
    # micro-batches] (schedules.py lines 995-1003); the Llama 3 paper's schedule sets it freely
    # (arXiv:2407.21783, Sec. 3.3.2 and its Figure 6: N = 5). 0: pp, megatron-core's default
    pp_microbatch_group: int = 0
    # the loss's kernel under fused (Megatron) kernels (CROSS_ENTROPIES)
    cross_entropy: str = "native"
    # the FP8 recipe under precision "fp8" (planner.training.fp8.RECIPES), resolved from the stack
    fp8_recipe: str = "rowwise"
    # Megatron-LM's --fp8-param-gather (megatron-core TransformerConfig.fp8_param): the blocks'
    # linear weights live only in their low-precision form (no 16-bit copy) and the distributed
    # optimizer gathers them so; Megatron-Bridge's FP8 current-scaling, delayed and MXFP8 recipes
    # set it (src/megatron/bridge/training/mixed_precision.py, fp8_param_gather = True)
    fp8_param_gather: bool = False
    # layers kept in BF16 under the low-precision recipe, (first N, last M) of the model
    # (megatron-core TransformerConfig first_last_layers_bf16, num_layers_at_start_in_bf16,
    # num_layers_at_end_in_bf16; planner.training.layer_precision); (0, 0): none
    bf16_layers: tuple[int, int] = (0, 0)
    # MoE routing imbalance: tokens the most loaded expert-parallel rank receives over its
    # balanced share (k T / ep of every rank's tokens). It scales that rank's expert-side
    # saved tensors (memory.moe), its expert GEMMs and its all-to-all bytes (timing.kernels).
    # 1.0: balanced, as tracker measurements under fake tensors route (and as every committed
    # example assumes). Switch Transformer sizes expert buffers with a capacity factor of 1.25
    # in training (Fedus et al. 2021, arXiv:2101.03961, Sec. 2.1 and Table 1: expert
    # capacity = tokens per batch / experts x capacity factor); a dropless MoE with an
    # auxiliary balance loss (DeepSeek-V3, arXiv:2412.19437, Sec. 2.1.2: auxiliary-loss-free
    # balancing) has no fixed bound: give the ratio its router logs report.
    moe_imbalance: float = 1.0
    # Megatron-Core's expert-parallel all-to-all overlap (training.moe_runtime.A2A_OVERLAPS):
    # "auto" where megatron-core runs it, "on" (refused where it cannot), "off"
    moe_a2a_overlap: str = "auto"
    # Megatron-Core's CUDA graphs (training.moe_runtime.CUDA_GRAPHS): "none", "moe" (attention,
    # MoE router and preprocessing captured), "full-iteration"
    cuda_graphs: str = "none"
    # Transformer Engine's FP8 attention (megatron-core TransformerConfig.fp8_dot_product_attention)
    fp8_attention: bool = False
    # Megatron-Core's token dispatcher (training.moe_runtime.DISPATCHERS): "alltoall", or "flex"
    # (DeepEP / HybridEP: a token sent once per remote node)
    moe_dispatcher: str = "alltoall"
    # A vision-language model's images in each sequence (training.images): 0 is text-only data
    # (the image side's weights are still held); their tokens count within seq_len
    images_per_sample: int = 0
    # the hash of every field, worked out once (planner.units.hash_once): the per-shape caches of
    # the memory and step-time models look a set-up up hundreds of thousands of times per `plan buy`
    # (issue 32), and a dataclass's own hash hashes every field each time (about 0.9 us)
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    __hash__, __setstate__ = stored_hash, unpickle_hashed

    def __post_init__(self) -> None:
        hash_once(self)

    @property
    def recomputed_share(self) -> float:
        """The share of a stage's layers whose forward full recomputation reruns: under
        Megatron's block method N of each virtual stage's layers, else all of them."""
        if self.recompute_method != "block" or self.recompute_chunk_layers <= 0:
            return 1.0
        return min(self.recompute_num_layers, self.recompute_chunk_layers) / self.recompute_chunk_layers

    @property
    def precision_spec(self) -> Precision:
        return Precision.named(self.precision, self.fp8_recipe, self.stack)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "_hash"}


# TrainingSetup's defaults as one object: the command line's defaults and help, the default
# sequence length (training.checks.default_seq_len) and the batch rule (training.batch) read them
DEFAULT_SETUP = TrainingSetup()


def block_table_setup(setup: TrainingSetup) -> TrainingSetup:
    """``setup`` as the per-block-shape tables key it (memory.shapes' activation figures,
    timing.stage's block rows): with the default global batch, since no memory or step-time
    model reads the global batch (a layout carries its micro-batch and accumulation;
    tests/test_block_tables.py checks that nothing under planner/memory or planner/timing reads
    it). Set-ups that differ only in it then share one table: `plan buy` of 128 Llama 3.1 8B
    jobs, each its own global batch (issue 32, H1), built 384 tables of the same blocks."""
    return setup if setup.global_batch == DEFAULT_SETUP.global_batch else replace(
        setup, global_batch=DEFAULT_SETUP.global_batch)

MAX_SEQ_LEN = 4 * 1024 * 1024
MAX_GPUS = 1 << 17
MAX_SEARCH_GPUS = 16_384        # the largest GPU count a search tries by default (--max-gpus, api.plan)
MAX_GLOBAL_BATCH = 1 << 24
MAX_MICRO_BATCH = 4096

