"""Measure a GenericProfile on transformers' own model (torch and transformers imported here
only, the first time a config is seen; planner.models.generic.cache keeps the answer).

Parameters: the model built on the meta device (``torch.device("meta")``; see build_meta for
why not accelerate's ``init_empty_weights``), summed once per tensor (a tied head counts
once, as ``Module.parameters()`` does) and split by module kind from the classes holding it
and its path (see classify).

Saved tensors and FLOPs: the same config built under FakeTensorMode in bf16 (no memory, no
arithmetic), one forward and backward of one sequence at each of two lengths, on a copy cut to
its first blocks where one holds every kind of block twice (_measure_fake_copy; each later block
takes its kind's measured terms). Saved tensors are read with
``torch.autograd.graph.saved_tensors_hooks``, those still held when the forward ends (each
storage once, parameters excluded: held_bytes), and charged to the block running when autograd
saved them; FLOPs with ``torch.utils.flop_counter.FlopCounterMode`` per module.
FlopCounterMode has no formula for ``aten._grouped_mm``, the routed experts' kernel of
transformers 5.x, so its routed experts would count 0 FLOPs (FACTS.md); grouped_mm_flops is
registered for it here.
"""

from __future__ import annotations

import gc
import re
import weakref
from collections import defaultdict
from typing import Any

from planner.errors import UserError
from planner.models.generic.profile import BlockProfile, GenericProfile

# The two sequence lengths the block terms are read at. Short, because transformers'
# reference scans run in Python loops (Mamba-1's is one step per token) and their cost under
# fake tensors grows with the length; multiples of gated DeltaNet's chunk of 64. Mamba-2's
# reference scan pads to its chunk_size (256), so at 128 a fixed padding shows up per token:
# _fit then keeps the value at 256 (exact there) and no growing term.
SEQ_LENS = (128, 256)

# The module kind of a parameter, read from the class names of the modules that hold it,
# innermost first (NemotronHBlock calls every sub-layer "mixer", so paths alone mislead):
_CLASS_KINDS = (
    ("norms", re.compile(r"norm", re.IGNORECASE)),
    ("experts", re.compile(r"(moe|expert|router|topk)", re.IGNORECASE)),
    ("mixer", re.compile(r"(mamba|mixer|deltanet|delta|linearattention|lightning|ssm|rwkv|lstm|recurrent|"
                         r"shortconv|hyena)", re.IGNORECASE)),
    ("attention", re.compile(r"(attention|attn)", re.IGNORECASE)),
    ("mlp", re.compile(r"(mlp|feedforward|ffn)", re.IGNORECASE)),
)
# ... and where no class says, from the parameter's path
_PATH_KINDS = (
    ("norms", re.compile(r"(^|\.)(\w*norm\w*|ln_\d|ln\d)(\.|$)", re.IGNORECASE)),
    ("mlp", re.compile(r"shared_expert", re.IGNORECASE)),
    ("experts", re.compile(r"(experts|router|(^|\.)gate(\.|$)|e_score)", re.IGNORECASE)),
    ("mixer", re.compile(r"(mamba|ssm|linear_attn|conv1d|A_log|dt_bias|time_mix|rwkv|delta)", re.IGNORECASE)),
    ("attention", re.compile(r"(attn|attention|q_proj|k_proj|v_proj|o_proj|qkv|query|key|value)",
                             re.IGNORECASE)),
    ("mlp", re.compile(r"(mlp|feed_forward|ffn|fc1|fc2|h_to_4h|4h_to_h|up_proj|down_proj|gate_proj|c_fc)",
                       re.IGNORECASE)),
)


def classify(param_path: str, module_classes: list[str]) -> str:
    """The module kind of one parameter inside a block: from the class names of the modules
    holding it (innermost first; the block's own class excluded), else from its path; shared
    experts count as MLP (a dense MLP every token runs)."""
    if "shared_expert" in param_path.lower() and not any("norm" in c.lower() for c in module_classes[:1]):
        return "mlp"
    for cls in module_classes:
        for kind, pattern in _CLASS_KINDS:
            if pattern.search(cls):
                return kind
    for kind, pattern in _PATH_KINDS:
        if pattern.search(param_path):
            return kind
    return "other"


def hf_config(cfg: dict[str, Any]) -> Any:
    """transformers' config object for a config.json dict (its model_type's class). The dict
    is deep-copied: transformers writes into nested dicts (rope_scaling gains rope_theta and
    rope_type), which changed the caller's config, and so its cache key, under the caller."""
    import copy

    from transformers import AutoConfig

    cfg = copy.deepcopy(cfg)
    model_type = cfg.pop("model_type")
    for key in ("_attn_implementation", "attn_implementation", "torch_dtype", "dtype", "auto_map",
                "architectures", "quantization_config"):
        cfg.pop(key, None)
    config = AutoConfig.for_model(model_type, **cfg)
    config.use_cache = False
    if getattr(config, "default_language", "") is None and getattr(config, "languages", None):
        # X-MOD runs one language adapter per input and stops without a language
        # (XmodPreTrainedModel.set_default_language); its adapters all have one shape, so the
        # profile runs the first of ``languages``
        config.default_language = list(config.languages)[0]
    return config


def unset_router(config: Any) -> str | None:
    """Why a config's routed experts cannot run, or None: experts but ``num_experts_per_tok``
    null (transformers 5.x DeepseekV2Config's default: its router's torch.topk then fails with
    "k must be int, not NoneType"; transformers' own tests set 2, tests/causal_lm_tester.py
    CausalLMModelTester). Read from the config object, so its class's defaults count."""
    experts = any(isinstance(getattr(config, k, None), int) and getattr(config, k) > 0
                  for k in ("n_routed_experts", "num_experts", "num_local_experts"))
    if experts and hasattr(config, "num_experts_per_tok") and config.num_experts_per_tok is None:
        return (f"num_experts_per_tok is null, so the router of transformers' {config.model_type} model "
                "picks no experts (its config class's default); give num_experts_per_tok in config.json "
                "(the routed experts each token visits)")
    return None


def build_meta(config: Any) -> Any:
    """The causal LM on the meta device (no memory, no weights). ``torch.device("meta")``, not
    accelerate's ``init_empty_weights``: under the latter transformers 5.24's BioGPT came out
    with its output projection untied from the embedding (138,240,000 parameters instead of
    94,838,784)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def block_list(model: Any) -> tuple[str, Any]:
    """The model's blocks: of its ModuleLists, the one holding the most parameters (the
    decoder layers; a hybrid's shared blocks or an MTP list hold fewer)."""
    import torch

    best: tuple[int, str, Any] | None = None
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            n = sum(p.numel() for p in module.parameters())
            if best is None or n > best[0]:
                best = (n, path, module)
    if best is None:
        raise UserError(f"{type(model).__name__}: no list of blocks found; the generic path needs a "
                        "model whose decoder layers sit in one ModuleList")
    return best[1], best[2]


def _block_signature(block: Any) -> tuple[Any, ...]:
    return (type(block).__name__,) + tuple((n, tuple(p.shape)) for n, p in block.named_parameters())


def grouped_mm_flops(a_shape: Any, b_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """FLOPs of ``aten._grouped_mm`` (2 per multiply-add): 2-D x 3-D (tokens sorted by
    expert, M x K times G x K x N) and 3-D x 3-D (G x M x K times G x K x N) contract over
    the first operand's last dim; 2-D x 2-D (the weight gradient, K x M times M x N split
    into G groups along M) contracts over M once in all."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    m = 1
    for d in a_shape[:-1]:
        m *= d
    if len(a_shape) == 3 and len(b_shape) == 2:    # G x M x K times K x N_total split along N
        return 2 * m * a_shape[-1] * b_shape[1] // max(a_shape[0], 1)
    return 2 * m * a_shape[-1] * b_shape[-1]


def profile_config(cfg: dict[str, Any], where: str, whole_model: bool = False) -> GenericProfile:
    """Measure ``cfg`` (a config.json dict) on transformers' causal LM (see the module doc): on
    a copy cut to its first blocks where one builds with the same blocks and agrees with the
    whole model's forward (_measure_fake_copy), else (or with ``whole_model``) on every block."""
    import transformers

    transformers.logging.set_verbosity_error()     # "falling back to its reference PyTorch implementation"
    try:
        config = hf_config(cfg)
        why = unset_router(config)
        meta = build_meta(config) if why is None else None
    except Exception as e:  # noqa: BLE001 -- transformers raises many kinds for a config it cannot build
        raise UserError(f"{where}: transformers {transformers.__version__} cannot build model_type "
                        f"{cfg.get('model_type')!r} as a causal LM ({type(e).__name__}: {_one_line(e)}); "
                        "pass a config.json of a family it builds, or `plan models` for the written ones") from None
    if why is not None:
        raise UserError(f"{where}: {why}")
    blocks_path, blocks = block_list(meta)
    seen: set[int] = set()
    kinds_of_block: list[dict[str, int]] = []
    for block in blocks:
        counts: dict[str, int] = defaultdict(int)
        classes = {path: type(mod).__name__ for path, mod in block.named_modules()}
        for mod_path, module in block.named_modules():
            held_by = [classes[".".join(mod_path.split(".")[:k])] for k in range(mod_path.count(".") + 1, 0, -1)
                       if mod_path]
            for name, p in module.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                counts[classify(f"{mod_path}.{name}".lstrip("."), held_by)] += p.numel()
        kinds_of_block.append(counts)
    embedding, head, final = _outside_blocks(meta, seen)
    sigs = [_block_signature(b) for b in blocks]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, sig in enumerate(sigs):
        groups.setdefault(sig, []).append(i)
    kinds = probe_kinds(config, sigs)
    measured = None if whole_model else _measure_fake_copy(config, blocks_path, sigs, kinds)
    try:
        if measured is None:
            measured = _measure_blocks(config)
    except Exception as e:  # noqa: BLE001 -- any failure of transformers' forward under fake tensors
        if is_data_dependent(e):
            measured = _measure_real_copy(config, blocks_path, sigs, kinds, where, e)
        else:
            raise UserError(f"{where}: transformers' {cfg.get('model_type')} model does not run one training step "
                            f"under fake tensors ({type(e).__name__}: {_one_line(e)}), so the generic path cannot "
                            "measure its activations and FLOPs; a written family is needed") from None
    out: list[BlockProfile] = []
    for sig, idx in groups.items():
        first = idx[0]
        per = {k: kinds_of_block[first].get(k, 0) for k in ("attention", "mixer", "mlp", "experts", "norms", "other")}
        held = "+".join(k for k in ("attention", "mixer", "mlp", "experts") if per[k])
        name = sig[0] if len(groups) == 1 else f"{sig[0]} [{held or 'other'}] (layers {_ranges(idx)})"
        fits = {key: _fit([sum(measured[s][key][i] for i in idx) / len(idx) for s in SEQ_LENS])
                for key in ("saved", "fwd", "bwd")}
        out.append(BlockProfile(
            name=name, n_layers=len(idx), **per,
            saved_bytes_per_token=fits["saved"][0], saved_bytes_per_token_per_seq=fits["saved"][1],
            fwd_flops_per_token=fits["fwd"][0], fwd_flops_per_token_per_seq=fits["fwd"][1],
            bwd_flops_per_token=fits["bwd"][0], bwd_flops_per_token_per_seq=fits["bwd"][1]))
    head_fwd = measured[SEQ_LENS[0]]["outside_fwd"][0]
    return GenericProfile(model_type=str(cfg["model_type"]), transformers_version=transformers.__version__,
                          blocks=tuple(out), embedding=embedding, head=head, final=final,
                          head_fwd_flops_per_token=head_fwd, seq_lens=SEQ_LENS)


def _one_line(e: BaseException) -> str:
    """An exception's message on one line, cut to 160 characters."""
    return " ".join(str(e).split())[:160]


def _outside_blocks(meta: Any, seen: set[int]) -> tuple[int, int, int]:
    """Parameters outside the blocks: (embedding, untied head, the rest). Embedding modules
    (token, position, token-type) count as embedding; the output embedding when it is not
    the input embedding's tensor as head; every other parameter (final norm...) as the rest."""
    import torch

    head_module = meta.get_output_embeddings()
    head_ids = {id(p) for p in head_module.parameters()} if head_module is not None else set()
    embedding = head = final = 0
    for module in meta.modules():
        for p in module.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if isinstance(module, torch.nn.Embedding):
                embedding += p.numel()
            elif id(p) in head_ids:
                head += p.numel()
            else:
                final += p.numel()
    return embedding, head, final


def _ranges(idx: list[int]) -> str:
    """0,1,2,5 -> "0-2, 5"."""
    parts: list[str] = []
    start = prev = idx[0]
    for i in [*idx[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        if i is not None:
            start = prev = i
    return ", ".join(parts)


def _fit(per_token: list[float]) -> tuple[float, float]:
    """(a, b) with per-token value = a + b s through the two sequence lengths. A negative b (a
    fixed-size term, which shrinks per token as s grows) is not extrapolated: the value at
    the longer length is kept as a, b = 0 (an over-estimate for longer sequences)."""
    (s1, s2), (y1, y2) = SEQ_LENS, per_token
    b = (y2 - y1) / (s2 - s1)
    if b < 0:
        return y2, 0.0
    return y1 - b * s1, b


# The largest one-block copy measured with real tensors when fake tensors cannot run the model
# (is_data_dependent): its bf16 parameters, gradients and two short sequences' activations stay
# within a few GiB of the shared 2-core, 24 GiB machines the project is built on
REAL_COPY_MAX_PARAMS = 1_000_000_000


def is_data_dependent(e: BaseException) -> bool:
    """Whether fake tensors failed on an output that depends on the data (``.item()``,
    ``nonzero``: routing counts, masks turned into indices), which real tensors run."""
    names = {type(x).__name__ for x in (e, e.__cause__, e.__context__) if x is not None}
    return bool(names & {"DataDependentOutputException", "DynamicOutputShapeException",
                         "GuardOnDataDependentSymNode"})


def probe_kinds(config: Any, sigs: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Each block's kind for cutting a copy: its signature (class and parameter shapes) and its
    entry in every per-layer list of the config (a list as long as the blocks: transformers 5's
    ``layer_types``, ``mlp_layer_types``...), so that blocks alike in shapes but run
    differently (sliding-window against full attention, hash against learned routing) are not
    taken for one another."""
    n = len(sigs)
    lists = sorted((k, v) for k, v in vars(config).items()
                   if isinstance(v, (list, tuple)) and len(v) == n and not k.startswith("_"))
    return [sig + tuple((k, _hashable(v[i])) for k, v in lists) for i, sig in enumerate(sigs)]


def _hashable(x: Any) -> Any:
    return tuple(_hashable(y) for y in x) if isinstance(x, (list, tuple)) else x if isinstance(
        x, (str, int, float, bool, type(None))) else repr(x)


def copy_depth(kinds: list[tuple[Any, ...]]) -> int:
    """The blocks a cut copy keeps: the shortest run of first blocks that holds each kind twice
    where the model has it twice (each kind's second block stands for the later ones: the first
    block is charged the storages every block shares, the rotary cos/sin saved once)."""
    occurrences = {k: [i for i, x in enumerate(kinds) if x == k] for k in set(kinds)}
    return max(occ[1] if len(occ) > 1 else occ[0] for occ in occurrences.values()) + 1


def cut_config(config: Any, depth: int, n: int) -> Any:
    """A copy of ``config`` with its first ``depth`` of ``n`` blocks: ``num_hidden_layers`` and
    every per-layer list cut to ``depth``."""
    import copy

    small = copy.deepcopy(config)
    for k, v in list(vars(small).items()):
        if isinstance(v, (list, tuple)) and len(v) == n and not k.startswith("_"):
            setattr(small, k, type(v)(v[:depth]))
    small.num_hidden_layers = depth
    return small


def _cut_copy(config: Any, blocks_path: str, sigs: list[tuple[Any, ...]], depth: int) -> tuple[Any, int, str]:
    """(the config cut to ``depth`` blocks, or None where it does not build with the full model's
    first blocks at ``blocks_path``; its parameters; why not)."""
    try:
        small = cut_config(config, depth, len(sigs))
        meta = build_meta(small)
        meta_blocks = meta.get_submodule(blocks_path)     # the full model's list, at the same path
        ok = [_block_signature(b) for b in meta_blocks] == sigs[:depth]
        return (small if ok else None), sum(p.numel() for p in meta.parameters()), "" if ok else "other blocks"
    except Exception as e:  # noqa: BLE001 -- a config class that needs its full depth (ProphetNet's refuses it)
        return None, 0, type(e).__name__


def spread(one: dict[str, list[float]], kinds: list[tuple[Any, ...]], depth: int) -> dict[str, list[float]]:
    """Per-block terms of the whole model from a copy's first ``depth`` blocks: each block the
    copy holds keeps its own; each block past it takes the mean of its kind's blocks in the
    copy after the kind's first (which is also charged what the kind's blocks share: Bailing's
    first attention block holds the rotary tables)."""
    later = {k: [i for i in range(depth) if kinds[i] == k][1:] for k in set(kinds)}
    out = {key: [one[key][i] if i < depth else _mean([one[key][j] for j in later[k]])
                 for i, k in enumerate(kinds)] for key in ("saved", "fwd", "bwd")}
    out["outside_fwd"] = one["outside_fwd"]
    return out


def _mean(xs: list[float]) -> float:
    """The mean, exact where every value is one (a sum divided back can round off)."""
    return xs[0] if all(x == xs[0] for x in xs) else sum(xs) / len(xs)


def _measure_fake_copy(config: Any, blocks_path: str, sigs: list[tuple[Any, ...]],
                       kinds: list[tuple[Any, ...]]) -> dict[int, dict[str, list[float]]] | None:
    """The per-block terms under fake tensors measured on a copy cut to copy_depth blocks,
    spread over the whole model (the run's cost grows with the blocks run, so a deep model's
    first plan takes a fraction of the time). Held to one forward of the whole model at the
    first of SEQ_LENS, without the backward: each block runs once and every block's forward FLOPs and
    saved bytes are the ones spread from the copy; the FLOPs outside the blocks are that
    forward's. None where the copy would hold more than half the blocks, does not build with the
    full model's first blocks, does not run or does not agree (the caller then runs the whole
    model, and meets its errors there)."""
    n, depth = len(kinds), copy_depth(kinds)
    if 2 * depth > n:
        return None     # with the whole model's forward on top, a copy of more than half saves nothing
    small = _cut_copy(config, blocks_path, sigs, depth)[0]
    if small is None:
        return None
    try:
        measured = {s: spread(one, kinds, depth) for s, one in _measure_blocks(small).items()}
        whole = _measure_blocks(config, seq_lens=SEQ_LENS[:1], backward=False)[SEQ_LENS[0]]
    except Exception:  # noqa: BLE001 -- the whole model is run instead, and its error reported
        return None
    first = measured[SEQ_LENS[0]]
    if whole["calls"] != [1.0] * n or whole["fwd"] != first["fwd"] or whole["saved"] != first["saved"]:
        return None     # Dory loops over its middle blocks; Gemma 4's first block saves an input for every layer
    first["outside_fwd"] = whole["outside_fwd"]     # Gemma 4 projects an input per layer there
    return measured


def _measure_real_copy(config: Any, blocks_path: str, sigs: list[tuple[Any, ...]], kinds: list[tuple[Any, ...]],
                       where: str, fake_error: BaseException) -> dict[int, dict[str, list[float]]]:
    """The per-block terms of a model fake tensors cannot run (a data-dependent output),
    measured with real tensors (random weights, bf16, on the CPU) on a copy of the same widths
    cut to copy_depth blocks (two blocks where all are alike) and spread over the whole model
    (spread). The copy's blocks, at the full model's ``blocks_path``, must have the full
    model's signatures (class and parameter shapes). Refused past REAL_COPY_MAX_PARAMS
    parameters in the copy."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    why = f"fake tensors stop at a data-dependent output ({type(fake_error).__name__}: {_one_line(fake_error)})"
    depth = copy_depth(kinds)
    small, n_params, failure = _cut_copy(config, blocks_path, sigs, depth)
    ok = small is not None
    if not ok and failure != "other blocks":
        why += f"; a {depth}-block copy does not build ({failure})"
    if not ok or n_params > REAL_COPY_MAX_PARAMS:
        size = (f"its {depth}-block copy holds {n_params:,} parameters (over {REAL_COPY_MAX_PARAMS:,})" if ok
                else f"no {depth}-block copy with the same blocks")
        raise UserError(f"{where}: {why}, and {size} to measure with real tensors; the generic path cannot "
                        "measure its activations and FLOPs; a written family is needed") from None
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(small, attn_implementation="eager")
        model.train()
        blocks = model.get_submodule(blocks_path)
        return {s: spread(_one_step(model, blocks_path, blocks, s, torch, FlopCounterMode), kinds, depth)
                for s in SEQ_LENS}
    except Exception as e:  # noqa: BLE001 -- the real run fails too
        raise UserError(f"{where}: {why}, and the {depth}-block copy with real tensors fails too "
                        f"({type(e).__name__}: {_one_line(e)}); a written family is needed") from None
    finally:
        torch.set_default_dtype(old_dtype)


def _measure_blocks(config: Any, from_meta: bool = False, seq_lens: tuple[int, ...] = SEQ_LENS,
                    backward: bool = True) -> dict[int, dict[str, list[float]]]:
    """Per sequence length: _one_step's terms per block (saved bytes and forward and backward
    FLOPs per token, the times each block ran) and the forward FLOPs per token outside the
    blocks (``outside_fwd``). The model is built under the fake mode, else (its __init__
    converts a dtype, or ``from_meta``) on the meta device and given fake tensors
    (_fake_from_meta). Without ``backward`` each step stops after the forward."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = _fake_model(config, from_meta, torch)
            blocks_path, blocks = block_list(model)
            return {s: _one_step(model, blocks_path, blocks, s, torch, FlopCounterMode, backward) for s in seq_lens}
    finally:
        torch.set_default_dtype(old_dtype)


def _fake_model(config: Any, from_meta: bool, torch: Any) -> Any:
    """The causal LM under the caller's fake mode, in training mode (see _measure_blocks)."""
    from transformers import AutoModelForCausalLM

    try:
        model = (_fake_from_meta(config, torch) if from_meta
                 else AutoModelForCausalLM.from_config(config, attn_implementation="eager"))
    except RuntimeError as e:
        if "Couldn't swap" not in str(e):
            raise
        model = _fake_from_meta(config, torch)
    return model.train()


def _fake_from_meta(config: Any, torch: Any) -> Any:
    """The causal LM with fake CPU tensors, for a model whose __init__ converts a submodule's
    dtype (``.float()``, ``.to(...)``): fake parameters cannot be swapped by Module._apply
    ("Couldn't swap", FACTS.md). Built on the meta device outside the fake mode (the
    conversions run there), then each parameter and buffer replaced by an empty fake CPU tensor
    of its shape and dtype (tied tensors stay tied; no values: fake tensors hold none)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from transformers import AutoModelForCausalLM

    with unset_fake_temporarily(), torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    new: dict[int, Any] = {}
    for module in model.modules():
        for table, make in ((module._parameters, lambda t: torch.nn.Parameter(
                torch.empty(t.shape, dtype=t.dtype, device="cpu"), requires_grad=t.requires_grad)),
                (module._buffers, lambda t: torch.empty(t.shape, dtype=t.dtype, device="cpu"))):
            for name, t in list(table.items()):
                if t is not None:
                    table[name] = new.setdefault(id(t), make(t))
    return model


def _one_step(model: Any, blocks_path: str, blocks: Any, s: int, torch: Any,
              flop_counter: Any, backward: bool = True) -> dict[str, list[float]]:
    """Per block, per token of one sequence of ``s`` tokens: saved bytes (held_bytes), forward
    and backward FLOPs, the times the block ran (``calls``); and the forward FLOPs outside the
    blocks. Without ``backward`` the step stops after the forward (backward FLOPs 0)."""
    n = len(blocks)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    current: list[int] = []
    calls = [0.0] * n
    handles = []

    def enter(i: int) -> Any:
        def hook(mod: Any, args: Any) -> None:
            current.append(i)
            calls[i] += 1
        return hook

    def leave(mod: Any, args: Any, out: Any) -> None:
        if current:
            current.pop()

    for i, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(enter(i)))
        handles.append(block.register_forward_hook(leave))

    packed: list[tuple[Any, int]] = []      # (a weak reference to a saved tensor, the block saving it)

    def pack(t: Any) -> Any:
        if current:
            packed.append((weakref.ref(t), current[-1]))
        return t

    mapping = {torch.ops.aten._grouped_mm: grouped_mm_flops}
    fwd = flop_counter(display=False, custom_mapping=mapping)
    both = flop_counter(display=False, custom_mapping=mapping)    # forward and backward
    vocab = int(getattr(model.config, "vocab_size", 0) or getattr(model.config.get_text_config(), "vocab_size", 2))
    ids = torch.randint(0, max(min(vocab, 1000), 2), (1, s))
    try:
        with both:
            with fwd, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = model(input_ids=ids)
                logits = out.logits if hasattr(out, "logits") else out[0]
                loss = logits.float().mean()
            saved = held_bytes(packed, params, n)
            del packed[:]
            if backward:
                loss.backward()
    finally:
        for h in handles:
            h.remove()
    model.zero_grad(set_to_none=True)
    prefix = f"{type(model).__name__}.{blocks_path}"
    fwd_blocks, both_blocks = _per_block(fwd, prefix, n), _per_block(both, prefix, n)
    bwd_blocks = [b - f for f, b in zip(fwd_blocks, both_blocks, strict=True)]
    return {"saved": [b / s for b in saved], "fwd": [f / s for f in fwd_blocks],
            "bwd": [f / s for f in bwd_blocks], "calls": calls,
            "outside_fwd": [(fwd.get_total_flops() - sum(fwd_blocks)) / s]}


def held_bytes(packed: list[tuple[Any, int]], params: set[int], n: int) -> list[float]:
    """Bytes per block of the storages autograd still holds for the backward when the forward
    ends: each saved tensor still alive, its storage counted once (parameters excluded), charged
    to the first block whose saved tensor of it is alive. A tensor saved by a branch whose
    output is dropped (an indexer's scores once its top-k indices are taken) is freed before
    then and not counted.
    Read at the end, not at each save: a freed storage's address goes to a later tensor, so
    telling storages apart by address at the save missed some and counted freed ones. A dropped
    branch caught in a reference cycle is collected first (gc.collect), so that what is counted
    does not hang on when the collector last ran."""
    gc.collect()
    saved = [0.0] * n
    seen: set[int] = set()
    for ref, block in packed:
        t = ref()
        if t is None:
            continue
        st = t.untyped_storage()
        if st._cdata not in params and st._cdata not in seen:
            seen.add(st._cdata)
            saved[block] += st.nbytes()
    return saved


def _per_block(counter: Any, prefix: str, n: int) -> list[float]:
    """FLOPs per block from FlopCounterMode's per-module table, whose keys are the root's
    class name and the module's path (ModuleTracker): ``<prefix>.<i>`` for block i."""
    table = counter.get_flop_counts()
    return [float(sum(table.get(f"{prefix}.{i}", {}).values())) for i in range(n)]
