"""What autograd saves in one forward of a transformers model on the CPU, for the tests that
check the planner's per-module activation terms against transformers' own modules."""

from collections.abc import Callable
from typing import Any

from conftest import require


def tiny_causal_lm(hf: dict, dtype_name: str = "bfloat16", attention: str = "eager") -> Any:
    """transformers' causal LM built from a config.json's keys, in training mode, seed 0."""
    torch = require("torch")
    transformers = require("transformers")
    cfg = dict(hf)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config.use_cache = False
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention,
                                                         dtype=getattr(torch, dtype_name)).train()


def saved_bytes(model: Any, batch: int, seq: int, counts: Callable[[int], bool]) -> int:
    """Bytes of the unique storages autograd saves in one forward of ``model`` on random ids,
    parameters excluded, where ``counts(storage pointer)`` holds when the tensor is saved."""
    torch = require("torch")
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        if st.data_ptr() not in params and counts(st.data_ptr()):
            seen.setdefault(st.data_ptr(), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=torch.randint(0, model.config.vocab_size, (batch, seq)))
    return sum(seen.values())


def transformers_cache_bytes(hf: dict, batch: int, seq: int) -> int:
    """Bytes of transformers' own inference cache after one forward with use_cache of the causal
    LM a config.json's keys build (bf16, seed 0, random token ids below 512), each storage
    counted once: what the tests of the inference cache hold the planner's kv_cache_bytes to.
    Zero-dimensional tensors are bookkeeping, not state: transformers 5.25 keeps a scalar int64
    token count per linear-attention layer (``cumulative_length_linear``), and they are skipped."""
    torch = require("torch")
    transformers = require("transformers")
    transformers.logging.set_verbosity_error()
    cfg = dict(hf)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(0, 512, (batch, seq)), use_cache=True).past_key_values
    seen: dict[int, int] = {}

    def walk(o: Any, depth: int = 0) -> None:
        if isinstance(o, torch.Tensor):
            if o.dim() == 0:
                return
            seen[o.untyped_storage().data_ptr()] = o.untyped_storage().nbytes()
            return
        if depth > 4:
            return
        items = o if isinstance(o, (list, tuple)) else o.values() if isinstance(o, dict) else (
            vars(o).values() if hasattr(o, "__dict__") else ())
        for x in items:
            walk(x, depth + 1)

    walk(cache)
    return sum(seen.values())
