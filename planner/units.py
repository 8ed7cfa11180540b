"""Units. Capacities are binary (GiB = 2**30); rates and paper tables are decimal (GB = 1e9).
And the hash of frozen dataclasses looked up in caches, worked out once."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40
KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12


def ceil_div(n: int, d: int) -> int:
    """Smallest integer >= n / d (for sharding counts over ranks)."""
    return -(-n // d)


# A hash worked out once, for frozen dataclasses looked up in caches many times per plan
# (issue 32): each holds ``_hash: int = field(init=False, repr=False, compare=False,
# default=0)`` and takes these three as its __post_init__, __hash__ and __setstate__ (in its
# own body, where dataclass() leaves them).


def hash_once(obj: Any) -> None:
    """Keep the hash of ``obj``'s compared fields (the one dataclass() would work out on every call).
    A field given an unhashable value (a list where a tuple belongs, from the Python API:
    TrainingSetup(bf16_layers=[1, 1]) raised "TypeError: unhashable type: 'list'", issue 32) is
    refused in one line naming it."""
    values = tuple(getattr(obj, f.name) for f in fields(obj) if f.compare)
    try:
        object.__setattr__(obj, "_hash", hash(values))
    except TypeError:
        from planner.errors import UserError

        for f in fields(obj):
            value = getattr(obj, f.name)
            try:
                hash(value)
            except TypeError:
                raise UserError(f"{type(obj).__name__}.{f.name} {value!r} must be a tuple (or another value "
                                f"that does not change), not a {type(value).__name__}") from None
        raise


def stored_hash(obj: Any) -> int:
    return int(obj._hash)


def unpickle_hashed(obj: Any, state: list[object]) -> None:
    """Unpickled: the fields, then the hash worked out again (another process hashes strings
    with another seed)."""
    for f, value in zip(fields(obj), state):
        object.__setattr__(obj, f.name, value)
    hash_once(obj)
