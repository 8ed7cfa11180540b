"""cost.plan.sweep_counts_until's walk (issue 32's eleventh pass indexed each group's tasks per
count and stopped at the last live task) against the plain walk it replaced, written out here:
every count of the group's union in increasing order, each task asked in group order. The
same pools must be asked for the same counts in the same order, and each task handed the same
answers."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from planner.cost.plan import sweep_counts_until


class Pool:
    def __init__(self, name: str, node: int, log: list) -> None:
        self.name, self.log = name, log
        self.m = self.setup = self.space = None
        self.gpu = SimpleNamespace(gpus_per_node=node)

    def at(self, ns: list[int]) -> list[tuple[str, int]]:
        self.log.append((self.name, ns[0]))
        return [(self.name, ns[0])]


def plain_walk(tasks, more=None) -> None:
    """The walk before the eleventh pass (a reference, not the planner's code)."""
    groups: dict[int, list[list]] = {}
    for i, (pool, ns, done) in enumerate(tasks):
        groups.setdefault(pool.gpu.gpus_per_node, []).append([pool, set(ns), done, True, more[i] if more else None])
    for group in groups.values():
        for n in sorted(set().union(*(t[1] for t in group))):
            if not any(t[3] is True and n in t[1] for t in group):
                continue
            for t in group:
                if t[3] is True and n in t[1]:
                    (cb,) = t[0].at([n])
                    if t[2](cb):
                        t[3] = "more" if t[4] is not None and t[4](cb) else False
                elif t[3] == "more" and n in t[1]:
                    t[0].at([n])


@pytest.mark.parametrize("seed", range(40))
def test_the_same_counts_in_the_same_order(seed: int) -> None:
    rng = random.Random(seed)
    spec = []
    for i in range(rng.randint(1, 6)):
        ns = sorted(rng.sample(range(1, 40), rng.randint(0, 12)))
        spec.append((f"p{i}", rng.choice((4, 8)), ns, rng.randint(1, 45), rng.random() < 0.5))
    logs = []
    for walk in (sweep_counts_until, plain_walk):
        log: list = []
        seen: list = []
        tasks = [(Pool(name, node, log), ns, lambda cb, stop=stop, seen=seen: seen.append(cb) or cb[1] >= stop)
                 for name, node, ns, stop, _ in spec]
        more = [lambda cb, go=go: go for *_, go in spec] if seed % 2 else None
        walk(tasks, more)
        logs.append((log, seen))
    assert logs[0] == logs[1]
