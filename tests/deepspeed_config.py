"""DeepSpeed's own config parser as the referee of the ds_config.json --out writes
(tests/test_emit.py, tests/test_megatron_deepspeed.py); moved here from planner/emit/deepspeed.py,
which no command used it from."""

from __future__ import annotations

from typing import Any

from planner.emit.deepspeed import import_deepspeed


class _DataParallelMpu:
    """The one method DeepSpeedConfig asks a model-parallel unit for."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def validate_deepspeed_config(cfg: dict[str, Any], data_parallel: int, n_gpus: int | None = None) -> Any:
    """Parse ``cfg`` with DeepSpeed's own DeepSpeedConfig at ``data_parallel`` ranks.

    Without a process group DeepSpeedConfig assumes a world of one rank, so
    deepspeed.runtime.config.dist.get_rank/get_world_size are patched for the call and
    an mpu reports the data-parallel size (docs/facts.md). Raises what DeepSpeed
    raises (AssertionError, pydantic.ValidationError) for a config it rejects; returns
    the parsed DeepSpeedConfig. Imports deepspeed (about 2 s; set DS_ACCELERATOR=cpu
    first to skip its accelerator probe).
    """
    from unittest import mock

    ds_config = import_deepspeed("deepspeed.runtime.config")

    world = n_gpus or data_parallel
    with mock.patch.object(ds_config.dist, "get_rank", return_value=0), \
            mock.patch.object(ds_config.dist, "get_world_size", return_value=world):
        return ds_config.DeepSpeedConfig(dict(cfg), mpu=_DataParallelMpu(data_parallel))
