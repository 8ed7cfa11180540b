"""A term of the memory or time model as `plan explain` prints it, and the sources terms cite."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ZERO = "Rajbhandari et al. 2019, ZeRO, arXiv:1910.02054, Sec. 5 and Fig. 1"
FSDP2 = "PyTorch FSDP2 docs (fully_shard, MixedPrecisionPolicy: fp32 sharded parameters and gradients)"
FSDP2_BLOCKS = ("PyTorch FSDP2 (torch.distributed.fsdp fully_shard; _fully_shard/_fsdp_param_group.py, "
                "post_backward): reshard_after_backward=True reshards a block as soon as its backward is over, "
                "its gradients go to a reduce-scatter; full shard prefetches the next block "
                "(planner.memory.model.fsdp_blocks_done, fsdp_backward_end_bytes)")
FSDP2_FORWARD = ("PyTorch FSDP2 (torch.distributed.fsdp fully_shard; _fsdp_param_group.py, wait_for_unshard, "
                 "all_gather_state): a block's all-gather output is kept until the next block's is copied out "
                 "(planner.memory.model.fsdp_forward_bytes)")
FSDP2_REDUCE = ("PyTorch FSDP2 (torch.distributed.fsdp fully_shard): a block's unsharded gradients exist until its "
                "reduce-scatter, whose input stays allocated until the next block's post-backward "
                "(reduce_scatter_max_input_buffers = 1), in MixedPrecisionPolicy's reduce_dtype (fp32 under "
                "mixed precision)")
FSDP2_HEAD = ("PyTorch FSDP2 (torch.distributed.fsdp fully_shard): the root unit (embedding, final norm, LM head) "
              "is reduce-scattered in its own post-backward, after every block; FSDPMemTracker on Llama-3-8B cut "
              "to 4 blocks (fp32, 8 ranks): 1.47 GiB less in every block's backward with a quarter of the "
              "vocabulary, (128,256 - 32,064) x 4096 x 4 B (tests/test_memory_measured.py)")
FSDP2_STEP = ("PyTorch FSDP2 (torch.distributed.fsdp fully_shard, reshard_after_backward=True): every unit, the "
              "root and shard-grad-op's blocks too, is resharded after its backward: no gathered weights are left "
              "at the optimizer step")
MEASURED_END = ("docs/accuracy.md (FSDPMemTracker on Mixtral-8x7B): full shard on 64 ranks peaks in block 1's "
                "backward with 30 of 32 blocks' sharded gradients; shard-grad-op on 8 ranks in block 30's, one "
                "block's gradients made and one block's gathered weights freed")
FSDP2_PRE_BACKWARD = ("PyTorch FSDP2 (torch.distributed.fsdp fully_shard; _fsdp_state.py _pre_backward -> "
                      "FSDPParamGroup.pre_backward -> unshard): a block is gathered again for its backward "
                      "(planner.memory.buffers.fsdp_block_backward_bytes)")
MEASURED_BLOCK = ("docs/accuracy.md (FSDPMemTracker on bench/configs/tiny-kimi-linear.json, 8 ranks): in every "
                  "block's backward the unsharded parameters are the root unit and that block in 16 bits")
MEASURED_FORWARD = ("docs/accuracy.md (FSDPMemTracker on Mixtral-8x7B, 64 ranks, shard-grad-op, micro-batch 2): "
                    "the peak is in the last block's forward, two 21.1 GiB all-gather outputs beside every "
                    "gathered block")
MEASURED_GRAD = ("docs/accuracy.md (FSDPMemTracker on Mixtral-8x7B, 64 ranks, 8 experts: 21.1 GiB gathered and "
                 "prefetched, 42.2 GiB reduce-scatter input, 2.7 GiB of block gradients, unpadded)")
AUTOCAST = "PyTorch torch.autocast (fp32 parameters, 16-bit copies per forward)"
KORTHIKANTI = "Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4.1-4.3, Eqs. 1-4"
ONE_F_ONE_B = ("Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2.1 (1F1B: stage i holds min(p - i, m)); "
               "Korthikanti et al. 2022, Sec. 4.2.3 (interleaved: x (1 + (p-1)/(p v)))")
BUBBLE = "Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2 (bubble (p-1)/v micro-batch times)"
FLOPS = ("the model's own matmuls (planner.models.matmuls: MLA projections, routed and shared experts, dense "
         "blocks, MTP), checked against torch FlopCounterMode on the transformers model (tests/test_model_flops.py); "
         "for a GPT block Narayanan et al. 2021, arXiv:2104.04473, Eq. 3 (96 l h^2 (1 + s/6h + V/16lh) with full "
         "recomputation); Korthikanti et al. 2022, Eq. 7 (model FLOPs, 72 l h^2 (...))")
KAPLAN = "Kaplan et al. 2020, arXiv:2001.08361, Sec. 2.1 (C = 6 N per token, attention left out)"
RING = ("ring collectives: Patarasuk & Yuan 2009; bus bandwidth as nccl-tests defines it "
        "(NVIDIA/nccl-tests doc/PERFORMANCE.md)")
TP_COMM = "Shoeybi et al. 2019, Megatron-LM, arXiv:1909.08053, Sec. 3 (2 all-reduces forward, 2 backward)"
OVERHEADS = ("planner.training.setup.Overheads: PyTorch CUDA semantics notes, CUDA lazy loading docs, "
             "NCCL_BUFFSIZE docs, PyTorch 'Understanding CUDA memory usage'")
BUFFERS = ("DeepSpeed config docs (reduce_bucket_size, stage3_prefetch_bucket_size); FSDPMemTracker "
           "on Llama-3-8B (one gathered block); pipeline send/receive of one activation")
LOGITS = ("Korthikanti et al. 2022, Sec. 4.3 (fused: 4sbv/t fp32 logits); eager Hugging Face loss: "
          "12 B per logit, measured with FSDPMemTracker on Llama-3-8B")
OFFLOAD = ("Ren et al. 2021, ZeRO-Offload, arXiv:2101.06840, Sec. 4.1; Rajbhandari et al. 2021, "
           "ZeRO-Infinity, arXiv:2104.07857, Sec. 5; FSDP2 CPUOffloadPolicy")
OPT_STEP = "torch/optim/adamw.py, _multi_tensor_adamw (_foreach_sqrt: one fp32 copy of the local parameters)"
OPT_TIME = "memory-bound update: read and write the master copy and states, read the gradient, write the weight"
MATMUL = ("planner.timing.model.MATMUL_FRACTION: sustained matmul FLOPS (stas00/ml-engineering, "
          "compute/accelerator/benchmarks); A100 fitted to Korthikanti et al. 2022, Table 4")
FLASH = "planner.timing.model.FLASH_FRACTION: Dao 2023, FlashAttention-2, Sec. 4; Shah et al. 2024, FlashAttention-3"
HBM = "planner.timing.model.Efficiency.hbm_fraction: Ivanov et al. 2021, 'Data Movement Is All You Need', Sec. 4-5"
OVERLAP = ("planner.timing.model.Efficiency.overlap_slowdown: NCCL channels take SMs and HBM bandwidth "
           "(Rashidi et al. 2021, ISCA, Sec. 2)")
LAYER_TIME = ("planner.timing.model.layer_time: GEMMs at the matmul rate plus one HBM pass of their operands, "
              "flash attention at the flash rate (backward 2.5x, Dao 2023), element-wise kernels at HBM rate")


@dataclass(frozen=True, kw_only=True, slots=True)
class Term:
    """One term of the memory or time model.

    section: "memory" (bytes on the most loaded rank at its peak) or "time" (seconds of one
    optimizer step); category: the report's category (weights, ..., overhead; compute,
    communication, bubble, optimizer); summed: part of the section's total, or (False) a
    figure the summed terms use.
    """

    section: str
    category: str
    name: str
    formula: str
    inputs: dict[str, Any] = field(default_factory=dict)
    value: float
    unit: str
    source: str
    summed: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"section": self.section, "category": self.category, "name": self.name,
                "formula": self.formula, "inputs": self.inputs, "value": self.value, "unit": self.unit,
                "source": self.source, "summed": self.summed}



def label(key: str) -> str:
    """An input's name: symbols (N_d, Psi_e) and keys with spaces as written, else words."""
    return key if " " in key or key.startswith(("N_", "Psi")) else key.replace("_", " ")
