"""What torchtitan's block keeps for backward when it is compiled: torch.compile (inductor) of
the block, optionally wrapped in torchtitan's SelectiveAC first (torchtitan 0.3.0's
apply_compile compiles each checkpoint-wrapped block), run on real CPU tensors.

Fake tensors cannot be used (a compiled kernel called under FakeTensorMode kills the process,
torchtitan.py's module docstring), so the block is small and real. The bytes are counted with
torch.autograd.graph.saved_tensors_hooks around the compiled call: the compiled forward saves
its tensors for the compiled backward through autograd's saved-tensor path, so the hooks see
every tensor kept (unique storages; the block's parameters excluded, its input counted once).
Eager SelectiveAC keeps its tensors inside the checkpoint's own hooks, where outer hooks do not
reach: it is measured with MemTracker instead (tests/test_memory_stacks.py).

    python -m planner.measure.torchtitan_compile     # about 1 minute on 2 cores (inductor builds C++)
"""

from __future__ import annotations

import sys
from typing import Any

from planner.measure.torchtitan import TitanSetup, cpu_selective_ac, trainer_config

# the small Llama block tests/test_memory_stacks.py measures (hidden 256, 4 heads, 2 KV heads)
SMALL: dict[str, Any] = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "intermediate_size": 768, "num_hidden_layers": 1,
                         "vocab_size": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                         "tie_word_embeddings": False, "max_position_embeddings": 4096}


def compiled_block_saved_bytes(hf_config: dict[str, Any], seq_len: int, recompute: str) -> int:
    """Bytes one compiled torchtitan block (bf16, micro-batch 1) keeps for backward after its
    forward, its input included; ``recompute`` "none" or "selective"."""
    import torch

    cfg = trainer_config(TitanSetup(hf_config=hf_config, recompute=recompute, seq_len=seq_len), 1)
    with torch.device("meta"):
        model = cfg.model_spec.model.build()
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    block = model.to(torch.bfloat16).layers["0"]
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    if recompute == "selective":
        block = cpu_selective_ac()(cfg.activation_checkpoint)._wrap_block(block)
    compiled = torch.compile(block)
    x = torch.randn(1, seq_len, hf_config["hidden_size"], dtype=torch.bfloat16, requires_grad=True)
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    for _ in range(2):                      # the first call compiles
        seen.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = compiled(x, None, None)
        y.float().sum().backward()
    seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
    return sum(seen.values())


def main() -> int:
    seq = 256
    for recompute in ("none", "selective"):
        got = compiled_block_saved_bytes(SMALL, seq, recompute)
        print(f"compiled, recompute {recompute}: {got:,} B kept, {got / seq:,.0f} B per token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
