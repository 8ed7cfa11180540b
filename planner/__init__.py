"""planner: how many GPUs, which layout, how much memory, for a training run."""

__version__ = "0.1.0"
