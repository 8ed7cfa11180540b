"""Prices (presets/prices.toml, overridable with --prices) and what plans cost: GPU-hours
and rental for a training run, capital and power for owned nodes over a horizon.

Every price carries its source and date into reports. Money is float US dollars, time is
float seconds; only the functions here turn seconds into billed hours.
"""

from __future__ import annotations

import functools
import importlib.resources
import math
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

from planner.errors import UserError
from planner.hardware.gpus import get_gpu
from planner.limits import (
    MAX_PRICES_FILE_BYTES,
    decode_text,
    parse_toml,
    read_input_file,
)

HOUR_S = 3600.0
DAY_S = 86400.0


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuPrices:
    """Prices of one GPU type; None where the catalog has no figure."""

    name: str
    rent_usd_per_gpu_hour: float | None = None
    rent_source: str = ""
    rent_date: str = ""
    rent_provider: str = ""      # who rents at that price (AWS, Lambda, ...; "--prices FILE" for the user's own)
    node_purchase_usd: float | None = None
    purchase_source: str = ""
    purchase_date: str = ""
    node_power_kw: float | None = None
    power_source: str = ""
    committed_usd_per_gpu_hour: float | None = None   # a published reserved rate, shown only
    committed_source: str = ""
    committed_date: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Prices:
    """The price catalog: per GPU, and the electricity every owned node pays."""

    gpus: dict[str, GpuPrices]
    electricity_usd_per_kwh: float
    electricity_source: str
    electricity_date: str
    pue: float
    pue_source: str
    overrides: str | None = None      # the --prices file, when one was applied

    def for_gpu(self, name: str) -> GpuPrices:
        return self.gpus.get(name) or GpuPrices(name=name)

    def rent(self, name: str) -> float:
        """USD per GPU-hour of ``name``; a UserError naming the fix when unknown."""
        p = self.for_gpu(name)
        if p.rent_usd_per_gpu_hour is None:
            raise UserError(f"no rental price for {name} in the price catalog; give rent_usd_per_gpu_hour "
                            f"for it in a --prices file, or use --objective time")
        return p.rent_usd_per_gpu_hour

    def node(self, name: str) -> GpuPrices:
        """The purchase and power figures of a ``name`` node; a UserError when missing."""
        p = self.for_gpu(name)
        missing = [k for k in ("node_purchase_usd", "node_power_kw") if getattr(p, k) is None]
        if missing:
            raise UserError(f"no {' or '.join(missing)} for {name} in the price catalog; give them in a --prices file")
        return p


_TOP_KEYS = {"electricity_usd_per_kwh", "electricity_source", "electricity_date", "pue", "pue_source", "gpu"}
_GPU_KEYS = {"name", "rent_usd_per_gpu_hour", "rent_source", "rent_date", "rent_provider", "node_purchase_usd",
             "purchase_source", "purchase_date", "node_power_kw", "power_source",
             "committed_usd_per_gpu_hour", "committed_source", "committed_date"}
_NUMBERS = {"rent_usd_per_gpu_hour", "node_purchase_usd", "node_power_kw", "electricity_usd_per_kwh", "pue",
            "committed_usd_per_gpu_hour"}
_SOURCE_OF = {"rent_usd_per_gpu_hour": "rent_source", "node_purchase_usd": "purchase_source",
              "node_power_kw": "power_source", "electricity_usd_per_kwh": "electricity_source", "pue": "pue_source"}


# Far above any real price (an H100 rents for a few dollars an hour, a DGX node costs about
# $0.4M and draws about 10 kW; an NVL72 rack about 120 kW): a larger figure is a typo, and
# its costs would be too large for the ILP solver's arithmetic (HiGHS fails on 1e17 $/h).
_MAXIMA = {"rent_usd_per_gpu_hour": 1e4, "committed_usd_per_gpu_hour": 1e4,
           "node_purchase_usd": 1e9, "node_power_kw": 1e4,
           "electricity_usd_per_kwh": 1e2, "pue": 1e1}


_DATES = {"rent_date", "purchase_date", "committed_date", "electricity_date"}


def _check_dates(table: dict[str, Any], where: str) -> None:
    """Each date of a price table a day, month or year in ISO form (a TOML date, or a quoted
    "2024-12-05", "2024-12", "2024"), as price_period_end reads it, or "" (issue 32, W12:
    rent_date = "yesterday" and rent_date = 2024 were accepted)."""
    import datetime as dt

    for key in _DATES & table.keys():
        v = table[key]
        if isinstance(v, dt.date) or (isinstance(v, str) and (not v.strip() or price_period_end(v) is not None)):
            continue
        raise UserError(f"{where}: {key} = {str(v)[:40]!r} is not a date; give \"2024-12-05\", \"2024-12\" or "
                        f"\"2024\" (quoted)")


def _check_numbers(table: dict[str, Any], where: str) -> None:
    _check_dates(table, where)
    for key in _NUMBERS & table.keys():
        v = table[key]
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0
                or v > _MAXIMA[key]):
            raise UserError(f"{where}: {key} must be a number >= 0 and at most {_MAXIMA[key]:g}, not {v!r}")
    if "pue" in table and table["pue"] < 1:
        raise UserError(f"{where}: pue must be >= 1 (facility power over IT power), not {table['pue']}")


def _apply(prices: Prices, data: dict[str, Any], where: str, is_override: bool) -> Prices:
    """``data`` (a parsed prices file) on top of ``prices``. A figure overridden without its
    source gets ``where`` as source, so reports never show a stale one."""
    unknown = data.keys() - _TOP_KEYS
    if unknown:
        raise UserError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
    _check_numbers(data, where)
    top = {k: v for k, v in data.items() if k != "gpu"}
    for key, src in _SOURCE_OF.items():
        if is_override and key in top and src not in top:
            top[src] = where
    if "electricity_usd_per_kwh" in top and "electricity_date" not in top and is_override:
        top["electricity_date"] = ""
    gpus = dict(prices.gpus)
    entries = data.get("gpu", [])
    if not isinstance(entries, list):
        raise UserError(f"{where}: gpu must be a list of [[gpu]] tables")
    named: dict[str, int] = {}
    for i, entry in enumerate(entries):
        at = f"{where} [[gpu]] #{i + 1}"
        if not isinstance(entry, dict) or "name" not in entry:
            raise UserError(f"{at}: every [[gpu]] entry needs a name (a GPU from `plan gpus`)")
        unknown = entry.keys() - _GPU_KEYS
        if unknown:
            raise UserError(f"{at} ({entry['name']}): unknown keys {sorted(unknown)}; allowed: {sorted(_GPU_KEYS)}")
        _check_numbers(entry, f"{at} ({entry['name']})")
        try:
            name = get_gpu(str(entry["name"])).name
        except UserError as err:     # issue 32, U1: the way to price a user's own GPU file
            raise UserError(f"{at}: {err}; to price your own GPU file, give its path as the name "
                            f"(name = \"./my-gpu.toml\")") from None
        if name in named:       # issue 32, W12: the last of two entries silently won
            raise UserError(f"{at}: {name} has an entry already (#{named[name]}); give each GPU one [[gpu]] entry")
        named[name] = i + 1
        fields = {k: v for k, v in entry.items() if k != "name"}
        for key, src in _SOURCE_OF.items():
            if is_override and key in fields and src not in fields:
                fields[src] = where
        for key in ("rent_usd_per_gpu_hour", "node_purchase_usd"):
            date = "rent_date" if key.startswith("rent") else "purchase_date"
            if is_override and key in fields and date not in fields:
                fields[date] = ""
        if is_override and "rent_usd_per_gpu_hour" in fields and "rent_provider" not in fields:
            fields["rent_provider"] = where          # the user's own quote
        if not is_override and "rent_usd_per_gpu_hour" in fields and not fields.get("rent_provider"):
            raise UserError(f"{at} ({entry['name']}): a rental price needs its rent_provider")
        base = gpus.get(name, GpuPrices(name=name))
        gpus[name] = replace(base, **_typed_fields(fields))
    return replace(prices, gpus=gpus, **_typed_fields(top))


def _typed_fields(table: dict[str, Any]) -> dict[str, Any]:
    """A price table's entries as the dataclass fields take them: numbers as float, the rest as str
    (typed Any: each key names a field of its own type, which mypy cannot follow through **)."""
    return {k: (float(v) if k in _NUMBERS else str(v)) for k, v in table.items()}


def _read(path: Path) -> dict[str, Any]:
    """The --prices file: a regular file of at most MAX_PRICES_FILE_BYTES, TOML, nested and
    numbered within planner.limits' bounds."""
    what = f"--prices {path}"
    text = decode_text(read_input_file(path, what, MAX_PRICES_FILE_BYTES), what, "TOML")
    return parse_toml(text, what)


@functools.cache
def _shipped() -> Prices:
    text = (importlib.resources.files("planner") / "presets" / "prices.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    missing = {"electricity_usd_per_kwh", "electricity_source", "electricity_date", "pue", "pue_source"} - data.keys()
    if missing:
        raise UserError(f"prices.toml: missing {sorted(missing)}")
    empty = Prices(gpus={}, electricity_usd_per_kwh=0.0, electricity_source="", electricity_date="", pue=1.0,
                   pue_source="")
    return _apply(empty, data, "prices.toml", is_override=False)


def load_prices(path: str | Path | None = None) -> Prices:
    """The shipped catalog, with the entries of the TOML file ``path`` (--prices) on top."""
    prices = _shipped()
    if path is None:
        return prices
    path = Path(path)
    return replace(_apply(prices, _read(path), str(path), is_override=True), overrides=str(path))


# ------------------------------------------------------------------------ dates

STALE_AFTER_DAYS = 365      # a market price older than a year is flagged (issue 20)


def price_period_end(text: str) -> date | None:
    """The last day a price's date can mean ("2024" -> 2024-12-31, "2024-12" -> 2024-12-31,
    "2024-12-05" itself); None when it is empty or not such a date. The end of the period,
    so that a price is called stale only when it surely is."""
    import calendar

    parts = text.strip().split("-")
    try:
        numbers = [int(x) for x in parts]
    except ValueError:
        return None
    try:
        if len(numbers) == 1:
            return date(numbers[0], 12, 31)
        if len(numbers) == 2:
            return date(numbers[0], numbers[1], calendar.monthrange(numbers[0], numbers[1])[1])
        if len(numbers) == 3:
            return date(*numbers)
    except ValueError:
        return None
    return None


def stale_prices(prices: Prices, gpu_names: Iterable[str], today: date, *, rent: bool = True,
                 own: bool = False) -> list[dict[str, Any]]:
    """The market prices behind a report that are older than STALE_AFTER_DAYS on ``today``
    (or carry no date): rental rates (``rent``) and purchase prices and electricity
    (``own``, for `plan buy`), each as {gpu, price, date, age_days}."""
    out: list[dict[str, Any]] = []

    def check(gpu: str, what: str, when: str) -> None:
        end = price_period_end(when)
        age = None if end is None else (today - end).days
        if age is None or age > STALE_AFTER_DAYS:
            out.append({"gpu": gpu, "price": what, "date": when, "age_days": age})

    for name in gpu_names:
        p = prices.for_gpu(name)
        if rent and p.rent_usd_per_gpu_hour is not None:
            check(name, "rent", p.rent_date)
        if own and p.node_purchase_usd is not None:
            check(name, "node purchase", p.purchase_date)
    if own:
        check("", "electricity", prices.electricity_date)
    return out


def stale_line(stale: list[dict[str, Any]]) -> str | None:
    """One line naming the stale prices, or None when every price is fresh."""
    if not stale:
        return None
    parts = [f"{s['gpu'] + ' ' if s['gpu'] else ''}{s['price']} ({s['date'] or 'undated'})" for s in stale]
    return (f"warning: prices older than a year: {', '.join(parts)}; costs may be far off today's market: "
            f"give current ones with --prices FILE")


# ------------------------------------------------------------------------ arithmetic

def gpu_hours(n_gpus: int, seconds: float) -> float:
    """GPU-hours of ``n_gpus`` GPUs busy for ``seconds``."""
    return n_gpus * seconds / HOUR_S


def rental_cost_usd(n_gpus: int, seconds: float, usd_per_gpu_hour: float) -> float:
    """Renting ``n_gpus`` GPUs for ``seconds`` at an hourly rate per GPU (billed by the second)."""
    return gpu_hours(n_gpus, seconds) * usd_per_gpu_hour


def node_energy_usd(power_kw: float, seconds: float, prices: Prices) -> float:
    """Electricity of one node drawing ``power_kw`` for ``seconds``, facility overhead (PUE)
    included: kW x PUE x hours x USD/kWh."""
    return power_kw * prices.pue * seconds / HOUR_S * prices.electricity_usd_per_kwh


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeCost:
    """What owning one node of a GPU type costs over a horizon."""

    gpu: str
    capex_usd: float          # purchase
    opex_usd: float           # power over the horizon, PUE included

    @property
    def tco_usd(self) -> float:
        return self.capex_usd + self.opex_usd


def node_cost(gpu: str, horizon_s: float, prices: Prices) -> NodeCost:
    """Total cost of ownership of one ``gpu`` node over ``horizon_s``: its purchase price
    plus its power for the whole horizon (a bought node draws power whether or not a job
    runs; the catalog's power is the draw under training load, an upper bound when idle)."""
    p = prices.node(gpu)
    assert p.node_purchase_usd is not None and p.node_power_kw is not None
    return NodeCost(gpu=gpu, capex_usd=p.node_purchase_usd,
                    opex_usd=node_energy_usd(p.node_power_kw, horizon_s, prices))


def rent_providers(prices: Prices, gpu_names: list[str]) -> dict[str, str]:
    """GPU name -> the provider of its rental price, for the priced GPUs among ``gpu_names``."""
    out = {}
    for name in gpu_names:
        p = prices.for_gpu(name)
        if p.rent_usd_per_gpu_hour is not None:
            out[name] = p.rent_provider or "unnamed"
    return out
