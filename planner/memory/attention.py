"""Attention's saved tensors where the architecture differs from the generic multi-head /
grouped-query block of memory.activations (per shape, gathered in memory.shapes): DeepSeek's
multi-head latent attention (MLA).

MLA (DeepSeek-V2/V3, arXiv:2412.19437, Sec. 2.1.1; transformers' DeepseekV3Attention): the
query goes through a q_lora_rank bottleneck (q_a_proj, q_a_layernorm, q_b_proj), keys and
values through one kv_lora_rank latent plus a decoupled rotary key of qk_rope_head_dim
shared by all heads (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj). Beyond the generic
block's terms a block keeps, per token:

* the query latent as its norm keeps it (memory.activations.norm_saved_bytes: its input,
  or for transformers' eager RMSNorm the fp32 copy and the normalised tensor) and as the
  q_b_proj input: q_lora_rank x (norm bytes + a);
* the key/value latent the same way: kv_lora_rank x (norm bytes + a); the decoupled rotary
  key needs nothing more (rotating by the cos/sin tables keeps only the tables, and the
  concatenated per-head K is counted with Q, K and V);

and its values are v_head_dim wide, not head_dim: V and the attention output (the output
projection's input) are n_heads (v_head_dim - head_dim) narrower than the generic count of
n_heads x head_dim each (DeepSeek-V3: v 128 against head_dim 192). The latents come out of
the down-projections, which tensor parallelism does not split (Megatron-Core MLA:
linear_q_down_proj and linear_kv_down_proj are replicated), so they are split by tp only
under sequence parallelism; V and the output are split by tp. Frameworks that absorb the
up-projections into the query and output at inference keep only the latent in the KV
cache; training, as here, materialises the per-head K and V (the non-absorbed layout).
Under full recomputation the block keeps its input only: no change.

Checked against autograd's saved tensors (torch.autograd.graph.saved_tensors_hooks, unique
storages, parameters and the block input excluded) of transformers' DeepseekV3Attention in
bf16 on the CPU (hidden 512, 8 heads, q_lora 192, kv_lora 128, nope 64, rope 32, v 64):
latents 1,540 + 1,028 B per token (each with its fp32 rstd), against 1,536 + 1,024
modelled (-0.3%); the output projection's input 8 x 64 x 2 = 1,024 B per token (the
generic count, n_heads x head_dim, gives 1,536) and V 8 x 64 wide.
"""

from __future__ import annotations

from planner.layouts.layout import Layout
from planner.memory.activations import norm_saved_bytes
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup


def mla_saved_delta_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Bytes one MLA block keeps beyond memory.activations' generic count, per micro-batch on
    one rank (see the module docstring); 0 for other attention and under full recomputation."""
    if not m.is_mla or lay.recompute == "full" or setup.finetune.freezes_base:
        return 0
    a = setup.precision_spec.activation_bytes
    tokens = lay.micro_batch * (lay.seq_len // lay.cp)
    sp_div = lay.tp if lay.sp else 1
    latent_b = norm_saved_bytes(m, a, kernels) + a
    latents = (m.q_lora_rank + m.kv_lora_rank) * latent_b
    narrower_v = 2 * m.n_heads * (m.value_head_dim - m.head_dim) * a     # V and the attention output
    return int(tokens * (latents / sp_div + narrower_v / lay.tp))
