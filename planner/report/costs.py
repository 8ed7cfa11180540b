"""The reports of priced plans: `plan --tokens` and `plan buy` (their JSON, and the lines
the terminal report prints), the prices behind them with their dates, and the GPU catalog
with its prices (`plan gpus`). Units are formatted by planner.fmt, as in every report."""

from __future__ import annotations

from typing import Any

from planner.fmt import HOUR_S, duration, to_gib, usd
from planner.measure.crosscheck import Crosscheck
from planner.report.intervals import priced_interval_json
from planner.report.text import layout_json, plan_json

# ------------------------------------------------------------- cost (plan --tokens)

def _cost_fields(p: Any) -> dict[str, Any]:
    """cost_usd, train_time_s and gpu_hours of a priced plan (planner.cost.plan.PricedPlan)."""
    return {"cost_usd": p.cost_usd, "train_time_s": p.train_time_s, "gpu_hours": p.gpu_hours,
            "cost_interval": priced_interval_json(p)}


def _limits_json(r: Any) -> dict[str, Any]:
    lim = r.limits
    return {"deadline_s": lim.deadline_s, "budget_usd": lim.budget_usd, "max_gpus": lim.max_gpus}


def broken_limits(r: Any, p: Any) -> list[str]:
    """The constraints a priced plan breaks (deadline, budget)."""
    lim, out = r.limits, []
    if lim.deadline_s is not None and p.train_time_s > lim.deadline_s:
        out.append("deadline")
    if lim.budget_usd is not None and (p.cost_usd or 0.0) > lim.budget_usd:
        out.append("budget")
    return out


def prices_json(prices: Any, gpu_names: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in gpu_names:
        p = prices.for_gpu(name)
        out[name] = {"rent_usd_per_gpu_hour": p.rent_usd_per_gpu_hour, "rent_source": p.rent_source,
                     "rent_date": p.rent_date, "node_purchase_usd": p.node_purchase_usd,
                     "purchase_source": p.purchase_source, "purchase_date": p.purchase_date,
                     "node_power_kw": p.node_power_kw, "power_source": p.power_source,
                     "committed_usd_per_gpu_hour": p.committed_usd_per_gpu_hour,
                     "committed_source": p.committed_source, "committed_date": p.committed_date}
    return out


def provider_line(r: Any) -> str:
    """One line when the GPU types compared are priced by different providers (issue 33: H100 at
    AWS's on-demand rate beside H200 at Hyperstack's made 'the cheapest GPU type' the cheaper
    provider), or ''."""
    from planner.cost.prices import rent_providers

    by_gpu = rent_providers(r.prices, [g.name for g in r.gpus])
    if len(set(by_gpu.values())) < 2:
        return ""
    return ("prices from different providers: " + ", ".join(f"{g} {p}" for g, p in by_gpu.items())
            + "; the cheapest GPU type may be the cheaper provider: compare one provider's quotes with --prices FILE")


def topology_cap_line(r: Any) -> str:
    """The GPU types whose topology describes fewer GPUs than the search's limit (issue 33: A100
    and MI300X stopped at 128 and 256 under a header saying 16,384), or ''."""
    if not r.topology_caps:
        return ""
    return "capped by topology: " + "; ".join(f"{gpu} at {n:,} GPUs ({top})" for gpu, top, n in r.topology_caps) + \
        " (a larger cluster: --topology PATH)"


def choice_lines(r: Any) -> list[str]:
    """Why the chosen cost plan, when no deadline chose it: the fastest of the plans the model
    cannot tell from the cheapest (planner.cost.plan.cost_tolerance), the cheapest one, and
    what --deadline and --objective time would change. Empty when the tolerance changed
    nothing."""
    c, low = r.chosen, r.lowest_cost
    if c is None or low is None or not r.cost_tolerance_rel or low.candidate is c.candidate:
        return []
    lines = [f"the fastest of the plans within {r.cost_tolerance_rel:.1%} of the lowest cost (the step-time "
             f"model's noise: half its 50% interval)",
             f"lowest cost: {usd(low.cost_usd)} on {low.n_gpus:,} x {low.gpu.name} in {duration(low.train_time_s)}"]
    lines.append("--deadline D: the cheapest plan that finishes by D (at equal cost the fewest GPUs); "
                 "--objective time: the fastest at any cost")
    return lines


def cost_json(r: Any, crosscheck: Crosscheck | None = None) -> dict[str, Any]:
    """`plan --tokens --json`: the plain plan's object, each plan with cost_usd, train_time_s
    and gpu_hours, the table by GPU count, the constraints and the solver."""
    out = plan_json(r.result, crosscheck)
    if r.chosen is not None:
        from planner.cost.plan import price_plan
        out["plan"].update({"gpu": r.chosen.gpu.name, **_cost_fields(r.chosen)})
        for alt, c in zip(out["alternatives"], r.result.alternatives):
            alt.update({"gpu": r.chosen.gpu.name, **_cost_fields(price_plan(r.chosen.gpu, c, r.tokens, r.prices))})
    out["objective"] = r.objective
    out["tokens"] = r.tokens
    out["constraints"] = _limits_json(r)
    out["topology_caps"] = [{"gpu": gpu, "topology": top, "max_gpus": n} for gpu, top, n in r.topology_caps]
    out["gpus_considered"] = [g.name for g in r.gpus]
    from planner.cost.prices import rent_providers
    out["rent_providers"] = rent_providers(r.prices, [g.name for g in r.gpus])
    out["gpus_left_out"] = [{"gpu": name, "reason": why} for name, why in r.left_out]
    out["by_gpu_count"] = [{"gpu": p.gpu.name, "n_gpus": p.n_gpus, **_cost_fields(p),
                            "step_time_s": p.candidate.time.step_time_s, "mfu": p.candidate.time.mfu,
                            "at_mfu_ceiling": p.candidate.time.at_mfu_ceiling,
                            "layout": layout_json(p.candidate.layout), "breaks": broken_limits(r, p),
                            "chosen": r.chosen is not None and p.candidate is r.chosen.candidate}
                           for p in r.by_count]
    out["solver"] = {**r.solver.as_dict(), "n_candidates": r.n_options}
    out["prices"] = prices_json(r.prices, [g.name for g in r.gpus])
    out["prices"]["electricity"] = {"usd_per_kwh": r.prices.electricity_usd_per_kwh, "pue": r.prices.pue}
    out["prices_overrides"] = r.prices.overrides
    out["stale_prices"] = stale_price_list(r.prices, [g.name for g in r.gpus])
    d = r.diagnosis
    out["infeasible"] = None if d is None else {
        "binding": list(d.binding), "fits_from_gpus": d.fits_from_gpus,
        "deadline_needs_gpus": d.deadline_needs_gpus, "budget_allows_gpus": d.budget_allows_gpus,
        "message": " ".join(d.lines)}
    out["cost_tolerance_rel"] = r.cost_tolerance_rel
    out["global_batch_basis"] = r.global_batch_basis or None
    out["choice"] = choice_lines(r)
    out["search_s"] = r.search_s
    return out


def rent_lines(r: Any) -> list[str]:
    out = []
    for g in r.gpus:
        p = r.prices.for_gpu(g.name)
        if p.rent_usd_per_gpu_hour is None:
            out.append(f"  {g.name}: no rental price")
        else:
            date = f", {p.rent_date}" if p.rent_date else ""
            out.append(f"  {g.name}: ${p.rent_usd_per_gpu_hour:,.2f} per GPU-hour on demand ({p.rent_source}{date})")
            if p.committed_usd_per_gpu_hour is not None:
                out.append(f"  {' ' * len(g.name)}  committed: from ${p.committed_usd_per_gpu_hour:,.2f} per GPU-hour "
                           f"({p.committed_source}, {p.committed_date}); not used for the costs above")
    return out


def report_date() -> Any:
    """The day a report ages its prices against: today, or PLANNER_TODAY (YYYY-MM-DD), which
    the examples and tests set so that their committed outputs do not change with the date."""
    import os
    from datetime import date

    fixed = os.environ.get("PLANNER_TODAY", "")
    try:
        return date.fromisoformat(fixed) if fixed else date.today()
    except ValueError:
        return date.today()


def stale_price_list(prices: Any, gpu_names: Any, *, own: bool = False) -> list[dict[str, Any]]:
    """The prices behind a report older than a year on the report's date (cost.prices.stale_prices)."""
    from planner.cost.prices import stale_prices
    return stale_prices(prices, gpu_names, report_date(), rent=not own, own=own)


def stale_price_warning(prices: Any, gpu_names: Any, *, own: bool = False) -> str | None:
    """One line warning of prices older than a year, or None."""
    from planner.cost.prices import stale_line
    return stale_line(stale_price_list(prices, gpu_names, own=own))


def rent_date(r: Any, gpu_name: str) -> str:
    """The date of the rental price behind a cost ("undated" without one)."""
    return r.prices.for_gpu(gpu_name).rent_date or "undated"





def solver_lines(r: Any) -> list[str]:
    """`plan --tokens`: the solver, the ILP's size, its status and times."""
    s = r.solver
    proved = "optimality proved" if s.optimal else "optimality NOT proved"
    return [f"{s.name} on an ILP of {r.n_options} candidates (binary choice, named constraints)",
            f"status {s.status}, {proved} (gap {s.gap_rel:g}, limit {s.time_limit_s:g} s), {s.solve_s:.3f} s; "
            f"search {r.search_s:.1f} s"]


# ---------------------------------------------------------------------- plan buy

def buy_json(r: Any) -> dict[str, Any]:
    pools = {p.gpu: p for p in r.pools}
    return {
        "jobs_file": r.path, "start_date": r.start_date, "horizon_s": r.horizon_s, "budget_usd": r.budget_usd,
        "feasible": r.feasible,
        "nodes": {g: {"nodes": n, "gpus": n * pools[g].gpus_per_node, "capex_usd": n * pools[g].capex_usd,
                      "opex_usd": n * pools[g].opex_usd} for g, n in r.nodes.items()},
        "capex_usd": r.capex_usd, "opex_usd": r.opex_usd, "tco_usd": r.tco_usd,
        "jobs": [{"name": j.name, "model": j.model.name, "gpu": j.gpu.name, "n_gpus": j.n_gpus,
                  "layout": layout_json(j.candidate.layout), "start_s": j.start_s, "finish_s": j.finish_s,
                  "deadline_s": j.deadline_s, "train_time_s": j.finish_s - j.start_s, "tokens": j.tokens,
                  "gpu_hours": j.n_gpus * (j.finish_s - j.start_s) / HOUR_S,
                  "step_time_s": j.candidate.time.step_time_s, "mfu": j.candidate.time.mfu} for j in r.plans],
        "solver": {**r.solver.as_dict(), "n_candidates": r.n_options},
        "prices": prices_json(r.prices, [p.gpu for p in r.pools])
        | {"electricity": {"usd_per_kwh": r.prices.electricity_usd_per_kwh, "pue": r.prices.pue,
                           "source": r.prices.electricity_source, "pue_source": r.prices.pue_source}},
        "infeasible": None if r.feasible else " ".join(r.lines),
        "stale_prices": stale_price_list(r.prices, [p.gpu for p in r.pools], own=True),
        "gpus_left_out": [{"gpu": name, "reason": why} for name, why in r.left_out],
        "search_s": r.search_s,
    }





def _limit(s: Any) -> str:
    """The solver's limits as the answer states them: the node limit where it gave an answer
    short of a proof (cost.solve.MIP_MAX_NODES; 0 nodes: the ILP was not branched on as a whole,
    cost.solve._relaxed_purchase), else the time limit."""
    nodes = getattr(s, "max_nodes", None)
    if getattr(s, "gap_found", None) is None or nodes is None:
        return f"{s.time_limit_s:g} s"
    if nodes == 0:
        return f"relaxation with integer nodes and an ILP over its runs, {s.time_limit_s:g} s"
    return f"{nodes:,} branch-and-bound nodes or {s.time_limit_s:g} s"


def buy_solver_lines(r: Any) -> list[str]:
    """`plan buy`: the solver, the ILP's size, its status and times."""
    s = r.solver
    proved = "optimality proved" if s.optimal else "optimality NOT proved"
    return [f"{s.name} on an ILP of {s.n_variables} variables ({r.n_options} job options, integer nodes per type)",
            f"and {s.n_constraints} named constraints",
            f"status {s.status}, {proved} (gap {s.gap_rel:g}, limit {_limit(s)}), {s.solve_s:.3f} s; "
            f"search {r.search_s:.1f} s"] + (
        [f"gap to the solver's lower bound {s.gap_found:.1%} of the answer: the optimum costs at least "
         f"{1 - s.gap_found:.1%} of it"]
        if getattr(s, "gap_found", None) is not None else []) + (
        [f"stopped by its {s.stopped_by}, not by a count of work: another machine or load may answer otherwise"]
        if getattr(s, "stopped_by", None) is not None else [])


def gpu_price_cells(p: Any) -> str:
    """`plan gpus` columns: rent per GPU-hour, node purchase price, node power."""
    rent = f"{p.rent_usd_per_gpu_hour:.2f}" if p.rent_usd_per_gpu_hour is not None else "-"
    node = usd(p.node_purchase_usd) if p.node_purchase_usd is not None else "-"
    kw = f"{p.node_power_kw:g}" if p.node_power_kw is not None else "-"
    return f"{rent:>8} {node:>9} {kw:>8}"


def gpus_text(gpus: Any, prices: Any) -> str:
    """`plan gpus`: one line per GPU (memory, bf16 rate, HBM bandwidth, GPUs per node, prices,
    link), then the prices' sources."""
    lines = [f"{'name':<10} {'memory':>10} {'bf16 TFLOP/s':>13} {'HBM TB/s':>9} {'per node':>9} "
             f"{'$/GPU-h':>8} {'node $':>9} {'node kW':>8}  link / full name"]
    for g in gpus:
        bf16 = f"{g.bf16_flops_per_s / 1e12:.1f}" if g.bf16_flops_per_s else "-"
        lines.append(f"{g.name:<10} {to_gib(g.memory_bytes):>6.1f} GiB {bf16:>13} "
                     f"{g.hbm_bytes_per_s / 1e12:>9.2f} {g.gpus_per_node:>9} "
                     f"{gpu_price_cells(prices.for_gpu(g.name))}  {g.intra_node_link}; {g.full_name}")
    lines.append("")
    lines.append(price_sources_text(prices, [g.name for g in gpus]))
    return "\n".join(lines)


def price_sources_text(prices: Any, gpu_names: Any) -> str:
    """Where every price comes from (and the --prices file, when one overrides them)."""
    out = ["Price sources" + (f" (with {prices.overrides} on top)" if prices.overrides else
                              " (override any entry with --prices FILE; see planner/presets/prices.toml)") + ":"]
    for name in gpu_names:
        p = prices.for_gpu(name)
        if p.rent_usd_per_gpu_hour is None and p.node_purchase_usd is None:
            continue
        out.append(f"  {name}: rent: {p.rent_source or '-'}" + (f" ({p.rent_date})" if p.rent_date else ""))
        out.append(f"  {' ' * len(name)}  node: {p.purchase_source or '-'}"
                   + (f" ({p.purchase_date})" if p.purchase_date else "") + f"; power: {p.power_source or '-'}")
    out.append(f"  electricity: {prices.electricity_usd_per_kwh:g} $/kWh, {prices.electricity_source}"
               + (f" ({prices.electricity_date})" if prices.electricity_date else ""))
    out.append(f"  PUE {prices.pue:g}: {prices.pue_source}")
    return "\n".join(out)
