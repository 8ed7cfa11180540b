"""RMSNorms that keep their normalised tensor in fp32 (per shape, gathered in memory.shapes).

memory.activations counts Hugging Face's eager RMSNorm as Llama's (transformers 5.24.0
models/llama/modeling_llama.py, LlamaRMSNorm: ``x32 = x.to(float32)``, ``x32 * rsqrt(...)``,
``weight * normed.to(input_dtype)``): autograd keeps the fp32 copy of the input and the
normalised tensor in the input's dtype, 4 + a bytes per element. Two families multiply by the
weight before casting back, in fp32, so the normalised tensor autograd keeps for the weight's
gradient is fp32, 4 + 4 bytes per element:

* Gemma 3 (models/gemma3/modeling_gemma3.py, Gemma3RMSNorm: ``output = self._norm(x.float());
  output = output * (1.0 + self.weight.float()); return output.type_as(x)``), in its four norms
  per block (input, post-attention, pre- and post-feedforward) and its QK norms;
* OLMo 2 (models/olmo2/modeling_olmo2.py, Olmo2RMSNorm: ``return (self.weight *
  hidden_states).to(input_dtype)`` with ``hidden_states`` fp32: a 16-bit weight times an fp32
  tensor promotes to fp32), in its post-attention and post-feedforward norms and its QK norms;
* Qwen3-Next and Qwen3.5 (models/qwen3_next/modeling_qwen3_next.py, Qwen3NextRMSNorm, and
  Qwen3_5RMSNorm / Qwen3_5MoeRMSNorm alike: Gemma 3's ``output * (1.0 + self.weight.float())``),
  in their two norms per decoder layer (one per letter of the hybrid pattern,
  planner.models.deltanet) and their QK norms.

Under autocast (kernels "amp") the residual stream is fp32 already and the generic count is
8 bytes per element: no change; fused kernels keep their input only (no change either); a
frozen weight needs no gradient, so no normalised tensor is kept. Checked against autograd's
saved tensors of the transformers blocks in tests/test_memory_norms.py.
"""

from __future__ import annotations

from planner.layouts.layout import Layout
from planner.memory.activations import norm_saved_bytes
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup

FP32_NORMALISED_TYPES = ("gemma3_text", "gemma3", "olmo2", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
FP32_NORM_BYTES = 8     # the fp32 copy of the input and the fp32 normalised tensor, per element


def keeps_fp32_normalised(m: ModelSpec) -> bool:
    """Whether the model's RMSNorms multiply by their weight in fp32 (see the module docstring)."""
    return m.norm == "rmsnorm" and m.model_type in FP32_NORMALISED_TYPES


def block_norm_delta_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Bytes one block's norms keep beyond memory.activations' generic count, per micro-batch
    on one rank: norms_per_layer x h x (8 - the generic bytes per element) for the families
    above under transformers' eager modules; 0 otherwise and under full recomputation. The
    norms sit outside the tensor-parallel region: split by tp under sequence parallelism."""
    if (not keeps_fp32_normalised(m) or kernels not in ("eager", "amp") or lay.recompute == "full"
            or setup.finetune.freezes_base):
        return 0
    a = setup.precision_spec.activation_bytes
    per_element = FP32_NORM_BYTES - norm_saved_bytes(m, a, kernels)
    tokens = lay.tokens_per_rank
    return int(tokens * m.norms_per_layer * m.d_model * per_element / (lay.tp if lay.sp else 1))
