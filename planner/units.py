"""Units. Capacities are binary (GiB = 2**30); rates and paper tables are decimal (GB = 1e9)."""

KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40
KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12


def ceil_div(n: int, d: int) -> int:
    """Smallest integer >= n / d (for sharding counts over ranks)."""
    return -(-n // d)
