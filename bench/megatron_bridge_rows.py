"""The shared mapping of NVIDIA's published Megatron-Bridge runs to planner requests.

tests/data/megatron_bridge_runs.json holds 172 rows (DGX-H100, DGX-B200, DGX-GB200), every one
trained. This module reads them once and gives each row:

- ``cli_args``: the row as a Megatron-Bridge user would ask the planner for it: ``--stack
  megatron``, the printed layout (tp, pp, cp, vp, ep, GPUs, global and micro-batch, sequence),
  and its recipe's settings read from the row's ``notes`` (distributed optimizer or Megatron
  FSDP and its distributed-optimizer instances, recomputation, CPU activation offload, expert
  tensor parallelism, MTP, the pipeline split that counts embedding and loss or the pipeline layout
  the recipe sets (DEEPSEEK_V3_LAYOUTS), LoRA). It names
  what ran, not what the planner can do today: a row whose request the planner refuses is
  ``expressible = False`` with the planner's own message as ``reason``.
- ``latest``: whether the row is the latest release of its configuration (same model, system,
  precision, task and layout columns); older releases of the same configuration stay with
  ``latest = False`` (the corpus's caveat: software drift, median 5%, up to 73%).
- ``approximations``: what the request leaves out although the planner accepts it (a selective
  recomputation of modules the planner has no policy for, token-dropping routing, ...).

The interface (``Row``, ``load_rows``, ``request``, ``evaluate``) is shared with the step-time
study of issue 28 and kept stable; the mapping underneath grows as rows become expressible.

    python bench/megatron_bridge_rows.py           # one line per row: id, expressible, args or reason
    python bench/megatron_bridge_rows.py --latest  # only the latest release of each configuration
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "megatron_bridge_runs.json"

# The corpus's model names -> planner presets (`plan models`). Llama 3 8B/70B share the 3.1
# presets' shapes (Meta's config.json: same layers, widths and vocabulary; only RoPE scaling
# differs, which holds no memory and no FLOPs). Token-dropping and MTP variants are one model.
MODELS = {
    "LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3.1-405b",
    "DeepSeekV3": "deepseek-v3", "GPT OSS 120B": "gpt-oss-120b",
    "Qwen3_30B_a3B": "qwen3-30b-a3b", "Qwen3_235B_a22B": "qwen3-235b-a22b",
    # Nemotron 3 (planner.models.hybrid). Nemotron 3.5 Lightning 30B-A3B shares Nano's
    # architecture (NVIDIA NeMo Customizer's model reference: "the Nemotron 3 Nano checkpoint,
    # which shares this architecture"; 30B total, 128 experts top-6, 262,144 positions); its
    # recipe's MTP depths are planned with --mtp (nemotron_mtp_depths)
    "Nemotron_3_Nano": "nemotron-3-nano", "Nemotron_3_Super": "nemotron-3-super",
    "Nemotron_3_5_Lightning": "nemotron-3-nano", "Nemotron_3_Ultra": "nemotron-3-ultra",
}
# What the planner can do with a corpus model that has no written family (issue on 2025-2026
# models), by the model name's prefix. A DeepSeek-V4 config.json is planned on the generic path
# (transformers >= 5.24's deepseek_v4, measured), which refuses ep (layouts.rules, generic-layouts);
# no DeepSeek-V4 Flash config ships (none can be fetched where the project is built).
UNWRITTEN_MODELS = {
    "DeepSeekV4": "a DeepSeek-V4 config.json is planned on the generic path, which refuses the row's ep {ep}",
}
GPUS = {"DGX-H100": "h100", "DGX-B200": "b200", "DGX-GB200": "gb200"}


@dataclass(frozen=True)
class Row:
    """One published run and the planner request that states it."""

    id: str
    release: tuple[int, ...]            # (26, 6, 1) for the 26.06.01 container
    model: str                          # as printed ("Qwen3_235B_a22B (tokendrop)")
    family: str                         # the planner preset ("qwen3-235b-a22b"), or "" when unknown
    gpu: str                            # the planner GPU name (h100, b200, gb200)
    system: str                         # as printed (DGX-GB200)
    precision: str                      # normalised: BF16, FP8-CS, MXFP8, NVFP4
    task: str                           # pretrain, sft, lora
    n_gpus: int
    published_tokens_per_s_per_gpu: float
    published_tflops_per_gpu: float
    config_key: tuple[Any, ...]         # model, system, precision, task and layout columns
    latest: bool                        # the latest release of its configuration
    cli_args: tuple[str, ...]           # plan's options for the row, without the program name
    approximations: tuple[str, ...]     # what the request leaves out although the planner accepts it
    expressible: bool                   # the planner accepts cli_args as one fixed layout
    reason: str                         # why not, when not expressible ("" otherwise)
    notes: str                          # the corpus's own notes on the row

    @property
    def command(self) -> str:
        return "plan " + " ".join(self.cli_args)


# Megatron-Bridge's DeepSeek-V3 pipeline layouts with its one MTP module, per (pp, vp), which the
# performance recipes set where their workload config gives none (src/megatron/bridge/recipes/deepseek/
# deepseek_v3.py, layout_map: stored versions at 05d003fb and later, set_deepseek_v3_pipeline_model_
# parallel_layout; perf configs call it after setting pp and vp): the embedding costs no layer, the MTP
# module and the loss three. The 26.04.01 B200 row prints the (8, 2) one.
DEEPSEEK_V3_LAYOUTS = {
    (4, 1): "Et*16|t*16|t*16|t*13mL",
    (8, 1): "Et*8|(t*8|)*6t*5mL",
    (4, 2): "Et*8|(t*8|)*6t*5mL",
    (16, 1): "Et*4|(t*4|)*14tmL",
    (8, 2): "Et*4|(t*4|)*14tmL",
    (4, 4): "Et*4|(t*4|)*14tmL",
}


def release_of(row_id: str) -> tuple[int, ...]:
    """'mbridge-26.06.01-...' -> (26, 6, 1)."""
    m = re.match(r"mbridge-(\d+(?:\.\d+)+)-", row_id)
    if not m:
        raise ValueError(f"{row_id}: no release in the id")
    return tuple(int(x) for x in m.group(1).split("."))


def _int(v: Any, default: int = 1) -> int:
    """A printed layout column: 'n/a' and 'not printed' are Megatron's default of 1."""
    return int(v) if isinstance(v, int) or (isinstance(v, str) and v.isdigit()) else default


def precision_of(row: dict) -> str:
    """The row's precision, normalised: the 26.xx tables' 'FP8' is FP8 current scaling (the
    corpus's notes), and 25.xx's 'FP8-MX' is MXFP8."""
    p = row["settings"]["precision"]
    if p in ("FP8", "FP8-CS"):
        return "FP8-CS"
    if p in ("FP8-MX", "MXFP8"):
        return "MXFP8"
    return p


def family_of(model: str) -> str:
    base = model.split(" (")[0]
    return MODELS.get(base, "")


def fsdp_of(row: dict) -> int:
    """Megatron FSDP's shard degree (0: the distributed optimizer). 'not printed' is 0 where the
    recipe says use_megatron_fsdp=False and wherever no recipe was matched (Megatron-Bridge's
    default)."""
    v = row["settings"]["fsdp"]
    return _int(v, 0)


def config_key(row: dict) -> tuple[Any, ...]:
    s = row["settings"]
    return (s["model"], s["system"], precision_of(row), s["task"], s["gpus"], s["gbs"], s["mbs"], s["seq"],
            fsdp_of(row), _int(s["tp"]), _int(s["pp"]), _int(s["cp"]), _int(s["vp"]), _int(s["ep"]))


_OFFLOAD = re.compile(r"cpu_offloading_num_layers=(\d+)")
_BLOCK = re.compile(r"recompute: full, method block, (\d+) layer")
_MODULES = re.compile(r"recompute modules (\[[^\]]*\])")


def _n_layers(family: str) -> int:
    from planner.models.spec import load_model
    return load_model(family).n_layers


def args_of(row: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(cli_args, approximations) for one corpus row, read from its settings and notes."""
    s, notes = row["settings"], row["notes"]
    family = family_of(s["model"]) or s["model"]
    tp, pp, cp, vp, ep = (_int(s[k]) for k in ("tp", "pp", "cp", "vp", "ep"))
    n = s["gpus"]
    approx: list[str] = []
    args = ["--model", family, "--gpus", GPUS[s["system"]], "--stack", "megatron", "--n-gpus", str(n),
            "--tp", str(tp), "--pp", str(pp), "--cp", str(cp)]
    if ep > 1:
        args += ["--ep", str(ep)]
    dense_dp = n // (tp * pp * cp)           # Megatron's data-parallel size
    if ep > 1 and dense_dp % ep == 0:
        args += ["--dp", str(dense_dp // ep)]    # the planner's dp: world = dp x tp x pp x cp x ep
    elif ep == 1:
        args += ["--dp", str(dense_dp)]
    # else: EP folded over tp x cp (Megatron-Core MoE parallel folding): dp follows from --n-gpus
    if ep > 1 and (tp > 1 or dense_dp % ep):
        args += ["--etp", "1"]               # the recipes' expert TP 1 (folding over tp needs it)
    if vp > 1:
        args += ["--vp", str(vp)]
    mbs, why_mbs = micro_batch_of(row)
    if why_mbs:
        approx.append(why_mbs)
    args += ["--seq-len", str(s["seq"]), "--micro-batch", str(mbs), "--global-batch", str(s["gbs"])]
    flags = recipe_other(row)
    fsdp = fsdp_of(row) or bool(flags.get("use_megatron_fsdp"))
    args += ["--fsdp", "full"] if fsdp else ["--zero", "1"]
    instances = flags.get("num_distributed_optimizer_instances", 1)
    if instances > 1:
        # Megatron FSDP as HSDP (Nemotron 3 Ultra: Megatron-Bridge perf_recipes/nemotronh/common.py
        # _apply_nemotron_3_ultra_fsdp_hsdp at the corpus's commit 020041f: 256 GPUs / 64 = 4
        # instances, outer_dp_sharding_strategy "optim" where there is more than one, which the
        # planner models under --fsdp full)
        args += ["--optimizer-instances", str(instances)]
    # precision
    prec = precision_of(row)
    # Megatron-Bridge's bf16_with_fp8_current_scaling_mixed and bf16_with_mxfp8_mixed set
    # fp8_param_gather = True (src/megatron/bridge/training/mixed_precision.py)
    if prec == "FP8-CS":
        args += ["--precision", "fp8", "--fp8-recipe", "tensorwise", "--fp8-param-gather"]   # TE current scaling
    elif prec == "MXFP8":
        args += ["--precision", "fp8", "--fp8-recipe", "mxfp8", "--fp8-param-gather"]
    elif prec == "NVFP4":
        args += ["--precision", "nvfp4"]
        args += bf16_layers_of(s["model"])
    else:
        args += ["--precision", "bf16-mixed"]
    # recomputation
    block = _BLOCK.search(notes)
    if block:
        args += ["--recompute", "full", "--recompute-method", "block", "--recompute-num-layers", block.group(1)]
    elif _MODULES.search(notes):    # Megatron-Core's recompute_modules, as the recipe lists them
        mods = re.findall(r"'([a-z_]+)'", _MODULES.search(notes).group(1))   # type: ignore[union-attr]
        args += ["--recompute", "selective", "--recompute-modules", ",".join(mods)]
    elif _says_no_recompute(notes) and flags.get("recompute_modules"):
        # the notes name no recipe for the row; its recipe_flags come from the recipe the corpus
        # chose by model, GPU, precision and layout: its recompute_modules, those the planner models
        from planner.memory.recompute import MODULES
        mods = [x for x in flags["recompute_modules"] if x in MODULES]
        left = [x for x in flags["recompute_modules"] if x not in MODULES]
        if left:
            approx.append(f"recompute module(s) {', '.join(left)} (megatron-core recomputes the whole MoE layer) "
                          "not modelled: planned without, which keeps more (the predicted peak is larger)")
        args += ["--recompute", "selective", "--recompute-modules", ",".join(mods)]
    else:
        args += ["--recompute", "none"]
        if _says_no_recompute(notes):
            approx.append("no recipe matched: recomputation assumed none")
    if flags.get("fine_grained_activation_offloading"):
        approx.append(f"fine-grained activation offload of {', '.join(flags.get('offload_modules') or [])} "
                      "(megatron-core offload_modules) not modelled: those inputs are counted on the GPU (the "
                      "predicted peak is larger)")
    off = _OFFLOAD.search(notes)
    if off:
        args += ["--offload-activations", off.group(1)]
    if "embedding and the loss as layers" in notes:
        args += ["--pp-balance", "embedding-loss"]
    elif pp > 1 and family_of(s["model"]):
        chunks = pp * vp
        layers = _n_layers(family)
        if layers % chunks and (layers + 2) % chunks == 0:
            args += ["--pp-balance", "embedding-loss"]
            approx.append("no recipe note: the pipeline split counting embedding and loss is the only one "
                          f"that divides {layers} layers into {chunks} chunks")
    if "one MTP module" in notes:
        args += ["--mtp", "1"]
        if pp > 1 and "--pp-balance" not in args:
            printed = str(flags.get("pp_layout") or "")
            if printed and "default" not in printed:
                args += ["--pp-layout", printed]        # as printed, verbatim
            elif (pp, vp) in DEEPSEEK_V3_LAYOUTS:
                args += ["--pp-layout", DEEPSEEK_V3_LAYOUTS[pp, vp]]
                approx.append(f"pipeline layout not printed: Megatron-Bridge's DeepSeek-V3 default for pp {pp}, vp "
                              f"{vp}, {DEEPSEEK_V3_LAYOUTS[pp, vp]} (set_deepseek_v3_pipeline_model_parallel_layout)")
            else:
                args += ["--pp-balance", "embedding-loss-mtp"]
                approx.append("pipeline layout not printed and no recipe default: the embedding, the loss and the "
                              "MTP module counted as layers of the split (--pp-balance embedding-loss-mtp)")
    elif depths := nemotron_mtp_depths(row):
        args += ["--mtp", str(depths)]
    args += runtime_args(row, ep, prec)
    if "tokendrop" in s["model"] or "token-dropping" in notes:
        approx.append("token-dropping routing planned as dropless (balanced routing drops nothing)")
    if s["task"] == "pretrain" and family.startswith("llama3"):
        # Megatron-Bridge's Llama 3 pretraining recipes, which the performance configs start from,
        # set Transformer Engine's cross entropy (src/megatron/bridge/recipes/llama/llama3.py,
        # _llama3_common: model_cfg.cross_entropy_fusion_impl = "te"); its LoRA recipes turn the
        # fusion off (cross_entropy_loss_fusion = False), and SFT is left at native (larger)
        args += ["--cross-entropy", "te"]
    approx += nemotron_approximations(s["model"])
    if s["task"] == "lora":
        args += ["--method", "lora", "--lora-rank", "32", "--lora-alpha", "32",
                 "--lora-targets", "q_proj,k_proj,v_proj"]      # Megatron's linear_qkv
    elif s["task"] == "sft":
        approx.append("SFT on packed sequences planned as full training")
    return tuple(args), tuple(approx)


# Layers each row's precision recipe keeps in BF16 (megatron-core's first_last_layers_bf16, planned
# as --bf16-layers START,END; Megatron-Bridge src/megatron/bridge/training/mixed_precision.py):
# the Nemotron 3 Super NVFP4 perf recipes take nemotron_3_super_bf16_with_nvfp4_mixed
# (first_last_layers_bf16 True, num_layers_at_end_in_bf16 14, the start left at the config's 0:
# the last 14 of 88 layers), in perf_recipes/nemotronh (_nemotron_3_super_precision, at the corpus's
# commit 020041f) and in scripts/performance/configs/nemotronh/nemotron_3_llm_pretrain.py
# (set_nemotron_3_super_common_configs) of the 26.x releases; the Llama NVFP4 recipes take
# bf16_with_nvfp4_mixed (none kept); the FP8 current-scaling perf precision turns them off
# (perf_recipes/_common.py and scripts/performance/utils/precision.py: get_precision_config("fp8_cs")
# sets first_last_layers_bf16 = False); bf16_with_mxfp8_mixed keeps none.
BF16_LAYERS_NVFP4 = {"Nemotron_3_Super": (0, 14)}


def bf16_layers_of(model: str) -> list[str]:
    """--bf16-layers for an NVFP4 row of ``model``, as its recipe keeps them (BF16_LAYERS_NVFP4), or []."""
    kept = BF16_LAYERS_NVFP4.get(model.split(" (")[0])
    return ["--bf16-layers", f"{kept[0]},{kept[1]}"] if kept else []


def _says_no_recompute(notes: str) -> bool:
    """Whether the corpus's notes leave the row's recomputation unread (no recipe matched)."""
    return not notes.strip() or "no recipe found" in notes


def recipe_other(row: dict) -> dict[str, Any]:
    """The row's recipe settings beyond the runtime flags (recipe_flags.other: recompute_modules,
    use_megatron_fsdp, num_distributed_optimizer_instances, fine_grained_activation_offloading,
    ...), as the corpus read them from the Megatron-Bridge recipe; {} where there are none."""
    return (row.get("recipe_flags") or {}).get("other") or {}


def micro_batch_of(row: dict) -> tuple[int, str]:
    """(the micro-batch that ran, why it is not the printed one or ""). Megatron's batch
    arithmetic is global batch = micro-batch x data-parallel x accumulation (data-parallel =
    GPUs / (tp x pp x cp)); where the printed accumulation breaks it and the recipe file gives
    another micro-batch (the corpus's recipe_flags.layout_differs), the recipe's ran. 2 of the
    50 rows that print their accumulation break it, and in both the recipe differs: 25.09's
    Llama 3 70B FP8-MX row prints one micro-batch column (2) for its two variants, the
    parenthesised layout's 128 = 1 x 8 x 16; 25.11's GPT-OSS 120B H100 row prints gbs 512, mbs 4,
    dp 16, ga 2 (4 x 16 x 2 = 128), its recipe mbs 1."""
    s = row["settings"]
    mbs, ga = s["mbs"], s["ga"]
    differs = ((row.get("recipe_flags") or {}).get("layout_differs") or {}).get("mbs", "")
    m = re.search(r"file (\d+)", differs)
    if not m or not isinstance(ga, int):
        return mbs, ""
    dp = s["gpus"] // (_int(s["tp"]) * _int(s["pp"]) * _int(s["cp"]))
    if s["gbs"] == mbs * dp * ga:
        return mbs, ""
    recipe = int(m.group(1))
    return recipe, (f"printed micro-batch {mbs} breaks the printed batch arithmetic (gbs {s['gbs']} != {mbs} x dp "
                    f"{dp} x ga {ga}); planned at the recipe's micro-batch {recipe}")


# The MTP depths Nemotron 3 Super's perf runs train: its base recipe, which
# perf_recipes/nemotronh/common.py imports as nemotron_3_super_pretrain_config and whose MTP settings
# no perf recipe overrides (Megatron-Bridge recipes/nemotronh/h100/nemotron_3_super.py, a stored
# version at 0cabbd5: mtp_num_layers 2, mtp_use_repeated_layer, keep_mtp_spec_in_bf16). Lightning's
# and Ultra's rows carry theirs in the corpus (recipe_flags.other.mtp_num_layers: 2).
SUPER_MTP_DEPTHS = 2


def nemotron_mtp_depths(row: dict) -> int:
    """The MTP depths a Nemotron 3 row's recipe trains (--mtp): the corpus's recipe flag, else
    Super's base recipe's (SUPER_MTP_DEPTHS); 0 for the other rows (Nano's recipes train none)."""
    depths = recipe_other(row).get("mtp_num_layers")
    if depths:
        return int(depths)
    return SUPER_MTP_DEPTHS if row["settings"]["model"].startswith("Nemotron_3_Super") else 0


def nemotron_approximations(model: str) -> list[str]:
    """What a Nemotron row's request leaves out: Lightning's own checkpoint (planned as Nano's
    architecture) and the MTP depths' shared weights (planned as Megatron-Core places MTP
    modules, each its own layers' memory). (The corpus matched no recipe for these rows:
    recomputation assumed none is named by args_of.)"""
    out = []
    if model.startswith("Nemotron_3_5_Lightning"):
        out.append("Nemotron 3.5 Lightning planned as Nemotron 3 Nano's architecture (NVIDIA's model "
                   "reference) with its recipe's two MTP depths")
    if model.startswith(("Nemotron_3_5_Lightning", "Nemotron_3_Super", "Nemotron_3_Ultra")):
        out.append("the two MTP depths share one layer's weights (mtp_use_repeated_layer); the memory "
                   "model holds a mean layer per depth")
    return out


def runtime_args(row: dict, ep: int, precision: str) -> list[str]:
    """--moe-a2a-overlap, --cuda-graphs, --moe-dispatcher and --fp8-attention as the row's recipe set
    them (the corpus's recipe_flags, read from the Megatron-Bridge workload configs: moe_a2a_overlap,
    cuda_graph_impl and cuda_graph_scope, the flex dispatcher's DeepEP or HybridEP backend,
    fp8_dot_product_attention); nothing where the row has no
    recipe_flags (the planner's defaults). megatron-core's default is no overlap, so a recipe that
    does not set it runs without; 'auto' (not 'on') where it does, as megatron-core runs it only
    where it can (training.moe_runtime)."""
    f = row.get("recipe_flags")
    if not f:
        return []
    out: list[str] = []
    if ep > 1:
        out += ["--moe-a2a-overlap", "auto" if f.get("moe_a2a_overlap") else "off"]
    impl, scope = f.get("cuda_graph_impl"), f.get("cuda_graph_scope") or []
    if impl == "full_iteration" or "full_iteration" in scope:
        out += ["--cuda-graphs", "full-iteration"]
    elif impl not in (None, "none") and {"moe_router", "moe_preprocess"} & set(scope):
        out += ["--cuda-graphs", "moe"]       # router and preprocessing captured; the dropless sync stays
    if ep > 1 and f.get("dispatcher") in ("deepep", "hybridep"):
        out += ["--moe-dispatcher", "flex"]        # moe_token_dispatcher_type flex, that backend
    other = f.get("other") or {}
    if other.get("fp8_dot_product_attention") and precision in ("FP8-CS", "MXFP8"):
        out += ["--fp8-attention"]
    return out


def _check(args: tuple[str, ...]) -> str:
    """'' when the planner takes args as one fixed layout, else its message."""
    from planner.errors import UserError
    try:
        request(args)
    except UserError as e:
        return str(e)
    except SystemExit:                     # click's own usage errors
        return "option not known to plan"
    return ""


def options(args: tuple[str, ...] | list[str]) -> Any:
    """plan's Options for args, parsed by plan's own click command."""
    import click

    from planner.cli.main import cli
    from planner.cli.options import Options
    from planner.errors import UserError
    try:
        ctx = cli.make_context("plan", list(args), resilient_parsing=False)
    except click.ClickException as e:
        raise UserError(" ".join(e.format_message().split())) from None
    return Options.from_click(ctx.params)


def request(args: tuple[str, ...] | list[str]) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
    """(model, gpu, setup, layout, timing kwargs) as `plan` builds them for args (one fixed
    layout); raises planner.errors.UserError where plan refuses."""
    from planner import api
    from planner.cli.request import build_request, timing, within_topology
    from planner.errors import UserError
    from planner.layouts.layout import reject_reason

    o = options(args)
    m, gpu, setup, space, n_gpus = build_request(o)
    lay = api.fixed_layout(space, setup, n_gpus)
    if lay is None:
        raise UserError("the options leave the layout open")
    o = within_topology(o, gpu, lay.n_gpus)
    why = reject_reason(m, setup, lay, gpu.gpus_per_node)
    if why:
        raise UserError(f"layout {lay.describe()} cannot run: {why}")
    return m, gpu, setup, lay, timing(o, gpu)


def evaluate(row: Row) -> Any:
    """planner.api.PlanResult for the row's request, exactly as `plan` evaluates it."""
    from planner import api
    m, gpu, setup, lay, kw = request(row.cli_args)
    return api.evaluate_layout(m, gpu, setup, lay, **kw)


@cache
def load_rows(path: Path = CORPUS, check: bool = True) -> tuple[Row, ...]:
    """Every row of the corpus, in its order. With check, each request is parsed and validated
    by the planner (expressible, reason); without it, only unknown models are marked."""
    data = json.loads(path.read_text())["rows"]
    newest: dict[tuple[Any, ...], tuple[int, ...]] = {}
    for r in data:
        k, rel = config_key(r), release_of(r["id"])
        newest[k] = max(newest.get(k, rel), rel)
    out = []
    for r in data:
        s = r["settings"]
        family = family_of(s["model"])
        args, approx = args_of(r)
        if not family:
            reason = f"model {s['model']} has no written family and no preset (issue on 2025-2026 models)"
            reason += "".join(f"; {why.format(ep=s['ep'])}" for prefix, why in UNWRITTEN_MODELS.items()
                              if s["model"].replace(" ", "").startswith(prefix))
        else:
            reason = _check(args) if check else ""
            if "megatron-core: world size not divisible" in reason:
                # the planner's rule ep-fold-divides, megatron-core's own check: as printed, the
                # layout could not have run (etp 1 x ep x pp exceeds the GPUs), so a misprint
                reason += "; as printed the row cannot have run in megatron-core: a misprint"
        out.append(Row(id=r["id"], release=release_of(r["id"]), model=s["model"], family=family,
                       gpu=GPUS[s["system"]], system=s["system"], precision=precision_of(r), task=s["task"],
                       n_gpus=s["gpus"], published_tokens_per_s_per_gpu=r["published"]["tokens_per_s_per_gpu"],
                       published_tflops_per_gpu=r["published"]["tflops_per_gpu"], config_key=config_key(r),
                       latest=newest[config_key(r)] == release_of(r["id"]), cli_args=args,
                       approximations=approx, expressible=not reason, reason=reason, notes=r["notes"]))
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latest", action="store_true", help="only the latest release of each configuration")
    a = ap.parse_args(argv)
    rows = [r for r in load_rows() if r.latest or not a.latest]
    for r in rows:
        print(f"{r.id}  {'ok ' if r.expressible else 'NO '} {r.command if r.expressible else r.reason}")
    ok = sum(r.expressible for r in rows)
    known = sum(bool(r.family) for r in rows)
    print(f"\n{ok} of {len(rows)} rows expressible ({known} of known models); "
          f"{sum(r.latest for r in rows)} latest of their configuration")
    return 0


if __name__ == "__main__":
    sys.exit(main())
