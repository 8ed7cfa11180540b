"""cost.plan.sweep_counts_until's walk (issue 32's eleventh pass indexed each group's tasks per
count and stopped at the last live task) against the plain walk it replaced, written out here:
every count of the group's union in increasing order, each task asked in group order. The
same pools must be asked for the same counts in the same order, and each task handed the same
answers. Groups whose set-ups differ only in the global batch now walk their counts side by
side (each count swept for all of them at once): each group's pools are asked for the same
counts in the same order as when it walks alone, and each task handed the same answers."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from planner.cost.plan import sweep_counts_until
from planner.training.setup import TrainingSetup


class Pool:
    def __init__(self, name: str, node: int, log: list, batch: int = 1024) -> None:
        self.name, self.log = name, log
        self.m = self.space = None
        self.setup = TrainingSetup(global_batch=batch)
        self.gpu = SimpleNamespace(gpus_per_node=node)

    def at(self, ns: list[int]) -> list[tuple[str, int]]:
        self.log.append((self.name, ns[0]))
        return [(self.name, ns[0])]


def plain_walk(tasks, more=None) -> None:
    """The walk before the eleventh pass (a reference, not the planner's code)."""
    groups: dict[tuple, list[list]] = {}
    for i, (pool, ns, done) in enumerate(tasks):
        groups.setdefault((pool.gpu.gpus_per_node, pool.setup), []).append(
            [pool, set(ns), done, True, more[i] if more else None])
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
    batches = (1024,) if seed < 20 else (1024, 1032, 2048)     # one set-up, or groups differing in batch
    for i in range(rng.randint(1, 6)):
        ns = sorted(rng.sample(range(1, 40), rng.randint(0, 12)))
        spec.append((f"p{i}", rng.choice((4, 8)), ns, rng.randint(1, 45), rng.random() < 0.5, rng.choice(batches)))
    logs = []
    for walk in (sweep_counts_until, plain_walk):
        log: list = []
        seen: list = []
        tasks = [(Pool(name, node, log, batch), ns,
                  lambda cb, stop=stop, seen=seen, name=name: seen.append((name, cb)) or cb[1] >= stop)
                 for name, node, ns, stop, _, batch in spec]
        more = [lambda cb, go=go: go for *_, go, _ in spec] if seed % 2 else None
        walk(tasks, more)
        logs.append((log, seen))
    if len(batches) == 1:
        assert logs[0] == logs[1]
    for name, node, *_, batch in spec:      # each group's own order
        group = {n for n, nd, *_, b in spec if (nd, b) == (node, batch)}
        assert [x for x in logs[0][0] if x[0] in group] == [x for x in logs[1][0] if x[0] in group]
        assert [x for x in logs[0][1] if x[0] == name] == [x for x in logs[1][1] if x[0] == name]
