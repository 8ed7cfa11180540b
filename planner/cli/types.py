"""click's value types of the command line's options beyond click's own: output paths that
refuse an empty name, float ranges that refuse nan, and numbers with a decimal suffix (token
counts, dollar amounts). Binary sizes (--seq-len 8k, --global-batch-tokens 4M) are in sizes.py."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import click


class OutputPath(click.Path):
    """click.Path for a file or directory the planner writes; an empty name is refused (click
    would take "" as ".", so `--out ""` wrote into the current directory: issue 32, U6)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} is an empty name; give a {'directory' if not self.file_okay else 'file'} name",
                      param, ctx)
        return super().convert(value, param, ctx)


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan (which passes every range comparison)."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        out = super().convert(value, param, ctx)
        if math.isnan(out):
            self.fail(f"{value!r} is not a number", param, ctx)
        return out


class LayerPair(click.ParamType):
    """Two whole numbers of layers, START,END (--bf16-layers 0,14): each 0 to 4096."""

    name = "START,END"
    UPPER = 4096

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[int, int]:
        if isinstance(value, tuple):
            return value
        parts = str(value).replace(" ", "").split(",")
        if len(parts) != 2 or not all(p.isdigit() and len(p) <= 4 and int(p) <= self.UPPER for p in parts):
            self.fail(f"{value!r} is not START,END: two whole numbers of layers from 0 to {self.UPPER} "
                      "(e.g. 0,14 for the last 14; 1,1 for the first and the last)", param, ctx)
        return int(parts[0]), int(parts[1])


class ScaledNumber(click.ParamType):
    """A positive number with an optional suffix (SUFFIXES), between LOWER (inclusive) and
    UPPER (exclusive); subclasses name it and say what a good value looks like."""

    SUFFIXES: ClassVar[dict[str, float]] = {}
    LOWER = 0.0
    UPPER = 1e18
    EXAMPLES = ""
    STRIP = ""
    what = ""
    bounds = ""

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        text = str(value).strip().lstrip(self.STRIP).replace("_", "").replace(",", "")
        scale = self.SUFFIXES.get(text[-1:].lower(), 1.0)
        if len(text) > 64:          # float() of a 5,000-digit string is slow and means nothing
            self.fail(f"{str(value)[:40]!r}... is not {self.what} (e.g. {self.EXAMPLES})", param, ctx)
        try:
            n = float(text[:-1] if scale != 1.0 else text) * scale
        except ValueError:
            self.fail(f"{value!r} is not {self.what} (e.g. {self.EXAMPLES})", param, ctx)
        if not (n > 0 and self.LOWER <= n < self.UPPER):
            self.fail(f"{value!r} must be {self.bounds}", param, ctx)
        return n


class TokenCount(ScaledNumber):
    """A token count: 2e12, 2000000000000, or with a suffix: 300B, 2T, 15.6T; from 1 to 1e18."""

    name = "N"
    SUFFIXES: ClassVar[dict[str, float]] = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    LOWER = 1.0
    UPPER = math.nextafter(1e18, math.inf)       # 1e18 itself is in range (issue 32, U7)
    what, EXAMPLES, bounds = "a token count", "2e12, 300B, 15T", "between 1 and 1e18 tokens"


class Dollars(ScaledNumber):
    """An amount in US dollars: 250000, 250k, 1.5M, $2M."""

    name = "USD"
    SUFFIXES: ClassVar[dict[str, float]] = {"k": 1e3, "m": 1e6, "b": 1e9}
    UPPER, STRIP = 1e15, "$"
    what, EXAMPLES, bounds = "an amount in dollars", "250000, 250k, 1.5M", "a positive amount in dollars"
