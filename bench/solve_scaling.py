"""How the ILP solve time grows with the number of candidates.

    python bench/solve_scaling.py            # both ILPs, HiGHS (when installed) and CBC
    python bench/solve_scaling.py --quick    # fewer sizes

One job: random candidates (GPU type x count x layout, with cost, time and memory) under a
deadline, a budget and a GPU cap, solved by planner.cost.solve.solve_one_job. The default search
space (`plan --model 70b --gpus h100,a100 --tokens 1e12`) gives it 63 candidates (the report's
Solver line): up to three fastest layouts on each GPU count per type. Cluster purchase: random jobs
with overlapping windows, each with options on three GPU types, solved by solve_purchase.
Each row: candidates (or jobs x options), variables, constraints, solve seconds, whether
optimality was proved.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.cost.solve import JobOption, JobWindow, Limits, Option, Pool, solve_one_job, solve_purchase  # noqa: E402

GPUS = {"h100": (12.29, 8, 80), "a100": (5.12, 8, 80), "l40s": (3.77, 8, 45), "b200": (14.24, 8, 180)}


def one_job_options(n: int, rng: random.Random) -> list[Option]:
    out = []
    for i in range(n):
        gpu = rng.choice(list(GPUS))
        rate, gpn, cap = GPUS[gpu]
        n_gpus = gpn * rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256])
        time_s = 1e12 / (n_gpus * rng.uniform(1500, 4000))        # tokens / (GPUs x tokens/s per GPU)
        out.append(Option(key=f"c{i}_{gpu}_n{n_gpus}", gpu=gpu, n_gpus=n_gpus, time_s=time_s,
                          cost_usd=n_gpus * time_s / 3600 * rate, memory_bytes=rng.randint(20, 100),
                          capacity_bytes=cap))
    return out


def purchase_instance(n_jobs: int, n_options: int, rng: random.Random):
    pools = [Pool(gpu=g, gpus_per_node=gpn, capex_usd=capex, opex_usd=opex)
             for g, gpn, capex, opex in (("h100", 8, 270e3, 11e3), ("h200", 8, 315e3, 11e3), ("b200", 8, 515e3, 16e3))]
    jobs, options = [], []
    for j in range(n_jobs):
        start = rng.uniform(0, 200) * 86400
        jobs.append(JobWindow(name=f"job{j}", start_s=start, deadline_s=start + rng.uniform(10, 60) * 86400))
        for k in range(n_options):
            pool = rng.choice(pools)
            n = 8 * rng.choice([1, 2, 3, 4, 6, 8, 12, 16])
            options.append(JobOption(job=f"job{j}", gpu=pool.gpu, n_gpus=n, key=f"o{k}",
                                     duration_s=rng.uniform(200, 1500) * 86400 / n))
    return pools, jobs, options


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rng = random.Random(0)
    solvers = ["highs", "cbc"]
    sizes = [10, 130, 1000] if args.quick else [10, 130, 1000, 5000, 20_000]
    print("One job: pick one candidate (binary per candidate, deadline/budget/GPU-cap/memory constraints)")
    print(f"{'solver':<7} {'candidates':>10} {'variables':>10} {'constraints':>12} {'solve s':>9}  optimal")
    for solver in solvers:
        for n in sizes:
            opts = one_job_options(n, rng)
            t0 = time.perf_counter()
            sol = solve_one_job(opts, "cost", Limits(deadline_s=60 * 86400, budget_usd=5e6, max_gpus=1024),
                                solver=solver)
            wall = time.perf_counter() - t0
            print(f"{sol.solver.name:<7} {n:>10,} {sol.solver.n_variables:>10,} {sol.solver.n_constraints:>12,} "
                  f"{wall:>9.3f}  {sol.solver.optimal}")
    print()
    print("Cluster purchase: integer nodes per type, a binary per job option, capacity at every job start")
    print(f"{'solver':<7} {'jobs':>5} {'options':>8} {'variables':>10} {'constraints':>12} {'solve s':>9}  optimal")
    grid = [(3, 10), (5, 20), (10, 20)] if args.quick else [(3, 10), (5, 20), (10, 30), (20, 30), (40, 30)]
    for solver in solvers:
        for n_jobs, n_opts in grid:
            pools, jobs, options = purchase_instance(n_jobs, n_opts, rng)
            t0 = time.perf_counter()
            sol = solve_purchase(pools, jobs, options, solver=solver)
            wall = time.perf_counter() - t0
            print(f"{sol.solver.name:<7} {n_jobs:>5} {len(options):>8,} {sol.solver.n_variables:>10,} "
                  f"{sol.solver.n_constraints:>12,} {wall:>9.3f}  {sol.solver.optimal}")


if __name__ == "__main__":
    main()
