"""What each training stack does: the files --out writes for it, how it launches, and its names.

The facts are data (planner/stacks/catalog.toml, each entry with the stack's file and
version); this module loads them and decides which stack runs a layout:

    hf          Hugging Face transformers + accelerate, PyTorch FSDP2 (no pipeline parallelism)
    deepspeed   DeepSpeed ZeRO data parallelism (ZeRO-0 to 3, no tensor/pipeline/context split)
    megatron    Megatron-LM: tensor, sequence, pipeline, context and expert parallelism
    torchtitan  torchtitan 0.3.0: FSDP2/HSDP with tensor, pipeline and context parallelism,
                for Llama-architecture models

``default_stack`` is the choice when the user gives none: the stack whose kernels the memory
model used (fused: megatron), else the one the emitters made before --stack existed (FSDP
with pipeline parallelism under torchtitan, which supports it, where Megatron-LM's
validate_args refuses --use-torch-fsdp2 with pp > 1). ``default_stack_reason`` says why, on
the plan's stack line.
``stack_refusal`` says why a stack cannot run a plan, as one line a user can act on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.errors import UserError
from planner.training.setup import STACKS

if TYPE_CHECKING:
    from planner.layouts.layout import Layout
    from planner.models.spec import ModelSpec

_KEYS = {"title", "version", "files", "launcher", "kernels", "recompute", "loss", "sharding", "layouts", "source"}

# Hugging Face model types whose blocks torchtitan 0.3.0's Llama 3 model builds exactly:
# RMSNorm, SwiGLU, RoPE, GQA, no biases (torchtitan/models/llama3/__init__.py,
# _build_llama3_layers); Mistral 7B is the same block with another rope base.
TORCHTITAN_MODEL_TYPES = ("llama", "mistral")


@dataclass(frozen=True, kw_only=True, slots=True)
class Stack:
    """One stack's facts, as catalog.toml gives them."""

    name: str
    title: str
    version: str
    files: tuple[str, ...]          # what --out writes besides plan.json (and scheduler files)
    launcher: str
    kernels: str
    recompute: dict[str, str]       # planner --recompute value -> the stack's name for it
    loss: str
    sharding: dict[str, str]        # planner sharding (zero-N, fsdp-*) -> the stack's setting
    layouts: str
    source: str


@functools.cache
def load_stacks() -> dict[str, Stack]:
    """The stack catalog, by name (unknown or missing keys are an error in the catalog)."""
    import importlib.resources  # here, not at the top: `plan --help` reads STACKS and needs no file
    import tomllib

    text = importlib.resources.files("planner.stacks").joinpath("catalog.toml").read_text(encoding="utf-8")
    out: dict[str, Stack] = {}
    for name, row in tomllib.loads(text)["stack"].items():
        if set(row) != _KEYS:
            raise ValueError(f"stacks/catalog.toml [{name}]: keys {sorted(set(row) ^ _KEYS)} wrong")
        out[name] = Stack(name=name, **{**row, "files": tuple(row["files"])})
    if tuple(sorted(out)) != tuple(sorted(STACKS)):
        raise ValueError(f"stacks/catalog.toml: expected {STACKS}, found {sorted(out)}")
    return out


def get_stack(name: str) -> Stack:
    if name not in STACKS:
        raise UserError(f"--stack {name!r}: choose one of {', '.join(STACKS)}")
    return load_stacks()[name]


def torchtitan_builds(m: ModelSpec) -> str | None:
    """None when torchtitan 0.3.0's Llama 3 model builds ``m`` exactly, else why not."""
    if m.model_type not in TORCHTITAN_MODEL_TYPES or m.is_moe:
        return (f"torchtitan 0.3.0 builds Llama-architecture models here ({', '.join(TORCHTITAN_MODEL_TYPES)}); "
                f"{m.name} is a {m.model_type} model")
    if m.qkv_bias or m.out_bias or m.mlp_bias or m.norm != "rmsnorm" or not m.gated_mlp or m.position != "rope":
        return f"torchtitan's Llama 3 block has RMSNorm, SwiGLU, RoPE and no biases; {m.name} differs"
    if m.head_dim * m.n_heads != m.d_model:
        return f"torchtitan's Llama 3 attention uses head_dim = dim / n_heads; {m.name} has head_dim {m.head_dim}"
    return None


def default_stack(m: ModelSpec, lay: Layout, kernels: str | None = None) -> str:
    """The stack that runs ``lay`` when the user names none.

    ``kernels``: the kernels the memory model used for the layout (planner.memory.activations.
    layout_kernels); the stack follows them, so the memory profile on screen and the files
    --out writes describe one stack. Fused (Megatron-style, what ``--kernels auto`` picks for
    tp, pp or cp): megatron. Otherwise FSDP without pipeline parallelism: hf (accelerate/
    torchrun, FSDP2; accelerate's ParallelismConfig takes tp and cp). FSDP with pipeline
    parallelism: torchtitan when it builds the model, else megatron (Megatron FSDP; its
    --use-torch-fsdp2 refuses pp > 1). Tensor, pipeline or context parallelism otherwise:
    megatron. Pure data parallelism with ZeRO: deepspeed.
    """
    if kernels == "fused":
        return "megatron"
    if lay.is_fsdp and lay.pp == 1:
        return "hf"
    if lay.is_fsdp and torchtitan_builds(m) is None and lay.ep == 1:
        return "torchtitan"
    if lay.tp > 1 or lay.pp > 1 or lay.cp > 1 or lay.is_fsdp:
        return "megatron"
    return "deepspeed"


def default_stack_reason(m: ModelSpec, lay: Layout, kernels: str) -> str:
    """Why default_stack chose its stack for ``lay``, in a few words (the plan's stack line)."""
    stack = default_stack(m, lay, kernels)
    split = ", ".join(f"{k}={v}" for k, v in (("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp)) if v > 1)
    if stack == "megatron" and kernels == "fused":
        why = f"{split}: fused kernels" if split else "--kernels fused"
    elif stack == "megatron":
        why = f"{split or 'FSDP with pp'}: only Megatron-LM runs it"
    elif stack == "hf":
        why = "FSDP without pp: eager kernels"
    elif stack == "torchtitan":
        why = "FSDP with pp; its profile needs --stack torchtitan"
    else:
        why = f"ZeRO-{lay.zero_stage} {'data parallelism' if lay.dp > 1 else 'on one GPU'}: eager kernels"
    return f"{stack} by default ({why})"


def runs_expandable_segments(stack: str) -> bool:
    """Whether the stack's own launchers run PyTorch's caching allocator with expandable segments
    (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), so that --out's launch files set it too
    (emit.launch.stack_env) and the plan's Assumptions line says so.

    torchtitan: its run_train.sh starts torchrun under PYTORCH_ALLOC_CONF="expandable_segments:True".
    megatron: Megatron-Bridge's performance scripts set it for the recipes that fill the GPU
    (scripts/performance/perf_plugins.py, PerfEnvPlugin._set_model_specific_environment_variables:
    Llama 3.1 405B FP8 on GB200, DeepSeek-V3 on H100 and GB200, Llama 3 70B FP8 fine-tuning) and its
    DGX Cloud executor for every run (scripts/performance/utils/executors.py, dgxc_executor). hf
    (accelerate) and deepspeed (its launcher) set nothing: PyTorch's default allocator."""
    return stack in ("torchtitan", "megatron")


def runs_megatron_deepspeed(stack: str, lay: Layout) -> bool:
    """Whether ``stack`` runs ``lay`` as Megatron-DeepSpeed: --stack deepspeed with tensor or
    pipeline parallelism (BLOOM 176B and MT-NLG 530B trained so: Megatron's tp, DeepSpeed's
    pipeline engine and ZeRO-1), whose files are megatron_args.txt (pretrain_gpt.py's arguments)
    beside ds_config.json."""
    return stack == "deepspeed" and (lay.tp > 1 or lay.pp > 1)


def reads_megatron_args(stack: str, lay: Layout) -> bool:
    """Whether the plan's program is a Megatron pretrain_gpt.py reading megatron_args.txt:
    Megatron-LM, or Megatron-DeepSpeed (runs_megatron_deepspeed)."""
    return stack == "megatron" or runs_megatron_deepspeed(stack, lay)


def stack_refusal(stack: str, m: ModelSpec, lay: Layout) -> str | None:
    """Why ``stack`` cannot run ``lay`` of ``m`` (one line naming the way out), or None: the
    first of the layout rules' STACK_REFUSALS that fails (planner.layouts.rules, the table
    the search reads)."""
    from planner.layouts.rules import STACK_REFUSALS, RuleView
    from planner.training.setup import TrainingSetup

    view = RuleView.of(m, TrainingSetup(stack=stack, seq_len=lay.seq_len), lay, gpus_per_node=1)
    for fails, message in STACK_REFUSALS.get(stack, ()):
        if fails(view):
            return message(view, lay)
    return None


def check_stack(stack: str, m: ModelSpec, lay: Layout) -> None:
    """UserError when ``stack`` cannot run the plan, naming the stacks that can."""
    get_stack(stack)
    why = stack_refusal(stack, m, lay)
    if why is not None:
        others = [s for s in STACKS if s != stack and stack_refusal(s, m, lay) is None]
        raise UserError(f"{why} (stacks that run this plan: {', '.join(others) or 'none'})")


def memory_profile_line(stack: str, recompute: str, setup_compile: bool = False, recompute_every: int = 1,
                        recompute_method: str = "uniform", recompute_num_layers: int = 1,
                        recompute_modules: tuple[str, ...] = ()) -> str:
    """One line naming the stack settings the memory model followed (the plan's Assumptions):
    under --stack megatron, the recompute method and layers, or the --recompute-modules given."""
    s = get_stack(stack)
    rc = s.recompute.get(recompute, recompute)
    if stack == "megatron" and recompute == "full":
        rc = (f"--recompute-granularity full --recompute-method {recompute_method} "
              f"--recompute-num-layers {recompute_num_layers}")
    elif stack == "megatron" and recompute == "selective" and recompute_modules:
        rc = f"--recompute-granularity selective (--recompute-modules {' '.join(recompute_modules)})"
    every = f", every {recompute_every}th block only" if recompute_every > 1 and recompute != "none" else ""
    compiled = ", torch.compile per block" if setup_compile else ""
    return (f"stack: {s.name} ({s.version}): recompute {recompute} = {rc}{every}; loss: {s.loss}; "
            f"kernels: {s.kernels}{compiled}")


def stack_summary(stack: str, chosen_by: str) -> dict[str, Any]:
    """What plan.json and --json say about the stack: its name, version and why it was chosen."""
    s = get_stack(stack)
    return {"name": s.name, "title": s.title, "version": s.version, "chosen": chosen_by, "source": s.source}
