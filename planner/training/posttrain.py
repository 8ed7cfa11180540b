"""Post-training set-ups: distillation from a teacher, and RL with a rollout engine.

Each field is a setting the stacks expose, with its default and where the default comes from;
the defaults live once, in DISTILL_DEFAULTS and RL_DEFAULTS, which the set-ups below and the
command line (its options' defaults and help) read. The arithmetic on the settings lives in
planner.memory.distill, planner.memory.rollout and planner.timing.rollout.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import UserError
from planner.training.setup import MAX_GLOBAL_BATCH

# How the frozen teacher is held on the student's GPUs:
#  replicated: every rank holds all of it (torchtune's knowledge_distillation_single_device);
#  fsdp:       sharded over the data-parallel ranks and gathered one block at a time for its
#              forward (torchtune's knowledge_distillation_distributed.py shards the teacher
#              with the same fully_shard as the student);
#  tp:         split like the student over its tensor- and pipeline-parallel ranks
#              (Megatron-Bridge / ModelOpt's distillation: the teacher is built with the
#              student's model-parallel config, modelopt.torch.distill's DistillationModel);
#  auto:       of those the layout allows, the one that needs the least memory.
TEACHER_SHARDINGS = ("auto", "replicated", "fsdp", "tp")
# The KD loss's working set: "full" materialises both models' fp32 probabilities over the
# whole vocabulary at once (torchtune ForwardKLLoss); "chunked" works on one chunk of the
# tokens at a time (torchtune ForwardKLWithChunkedOutputLoss, num_output_chunks = 8).
KD_LOSSES = ("chunked", "full")
KD_CHUNKS = 8       # torchtune's num_output_chunks default (recipes/configs/*/knowledge_distillation_*.yaml)
RL_TASKS = ("grpo", "ppo", "dpo")
ROLLOUT_PLACEMENTS = ("colocated", "separate")
# The teacher's weights as the student's 16-bit copy or in fp32: bytes per parameter
TEACHER_WEIGHT_BYTES = {"bf16": 2, "fp32": 4}


@dataclass(frozen=True, kw_only=True, slots=True)
class DistillDefaults:
    """The defaults of the distillation settings, named as the command line's options
    (--kd-loss is kd_loss): DistillSetup, cli.options.Options and click's defaults and help
    read them from DISTILL_DEFAULTS, so each is written once; its fields are the options that
    need --teacher (cli.posttrain.stray_option).

    Sources: the teacher in bf16 like the student, unquantized, held as the layout allows
    least (TEACHER_SHARDINGS); torchtune's chunked KD loss (KD_LOSSES); online distillation
    without hidden-state losses.
    """

    teacher_precision: str = "bf16"
    teacher_quant: str = "none"
    teacher_sharding: str = "auto"
    kd_loss: str = "chunked"
    kd_hidden_layers: int = 0
    kd_offline_topk: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class RLDefaults:
    """The defaults of an RL step's settings, named as the command line's options
    (--prompt-len is prompt_len): RLSetup, cli.options.Options and click's defaults and help
    read them from RL_DEFAULTS; its fields (and --rl-steps) are the options that need --task
    grpo|ppo|dpo.

    Sources: 8 responses per prompt (TRL GRPOConfig num_generations = 8); generation on the
    training GPUs with vLLM at tensor parallelism 1 and its default gpu_memory_utilization 0.9
    (vllm/config/cache.py), the training state offloaded while it generates (verl, NeMo-RL).
    response_mean 0: every response runs to response_len. rl_async 0: on-policy, generation and
    training take turns (NeMo-RL's grpo.async_grpo.enabled false). ASSUMED where no stack fixes
    one: a 1,024-token prompt, up to 4,096 response tokens, 64 prompts per step.
    """

    prompt_len: int = 1024
    response_len: int = 4096
    response_mean: int = 0
    group_size: int = 8
    prompts_per_step: int = 64
    rollout: str = "colocated"
    rollout_tp: int = 1
    rollout_memory_fraction: float = 0.9
    offload_train_states: bool = True
    rl_async: int = 0


DISTILL_DEFAULTS = DistillDefaults()
RL_DEFAULTS = RLDefaults()
_DD, _RD = DISTILL_DEFAULTS, RL_DEFAULTS


def teacher_weight_bytes(precision: str) -> int:
    """Bytes per parameter of the teacher's weights at --teacher-precision (bf16: 2, fp32: 4)."""
    if precision not in TEACHER_WEIGHT_BYTES:
        raise UserError(f"unknown teacher precision {precision!r}; choose one of {', '.join(TEACHER_WEIGHT_BYTES)}")
    return TEACHER_WEIGHT_BYTES[precision]


@dataclass(frozen=True, kw_only=True, slots=True)
class DistillSetup:
    """The teacher of a distillation run and the KD loss.

    teacher_weight_bytes: bytes per parameter of the teacher's 16-bit copy (2) or fp32 (4);
    teacher_quant: weight-only quantization of its linear layers (none, int8, int4, nf4: the
    storage formats of planner.training.finetune); kd_hidden_layers: hidden-state losses on N
    layers (Minitron, Sreenivas et al. 2024, arXiv:2408.11796, Sec. 3: logit loss plus
    intermediate-state losses; ModelOpt's intermediate_layer_pairs), each keeping the
    teacher's and the student's hidden state of that layer for the MSE; offline_topk: 0 for
    online distillation (the teacher runs every step), k for distillation from stored top-k
    teacher logits (no teacher on the GPUs; k values and k int32 indices per token are read).
    """

    teacher: str
    teacher_weight_bytes: int = TEACHER_WEIGHT_BYTES[_DD.teacher_precision]
    teacher_quant: str = _DD.teacher_quant
    teacher_sharding: str = _DD.teacher_sharding
    kd_loss: str = _DD.kd_loss
    kd_hidden_layers: int = _DD.kd_hidden_layers
    offline_topk: int = _DD.kd_offline_topk

    def __post_init__(self) -> None:
        if self.teacher_sharding not in TEACHER_SHARDINGS:
            raise UserError(f"unknown teacher sharding {self.teacher_sharding!r}; choose one of "
                            f"{', '.join(TEACHER_SHARDINGS)}")
        if self.kd_loss not in KD_LOSSES:
            raise UserError(f"unknown KD loss {self.kd_loss!r}; choose one of {', '.join(KD_LOSSES)}")

    @property
    def online(self) -> bool:
        return self.offline_topk == 0


@dataclass(frozen=True, kw_only=True, slots=True)
class RLSetup:
    """One RL step's shape, as GRPO/PPO/DPO trainers are configured.

    prompts_per_step x group_size sequences are generated per step (TRL GRPOConfig's
    generation_batch_size / num_generations; NeMo-RL's grpo.num_prompts_per_step x
    num_generations_per_prompt); each is prompt_len + response_len tokens at most.
    engine_memory_fraction is vLLM's gpu_memory_utilization: the share of the GPU the engine
    may take for its weights, activations and KV cache (vllm/config/cache.py default 0.9;
    TRL's colocate examples set 0.3, GRPOConfig.vllm_gpu_memory_utilization defaults to 0.3).
    offload_train_states: the training state (weights, gradients, optimizer) leaves the GPU
    while the engine generates, as verl (actor_rollout_ref.actor.fsdp_config.param_offload /
    optimizer_offload) and NeMo-RL (offload before generation) do; TRL keeps it resident and
    puts the engine to sleep for training (vllm_enable_sleep_mode). engine_sleeps: the
    engine releases its weights and KV cache during training (vLLM's sleep mode, level 1).
    response_mean: the mean response length (0: every response runs to response_len). RL
    responses end at different lengths; the engine's batch runs until its longest response
    ends (ASSUMED: one response per engine reaches response_len, the long tail RL rollouts
    have), while the KV-cache reads, the decode FLOPs and the tokens trained on (packed
    sequences: NeMo-RL's sequence_packing, verl's use_remove_padding) follow the mean.
    off_policy_steps: 0 for on-policy RL; N >= 1 for asynchronous RL, trajectories at most N
    policy versions old (NeMo-RL's grpo.async_grpo.enabled with max_trajectory_age_steps N,
    docs/guides/async-grpo.md): the engines generate the next steps' batches on GPUs of their
    own (the guide: policy.generation.colocated.enabled false is required) while the training
    GPUs score and train on the last one, so the two sides overlap.
    """

    task: str
    prompt_len: int = _RD.prompt_len
    response_len: int = _RD.response_len
    group_size: int = _RD.group_size
    prompts_per_step: int = _RD.prompts_per_step
    placement: str = _RD.rollout
    engine_tp: int = _RD.rollout_tp
    engine_memory_fraction: float = _RD.rollout_memory_fraction
    offload_train_states: bool = _RD.offload_train_states
    engine_sleeps: bool = True
    response_mean: int = _RD.response_mean
    reference_model: bool = True      # GRPO's KL term against a frozen reference (beta > 0)
    off_policy_steps: int = _RD.rl_async

    def __post_init__(self) -> None:
        if self.task not in RL_TASKS:
            raise UserError(f"unknown RL task {self.task!r}; choose one of {', '.join(RL_TASKS)}")
        if self.placement not in ROLLOUT_PLACEMENTS:
            raise UserError(f"unknown rollout placement {self.placement!r}; choose one of "
                            f"{', '.join(ROLLOUT_PLACEMENTS)}")
        if not 0 <= self.response_mean <= self.response_len:
            raise UserError(f"--response-mean {self.response_mean} must lie within --response-len {self.response_len}")
        if self.sequences_per_step > MAX_GLOBAL_BATCH:
            raise UserError(f"--prompts-per-step x --group-size = {self.sequences_per_step:,} sequences per step "
                            f"exceeds {MAX_GLOBAL_BATCH:,}; give fewer prompts or a smaller group")
        if self.off_policy_steps < 0:
            raise UserError(f"--rl-async {self.off_policy_steps} must be 0 (on-policy) or a positive step count")
        if self.off_policy_steps and (self.placement != "separate" or not self.generates):
            raise UserError(f"--rl-async {self.off_policy_steps} overlaps generation with training, which needs the "
                            "engines on GPUs of their own (NeMo-RL's async GRPO requires non-colocated generation): "
                            "add --rollout separate (and a generating task, grpo or ppo), or drop --rl-async")
        if not 0.0 < self.engine_memory_fraction <= 1.0:
            raise UserError(f"--rollout-memory-fraction {self.engine_memory_fraction} must be in (0, 1]")

    @property
    def seq_len(self) -> int:
        """Tokens of one sequence: the prompt and its response (DPO: prompt and the longer answer)."""
        return self.prompt_len + self.response_len

    def engine_gpus(self, training_gpus: int) -> int:
        """GPUs the engines hold beyond the training GPUs: --rollout separate puts as many of
        their own beside them (NeMo-RL's policy.generation.colocated.resources); colocated
        engines, and DPO, which generates nothing, hold none. GPUs."""
        return training_gpus if self.placement == "separate" and self.generates else 0

    @property
    def overlapped(self) -> bool:
        """Asynchronous RL: generation runs beside scoring and training, not before them."""
        return self.off_policy_steps > 0

    @property
    def mean_response(self) -> int:
        return self.response_mean or self.response_len

    @property
    def token_share(self) -> float:
        """Tokens of a step's packed sequences over those at full length."""
        return (self.prompt_len + self.mean_response) / self.seq_len

    @property
    def sequences_per_step(self) -> int:
        """Sequences trained on per step: prompts x group (DPO: chosen and rejected per pair)."""
        return self.prompts_per_step * (2 if self.task == "dpo" else self.group_size)

    @property
    def generates(self) -> bool:
        """DPO trains on stored pairs: it generates nothing."""
        return self.task != "dpo"

    @property
    def has_critic(self) -> bool:
        """PPO trains a value model beside the policy (Ouyang et al. 2022, InstructGPT, Sec. 3.5)."""
        return self.task == "ppo"
