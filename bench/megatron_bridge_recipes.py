"""What each published Megatron-Bridge run's recipe turned on: the ``recipe_flags`` of the corpus
as one table (issue 28).

tests/data/megatron_bridge_runs.json gives each row, where its recipe file was read, the MoE
all-to-all/compute overlap, the token dispatcher (all-to-all, DeepEP, HybridEP), the CUDA graphs
(implementation and scope), the shared-expert overlap and the other speed-relevant settings of
its Megatron-Bridge performance recipe, with the file and 40-hex commit they were read from and
whether that is the row's own commit. This script only tabulates them; the values were read
from NVIDIA-NeMo/Megatron-Bridge (the corpus's ``fields`` entry says how, and the defaults of
unset fields).

    python bench/megatron_bridge_recipes.py          # print and rewrite docs/megatron-bridge-recipes.md
    python bench/megatron_bridge_recipes.py --check  # print; exit 1 if the doc is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from megatron_bridge_rows import CORPUS, Row, load_rows, runtime_args  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "megatron-bridge-recipes.md"
# The flags a step-time model of MoE runs needs first, in the table's order.
HEADER = ("| row | a2a overlap | dispatcher | CUDA graph impl | graph scope | shared-expert overlap "
          "| recompute | plan options | layout | source |", "|---|---|---|---|---|---|---|---|---|---|")
MAIN_FLAGS = ("moe_a2a_overlap", "dispatcher", "cuda_graph_impl", "cuda_graph_scope", "moe_shared_expert_overlap")


def raw_rows(path: Path = CORPUS) -> dict[str, dict[str, Any]]:
    """Row id -> the corpus's row as stored."""
    return {r["id"]: r for r in json.loads(path.read_text())["rows"]}


def _fmt(v: Any) -> str:
    if v is None:
        return "·"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list):
        return "[" + ", ".join(str(x) for x in v) + "]" if v else "[]"
    return str(v)


def _model(row: Row) -> str:
    """The model without its routing/MTP variant ('Qwen3_235B_a22B (tokendrop)' -> 'Qwen3_235B_a22B')."""
    return row.model.split(" (")[0]


# What an unset flag means (the corpus's fields.recipe_flags cites where each default is set).
DEFAULTS = {"moe_a2a_overlap": False, "dispatcher": "recipe default", "cuda_graph_impl": "none",
            "cuda_graph_scope": [], "moe_shared_expert_overlap": False}


def effective(f: dict[str, Any], name: str) -> Any:
    """A flag's value, or where the recipe leaves it unset, the model's default (``unset_defaults``,
    read from the model's provider) or else the stack's (``DEFAULTS``)."""
    if f[name] is not None:
        return f[name]
    return f["other"].get("unset_defaults", {}).get(name, DEFAULTS[name])


def _cell(f: dict[str, Any], name: str) -> str:
    """A table cell: the value, or '·' when unset, with the model's default where it was read."""
    if f[name] is not None:
        return _fmt(f[name])
    given = f["other"].get("unset_defaults", {})
    return f"· ({_fmt(given[name])})" if name in given else "·"


def plan_options(raw: dict[str, Any], row: Row) -> tuple[str, ...]:
    """The row's recipe flags as `plan`'s Megatron runtime options, as the step-time study passes
    them (megatron_bridge_rows.runtime_args, the one mapping)."""
    ep = raw["settings"]["ep"]
    return tuple(runtime_args(raw, int(ep) if str(ep).isdigit() else 1, row.precision))


def runtime_counts(rows: list[Row], raw: dict[str, dict[str, Any]]) -> list[str]:
    """How many of the rows (with flags) the study runs with each of plan's Megatron runtime options."""
    counts: Counter[str] = Counter()
    read = [r for r in rows if raw[r.id].get("recipe_flags")]
    for r in read:
        opts = list(plan_options(raw[r.id], r))
        if "--fp8-attention" in opts:
            opts.remove("--fp8-attention")
            counts["--fp8-attention"] += 1
        counts.update(f"{opts[i]} {opts[i + 1]}" for i in range(0, len(opts), 2))
    return [f"- As the study's plan options ({len(read)} rows; no --cuda-graphs = none, no --moe-a2a-overlap = "
            "ep 1): " + ", ".join(f"`{k}` {v}" for k, v in sorted(counts.items())) + "."]


def differences_between_gpus(rows: list[Row], flags: dict[str, dict[str, Any]]) -> list[str]:
    """For each model and precision trained on more than one GPU type, the main flags whose values
    (unset = the stack's default) differ between the GPU types, over the latest rows with flags."""
    out = []
    for model, precision in sorted({(_model(r), r.precision) for r in rows}):
        mine = [r for r in rows if (_model(r), r.precision) == (model, precision) and r.id in flags]
        if len({r.gpu for r in mine}) < 2:
            continue
        for name in MAIN_FLAGS:
            per_gpu: dict[str, set[str]] = {}
            for r in mine:
                per_gpu.setdefault(r.gpu, set()).add(_fmt(effective(flags[r.id], name)))
            if len({v for vals in per_gpu.values() for v in vals}) > 1:
                out.append(f"- {model} {precision}, `{name}`: " + "; ".join(
                    f"{gpu} {' / '.join(sorted(vals))}" for gpu, vals in sorted(per_gpu.items())))
    return out


def render(rows: list[Row], raw: dict[str, dict[str, Any]]) -> str:
    flags = {rid: r["recipe_flags"] for rid, r in raw.items() if r.get("recipe_flags")}
    latest = [r for r in rows if r.latest]
    with_flags = [r for r in latest if r.id in flags]
    own = sum(flags[r.id]["own_commit"] for r in with_flags)
    match = sum(bool(flags[r.id].get("layout_matches")) for r in with_flags)
    lines = [
        "# What the Megatron-Bridge recipes turned on",
        "",
        "Generated by `python bench/megatron_bridge_recipes.py` from the `recipe_flags` of",
        "`tests/data/megatron_bridge_runs.json` (issue 28). Each row's flags were read from the",
        "Megatron-Bridge file and commit in its source column (`scripts/performance/configs/<family>/"
        "*_workload_base_configs.py`",
        "with the family's `*_llm_pretrain.py` for the dispatcher, or `src/megatron/bridge/perf_recipes/...`"
        " for the 26.08 rows; for three Qwen3-30B B200 rows a fork's copy, the only stored version with"
        " the printed layout).",
        "`·` = not set by the recipe: the stack's default (the corpus's `fields.recipe_flags` names each default"
        " and where it is set); `· (x)`: the model provider's default x, read for that row (`unset_defaults`).",
        "`plan options`: the flags as the step-time study passes them to `plan`"
        " (`runtime_args` in bench/megatron_bridge_rows.py).",
        "",
        f"- Latest rows: {len(latest)}; with recipe flags: {len(with_flags)}; "
        f"without: {len(latest) - len(with_flags)}"
        + "".join(f"; {r.id}" for r in latest if r.id not in flags) + ".",
        f"- Read at the row's own commit: {own} of {len(with_flags)}. The stored versions of these files are"
        " other commits, so each row also says whether the file's layout is the printed one:"
        f" {match} match, {len(with_flags) - match} differ (column `layout`).",
        *runtime_counts(latest, raw),
        "",
        "## Flags that differ between GPUs of the same model (latest rows)",
        "",
        *differences_between_gpus(latest, flags),
        "",
        "## Every latest row",
        "",
        *HEADER,
    ]
    lines += _table(latest, raw)
    older = [r for r in rows if not r.latest]
    read = [flags[r.id] for r in older if r.id in flags]
    lines += ["", "## Older releases of the same configurations", "",
              f"{len(read)} of {len(older)} rows with flags; {sum(f['own_commit'] for f in read)} read at their own"
              f" commit, {sum(bool(f.get('layout_matches')) for f in read)} with the printed layout.",
              "", *HEADER]
    lines += _table(older, raw)
    lines.append("")
    return "\n".join(lines)


def _table(rows: list[Row], raw: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        f = raw[r.id].get("recipe_flags")
        if f is None:
            lines.append(f"| {r.id} | | | | | | | | | not read yet |")
            continue
        other = f["other"]
        rc = other.get("recompute_modules")
        if "recompute_num_layers" in other:
            rc = f"full, {other['recompute_num_layers']} layers per stage"
        lay = "matches" if f.get("layout_matches") else "differs: " + ", ".join(
            f"{k} {v}" for k, v in f.get("layout_differs", {}).items())
        lines.append("| " + " | ".join([
            r.id, *(_cell(f, name) for name in MAIN_FLAGS), _fmt(rc),
            "`" + " ".join(plan_options(raw[r.id], r)) + "`", lay,
            f["source"].replace("|", "\\|")]) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if the doc is stale")
    args = ap.parse_args(argv)
    text = render(list(load_rows(check=False)), raw_rows())
    print(text)
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC.relative_to(ROOT)} is stale: run python bench/megatron_bridge_recipes.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
