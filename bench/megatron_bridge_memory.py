"""Every trained layout of NVIDIA's published Megatron-Bridge runs: the planner's predicted peak
beside the GPU's capacity (issue 29).

Each of the 172 rows of tests/data/megatron_bridge_runs.json was trained, so each fits. Each row
is planned as a Megatron-Bridge user states it (bench/megatron_bridge_rows.py: ``--stack
megatron``, the printed layout, the recipe's settings) at the planner's default settings (no
--fit-confidence margin, default overheads), and its predicted peak per GPU is set beside the
GPU's memory. A row the planner rejects is named in ``EXPLAINED`` with the term responsible and
why; a row it cannot express is listed with the planner's own reason.

    python bench/megatron_bridge_memory.py            # print and rewrite docs/megatron-bridge-memory.md
    python bench/megatron_bridge_memory.py --check    # print; exit 1 if the doc is stale or a
                                                      # rejected row is not explained
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from megatron_bridge_rows import Row, evaluate, load_rows, request  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "megatron-bridge-memory.md"
GIB = 2**30

# Rows the planner rejects at default settings, by configuration (the id without its release),
# with the term responsible and why it stands. Every rejected row must be here (--check).
_FRAGMENTATION = ("The planner's 10% allocator-fragmentation allowance (training.setup.Overheads) stays at its "
                  "default for this stack: in the published-memory study "
                  "(docs/published-memory.md) torchtitan's reserved peaks exceed the planner's tracked tensors plus "
                  "10% in 9 of its 11 runs, and torchtitan runs the allocator with expandable segments (run_train.sh: "
                  "PYTORCH_ALLOC_CONF=expandable_segments:True), as Megatron-Bridge's performance scripts do for the "
                  "recipes that fill the GPU (scripts/performance/perf_plugins.py, PerfEnvPlugin."
                  "_set_model_specific_environment_variables: Llama 3.1 405B FP8 on GB200, DeepSeek-V3 on H100 and "
                  "GB200, Llama 3 70B FP8 fine-tuning; --out megatron sets it for every plan), so there is no measured "
                  "ground to loosen it for one stack. The five Llama 3 70B GB200 FP8 rows with Megatron FSDP and 40 "
                  "layers' activations offloaded, over by 1.2 GiB before, fit (0.99 of capacity) once their loss is "
                  "planned as the recipe runs it, Transformer Engine's cross entropy (--cross-entropy te), not by a "
                  "looser allowance.")
EXPLAINED: dict[str, str] = {}


# Nemotron 3 Ultra's recipe runs Megatron FSDP as HSDP (Megatron-Bridge perf_recipes/nemotronh/
# common.py _apply_nemotron_3_ultra_fsdp_hsdp at the corpus's commit 020041f: 256 GPUs / 64 = 4
# distributed-optimizer instances, outer_dp_sharding_strategy "optim" where there is more than one),
# which the row states with --optimizer-instances 4 (megatron_bridge_rows.args_of). Beside it, the
# bound megatron-core's default outer strategy 'no_shard' (0.16.1 distributed_data_parallel_config.py)
# would give: every state over one instance, dense dp x cp / 4 = 32 ranks, the experts' expert
# data-parallel 4 / 4 = 1 (parallel_state.py: intra_partial_data_parallel_size,
# intra_partial_expert_data_parallel_size), exactly what the same layout on 256 / 4 GPUs holds
# (dense dp 32, ep 64 folded over tp x dp, expert data-parallel 1).
ULTRA = "mbridge-26.08-nemotron-3-ultra-gb200-mxfp8-256gpu"
ULTRA_INSTANCES = 4


def _without(args: list[str], flag: str) -> list[str]:
    i = args.index(flag)
    return args[:i] + args[i + 2:]


def ultra_hsdp_bound(row: Row) -> tuple[int, int, int, int]:
    """(predicted bytes, optimizer-state bytes, tracked tensor bytes, capacity bytes) of one HSDP
    instance of the Ultra row under outer_dp_sharding_strategy 'no_shard': the row's request without
    its instances on n_gpus / ULTRA_INSTANCES GPUs, the global batch cut alike and dp left to follow."""
    from planner import api
    args = _without(_without(list(row.cli_args), "--dp"), "--optimizer-instances")
    for flag in ("--n-gpus", "--global-batch"):
        j = args.index(flag) + 1
        args[j] = str(int(args[j]) // ULTRA_INSTANCES)
    m, gpu, setup, lay, kw = request(args)
    res = api.evaluate_layout(m, gpu, setup, lay, **kw)
    mem = res.best.memory
    return mem.total, mem.breakdown.optimizer, mem.total - mem.breakdown.overhead, res.capacity_bytes


def _ultra_section(results: list[Result]) -> list[str]:
    from planner import api

    x = next((x for x in results if x.row.id == ULTRA), None)
    if x is None:
        return []
    row, n = x.row, ULTRA_INSTANCES
    bound, _opt, _tracked, cap = ultra_hsdp_bound(row)
    m, gpu, setup, lay, kw = request(_without(list(row.cli_args), "--optimizer-instances"))
    wide = api.evaluate_layout(m, gpu, setup, lay, **kw).best.memory.total
    return ["## Nemotron 3 Ultra: HSDP over distributed-optimizer instances", "",
            f"`{ULTRA}` runs Megatron FSDP as HSDP with {n} distributed-optimizer instances (its recipe flags; "
            "Megatron-Bridge perf_recipes/nemotronh/common.py _apply_nemotron_3_ultra_fsdp_hsdp at the corpus's "
            "commit 020041f: num_distributed_optimizer_instances = GPUs / 64, outer_dp_sharding_strategy 'optim' "
            f"where there is more than one), planned with `--optimizer-instances {n}`: the gradients and the FP8 "
            f"model weights over one instance's dp x cp / {n} = 32 ranks (the experts' over expert data-parallel "
            f"4 / {n} = 1; megatron-core 0.16.1 parallel_state.py intra_partial_data_parallel_size and "
            "intra_partial_expert_data_parallel_size), the fp32 main weights and the optimizer's moments over all "
            "128 and the experts' over 4 (the outer 'optim': megatron_fsdp/param_and_grad_buffer.py's main weight "
            "buffer over the whole data-parallel group): "
            f"**{_g(x.total_bytes)} of {_g(cap)} GiB, {'fits' if x.fits else 'does not fit'}**. Beside it, "
            f"megatron-core's default outer strategy 'no_shard' (every state over one instance: what the same "
            f"layout holds on {row.n_gpus // n} GPUs) would hold {_g(bound)} GiB, "
            f"{'fits' if bound <= cap else 'does not fit'}; Megatron FSDP over every data-parallel rank, without "
            f"instances, {_g(wide)} GiB. The recipe's fine-grained offload of the fused grouped MLP's input "
            "(offload_modules) is not modelled (counted on the GPU), and the gradients are counted in fp32 where the "
            "recipe keeps bf16 main gradients (megatron_fsdp_main_grads_dtype), which make each figure larger.", ""]


def _replanned_section(results: list[Result]) -> list[str]:
    """The rows planned at another micro-batch than printed (megatron_bridge_rows.micro_batch_of)."""
    out = [(x.row.id, a) for x in results for a in x.row.approximations if a.startswith("printed micro-batch")]
    if not out:
        return []
    return ["## Rows planned at their recipe's micro-batch", "",
            "Megatron's batch arithmetic is global batch = micro-batch x data-parallel x accumulation. Of the 50 "
            "rows that print their accumulation, two break it, and in both the recipe file's micro-batch differs "
            "from the printed one (the corpus's recipe_flags.layout_differs); both are planned at the recipe's "
            "(bench/megatron_bridge_rows.py micro_batch_of). The 25.09 Llama 3 70B row prints one micro-batch "
            "column for its two variants: 2 is the main figures' (FSDP 64, no tp or pp: 2 x 64 x 1 = 128), the "
            "parenthesised layout this row takes runs 128 = 1 x 8 x 16. The 25.11 GPT-OSS 120B H100 row is "
            "inconsistent whichever micro-batch is read (its ga 2 fits neither 4 nor 1); its recipe's is 1, as "
            "every later release prints.", "",
            *(f"- `{i}`: {a}" for i, a in out), ""]


# The Llama 3 405B layout of issue 29 (arXiv:2407.21783, Sec. 3.3.2: 8K sequences on 80 GB H100s
# without activation checkpointing), planned with interleaved 1F1B's micro-batch group N
# (--pp-microbatch-group; 0: pp = 16, megatron-core's default and its smallest accepted value).
LLAMA3_405B = ("--model", "llama3.1-405b", "--gpus", "h100", "--n-gpus", "8192", "--tp", "8", "--pp", "16", "--dp",
               "64", "--vp", "8", "--pp-balance", "embedding-loss", "--fsdp", "grad-op", "--fsdp-pipeline-grad-sync",
               "micro-batch", "--seq-len", "8192", "--micro-batch", "1", "--global-batch", "2048", "--recompute",
               "none", "--cp", "1", "--ep", "1", "--stack", "megatron")
LLAMA3_405B_GROUPS = (0, 5, 13, 14, 15)


def llama3_405b() -> list[tuple[int, float, int, int, int, int]]:
    """(group, micro-batches held on the peak stage, activation bytes, tracked tensor bytes, total
    bytes, capacity bytes) of the issue's Llama 3 405B layout for each LLAMA3_405B_GROUPS."""

    from planner import api
    out = []
    for n in LLAMA3_405B_GROUPS:
        m, gpu, setup, lay, kw = request([*LLAMA3_405B, "--pp-microbatch-group", str(n)])
        res = api.evaluate_layout(m, gpu, setup, lay, **kw)
        mem = res.best.memory
        out.append((n, mem.in_flight, mem.breakdown.activations, mem.total - mem.breakdown.overhead, mem.total,
                    res.capacity_bytes))
    return out


def _llama3_405b_section() -> list[str]:
    rows = llama3_405b()
    lines = ["## The Llama 3 405B layout of issue 29", "",
             "`plan " + " ".join(LLAMA3_405B) + " --pp-microbatch-group N`", "",
             "| N | micro-batches held (peak stage) | activations GiB | tracked tensors GiB | predicted GiB "
             "| capacity GiB | fits |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for n, held, act, tracked, total, cap in rows:
        lines.append(f"| {n or '16 (default)'} | {held:.2f} | {_g(act)} | {_g(tracked)} | {_g(total)} | {_g(cap)} | "
                     f"{'yes' if total <= cap else 'no'} |")
    lines += ["",
              "Megatron-Core's interleaved warm-up runs (pp - r - 1) x 2 + (vp - 1) x N chunk forwards on rank r",
              "(0.16.1 schedules.py get_pp_rank_microbatches), with the micro-batch group N at least pp",
              "(schedules.py lines 995-1003): at its default N = pp = 16 the second stage keeps 141 single-layer",
              "chunks, 17.6 micro-batches of its 8 layers (tests/test_pp_balance.py walks megatron-core's own",
              "schedule table to that count). The planner charges no pipeline send/recv buffers nor the chunks'",
              "output tensors beyond the next chunk's saved input, which is what deallocate_pipeline_outputs",
              "leaves (Megatron-LM sets it: megatron/training/arguments.py core_transformer_config_from_args,",
              "kw_args['deallocate_pipeline_outputs'] = True). At N = 16 the tracked tensors and the fixed",
              "overheads (CUDA context, workspaces, NCCL: 1.5 GiB) leave under 1% of them for the allocator,",
              "whose reserved peak under expandable segments exceeds the tracked tensors by more than 10% in 9",
              "of torchtitan's 11",
              "published runs (docs/published-memory.md): the issue's exact command stays 'does not fit' as",
              "Megatron-Core schedules it. The Llama 3 paper ran its own schedule, with N set freely (Sec. 3.3.2;",
              "N = 5 in its Figure 6), which megatron-core does not accept below pp: planned with",
              "`--pp-microbatch-group N` the layout fits up to N = 14 (`--out megatron` writes N only from pp",
              "up). The paper does not give its N for the 405B run.", ""]
    return lines


def config_of(row_id: str) -> str:
    """'mbridge-26.04-llama3-70b-gb200-fp8-64gpu' -> 'llama3-70b-gb200-fp8-64gpu'."""
    return row_id.split("-", 2)[2]


@dataclass(frozen=True)
class Result:
    row: Row
    total_bytes: int = 0
    capacity_bytes: int = 0
    activations_bytes: int = 0
    overhead_bytes: int = 0
    states_bytes: int = 0
    in_flight: float = 0.0
    host_bytes_per_node: int = 0

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @property
    def ratio(self) -> float:
        return self.total_bytes / self.capacity_bytes

    @property
    def fragmentation_room(self) -> float:
        """The largest allocator reserve, as a fraction of the tracked tensors, that this trained row's
        GPU had room for beside the planner's tracked tensors and fixed overheads (training.setup.
        Overheads): an upper bound on the run's fragmentation if the tracked terms are right."""
        from planner.training.setup import Overheads

        tracked = self.total_bytes - self.overhead_bytes
        fixed = self.overhead_bytes - Overheads().fragmentation_bytes(tracked)
        return (self.capacity_bytes - fixed) / tracked - 1


def study() -> list[Result]:
    out = []
    for r in load_rows():
        if not r.expressible:
            out.append(Result(r))
            continue
        res = evaluate(r)
        mem = res.best.memory
        b = mem.breakdown
        out.append(Result(r, total_bytes=mem.total, capacity_bytes=res.capacity_bytes, activations_bytes=b.activations,
                          overhead_bytes=b.overhead, states_bytes=b.weights + b.gradients + b.optimizer,
                          in_flight=mem.in_flight, host_bytes_per_node=mem.host_bytes_per_node))
    return out


def _g(x: int) -> str:
    return f"{x / GIB:.1f}"


def _fragmentation_room_lines(planned: list[Result]) -> list[str]:
    """The trained rows as an upper bound on the allocator's reserve (Result.fragmentation_room)."""
    fitting = sorted((x for x in planned if x.fits), key=lambda x: x.fragmentation_room)
    if not fitting:
        return []
    tight = fitting[0]
    n = sum(x.fragmentation_room < 0.15 for x in fitting)
    return [f"- Allocator reserve the trained rows had room for (GPU memory less the planner's tracked tensors and "
            f"fixed overheads, over the tracked tensors): at most {tight.fragmentation_room:.1%} on the tightest "
            f"row (`{tight.row.id}`), under 15% on {n} of the {len(fitting)} fitting rows. The planner's 10% "
            "allowance (assumed) lies under that bound; torchtitan's published reserved peaks, run with expandable "
            "segments, lie above tracked tensors plus 10% in 9 of 11 runs (docs/published-memory.md). Neither "
            "supports a smaller allowance."]


def table(results: list[Result]) -> str:
    planned = [x for x in results if x.row.expressible]
    rejected = [x for x in planned if not x.fits]
    latest = [x for x in planned if x.row.latest]
    unknown = [x for x in results if not x.row.family]
    refused = [x for x in results if x.row.family and not x.row.expressible]
    ratios = [x.ratio for x in planned]
    lines = [
        "# Every trained Megatron-Bridge layout beside the planner's predicted peak",
        "",
        "Generated by `python bench/megatron_bridge_memory.py` from `tests/data/megatron_bridge_runs.json`",
        "(NVIDIA's published Megatron-Bridge runs, NeMo containers 25.09 to 26.08; every row trained, so",
        "every row fits); do not edit by hand. Each row is planned as a Megatron-Bridge user states it",
        "(`bench/megatron_bridge_rows.py`: `--stack megatron`, the printed layout, the recipe's distributed",
        "optimizer or Megatron FSDP, recomputation, activation offload, FP8 parameter gather, LoRA) at the",
        "planner's default settings: no `--fit-confidence` margin, default overheads (CUDA context,",
        "workspaces, NCCL, 10% fragmentation).",
        "",
        f"- Rows: {len(results)}; planned: {len(planned)}; not expressible yet: {len(refused)} (named below); "
        f"models with no written family: {len(unknown)} "
        "(DeepSeek-V4: the generic path plans its config.json but refuses the row's expert parallelism).",
        f"- **Rejected at default settings: {len(rejected)} of {len(planned)} planned rows** "
        f"({sum(not x.fits for x in latest)} of {len(latest)} latest releases of their configuration); "
        "each is named below with the term responsible.",
        f"- Predicted peak over capacity: median {statistics.median(ratios):.2f}, "
        f"lowest {min(ratios):.2f}, highest {max(ratios):.2f}." if ratios else "",
        *_fragmentation_room_lines(planned),
        "",
        "| row | latest | GPU | predicted GiB | capacity GiB | ratio | states | activations | in flight "
        "| overhead | host GiB / node |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in planned:
        lines.append(f"| {x.row.id} | {'yes' if x.row.latest else ''} | {x.row.gpu} | {_g(x.total_bytes)} | "
                     f"{_g(x.capacity_bytes)} | {x.ratio:.2f}{'' if x.fits else ' **rejected**'} | "
                     f"{_g(x.states_bytes)} | {_g(x.activations_bytes)} | {x.in_flight:g} | "
                     f"{_g(x.overhead_bytes)} | {_g(x.host_bytes_per_node) if x.host_bytes_per_node else ''} |")
    lines += ["", "## Rejected rows: the term responsible", ""]
    if not rejected:
        lines.append("None.")
    for x in rejected:
        why = EXPLAINED.get(config_of(x.row.id), "NOT EXPLAINED")
        lines.append(f"- `{x.row.id}` ({_g(x.total_bytes)} of {_g(x.capacity_bytes)} GiB): {why}")
    lines += ["", *_ultra_section(results), *_replanned_section(results), *_llama3_405b_section()]
    lines += ["## Rows not expressible yet", ""]
    for x in refused:
        lines.append(f"- `{x.row.id}`: {x.row.reason}")
    lines += ["", "## Rows of models with no written family", ""]
    lines.append(", ".join(f"`{x.row.id}`" for x in unknown) + ".")
    lines += ["", "## How each row is read", "",
              "The request of every row (its `plan` command) and what it leaves out are in",
              "`python bench/megatron_bridge_rows.py`. The recipes' selective recomputation by module",
              "(Megatron-Core recompute_modules: layernorm, moe_act, mla_up_proj, mlp) is planned as such",
              "(`--recompute selective --recompute-modules ...`, planner.memory.recompute). Where the corpus's",
              "notes name no recipe for a row, the recipe flags the corpus read from the recipe it chose by",
              "model, GPU, precision and layout are planned (recompute_modules, Megatron FSDP); megatron-core's",
              "`moe` module (the whole MoE layer) is not modelled and is left out. The approximations it names",
              "(token-dropping routing as dropless, SFT as full training, recomputation assumed none where no",
              "recipe matched, the `moe` module and fine-grained activation offload left out) each make the",
              "predicted peak larger or leave it unchanged.",
              "",
              _FRAGMENTATION, ""]
    return "\n".join(lines)


def unexplained(results: list[Result]) -> list[str]:
    return [x.row.id for x in results if x.row.expressible and not x.fits and config_of(x.row.id) not in EXPLAINED]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if the doc is stale")
    args = ap.parse_args(argv)
    results = study()
    text = table(results)
    print(text)
    missing = unexplained(results)
    if missing:
        print(f"\nrejected rows without an explanation: {', '.join(missing)}", file=sys.stderr)
    if args.check:
        return 0 if DOC.exists() and DOC.read_text() == text and not missing else 1
    DOC.write_text(text)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
