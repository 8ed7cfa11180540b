"""Durations, dates, token counts, and the jobs file of `plan buy`.

A duration is a number with a unit: 90s, 45min, 12h, 30d, 2w, 1y = 365d (also 1.5d); a date is ISO
8601 (2026-03-01, or 2026-03-01T12:00, UTC unless it names a zone). The jobs file is
YAML (or TOML or JSON, by extension); examples/jobs.yaml documents it:

    start: 2026-01-05        # optional: the day the cluster is ready; anchors dates (default: today)
    horizon: 365d            # optional: how long the cluster is owned and powered (--horizon wins)
    gpus: [h100, h200, b200] # optional: the GPU types to choose from (--gpus wins)
    jobs:
      - name: pretrain-8b    # required, unique
        model: llama3.1-8b   # required: a preset or a config.json path (relative to the file)
        tokens: 1T           # required: 1e12, 1T, 300B
        deadline: 30d        # required: a duration from the job's start, or a date
        start: 0d            # optional: a duration from the cluster's start, or a date (default 0d)
        seq_len: 4096        # optional (default 4096)
        global_batch: 1024   # optional, sequences per step (default: scaled with the run for
                             # full training, 64 for a fine-tune; planner.training.batch)
        method: full         # optional: full, lora, qlora, freeze (default full)

Jobs whose [start, finish) intervals overlap share the cluster's GPUs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from planner.errors import UserError
from planner.hardware.gpus import get_gpu
from planner.limits import (
    MAX_JOBS,
    MAX_JOBS_FILE_BYTES,
    check_gpu_type_count,
    check_label,
    check_name,
    check_tree,
    decode_text,
    parse_error_text,
    parse_json,
    parse_toml,
    read_input_file,
)
from planner.models.spec import ModelSpec, load_model
from planner.training.checks import check_setup, default_seq_len, tokens_refusal
from planner.training.setup import MAX_GLOBAL_BATCH, MAX_SEQ_LEN, TrainingSetup

UNITS_S = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "hr": 3600.0, "d": 86400.0,
           "day": 86400.0, "days": 86400.0, "w": 604800.0, "wk": 604800.0, "weeks": 604800.0,
           "y": 365 * 86400.0, "yr": 365 * 86400.0}
TOKEN_SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
DURATION_HINT = "a number with s, min, h, d, w or y (90min, 12h, 30d, 2w, 1y)"
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]+)\s*$", re.IGNORECASE)


def parse_duration_s(text: Any, what: str, allow_zero: bool = False) -> float:
    """Seconds in a duration such as 30d, 12h, 2w, 90min; ``what`` names the input in errors."""
    m = _DURATION.match(str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in UNITS_S:
        raise UserError(f"{what} {text!r} is not a duration; give {DURATION_HINT}")
    seconds = float(m.group(1)) * UNITS_S[unit]
    if not (0 <= seconds if allow_zero else 0 < seconds) or seconds >= 1e12:
        raise UserError(f"{what} {text!r} must be longer than zero" if seconds < 1e12
                        else f"{what} {text!r} is too long")
    return seconds


def parse_date(text: Any, what: str) -> datetime:
    """An ISO 8601 date or date-time (UTC unless it names a zone)."""
    if isinstance(text, datetime):
        d = text
    elif isinstance(text, date):
        d = datetime(text.year, text.month, text.day)
    else:
        try:
            d = datetime.fromisoformat(str(text).strip())
        except ValueError:
            raise UserError(f"{what} {text!r} is neither a duration ({DURATION_HINT}) nor an ISO date "
                            f"(2026-03-01)") from None
    return d if d.tzinfo is not None else d.replace(tzinfo=UTC)


def _looks_like_date(text: Any) -> bool:
    return isinstance(text, (date, datetime)) or bool(re.match(r"^\s*\d{4}-\d{2}-\d{2}", str(text)))


def parse_when_s(text: Any, what: str, anchor: datetime, allow_zero: bool = False) -> tuple[float, bool]:
    """(seconds, is_date): a duration, or a date as seconds after ``anchor``."""
    if _looks_like_date(text):
        return (parse_date(text, what) - anchor).total_seconds(), True
    m = _DURATION.match(str(text))
    if m is None or m.group(2).lower() not in UNITS_S:
        raise UserError(f"{what} {text!r} is neither a duration ({DURATION_HINT}) nor an ISO date (2026-03-01)")
    return parse_duration_s(text, what, allow_zero), False


def parse_tokens(text: Any, what: str) -> float:
    """A token count: 2e12, 2000000000000, 300B, 2T, 15.6T."""
    if isinstance(text, bool):
        raise UserError(f"{what} {text!r} is not a token count (e.g. 2e12, 300B, 15T)")
    if isinstance(text, (int, float)):
        n = float(text)
    else:
        s = str(text).strip().replace("_", "").replace(",", "")
        scale = TOKEN_SUFFIXES.get(s[-1:].lower(), 1.0)
        try:
            n = float(s[:-1] if scale != 1.0 else s) * scale
        except ValueError:
            raise UserError(f"{what} {text!r} is not a token count (e.g. 2e12, 300B, 15T)") from None
    if not (math.isfinite(n) and 1 <= n <= 1e18):     # the same bounds as --tokens
        raise UserError(f"{what} {text!r} must be a token count between 1 and 1e18")
    return n


# ------------------------------------------------------------------------ the jobs file

JOB_KEYS = {"name", "model", "tokens", "deadline", "start", "seq_len", "global_batch", "method", "lora_targets"}
JOB_REQUIRED = ("name", "model", "tokens", "deadline")
FILE_KEYS = {"jobs", "start", "horizon", "gpus"}


@dataclass(frozen=True, kw_only=True, slots=True)
class JobSpec:
    """One job of the file: what to train, and when (seconds from the cluster's start)."""

    name: str
    model: str                 # preset name or resolved config path
    tokens: float
    start_s: float
    deadline_s: float          # absolute: the job must finish by then
    seq_len: int = 4096
    global_batch: int | None = None   # None: planner.training.batch.default_global_batch
    method: str = "full"
    lora_targets: tuple[str, ...] = ()    # method lora/qlora: the layers adapted (() : PEFT's default)


@dataclass(frozen=True, kw_only=True, slots=True)
class JobsFile:
    jobs: tuple[JobSpec, ...]
    start: datetime            # the cluster's day 0
    horizon_s: float | None = None
    gpus: tuple[str, ...] = field(default_factory=tuple)
    path: str = ""


def _read(path: Path) -> Any:
    """The parsed jobs file: a regular file of at most MAX_JOBS_FILE_BYTES (checked before
    it is parsed, so a 12 MB list is refused at once), YAML without aliases (an alias bomb
    of a few hundred bytes expands to gigabytes), nested and numbered within planner.limits'
    bounds."""
    what = f"jobs file {path}"
    suffix = path.suffix.lower()
    kind = {".toml": "TOML", ".json": "JSON"}.get(suffix, "YAML")
    text = decode_text(read_input_file(path, what, MAX_JOBS_FILE_BYTES), what, kind)
    if suffix == ".toml":
        return parse_toml(text, what)
    if suffix == ".json":
        return parse_json(text, what)
    try:
        data = _load_yaml(text)
    except Exception as e:  # noqa: BLE001 - yaml raises its own errors, ValueError past 4,300 digits
        raise UserError(f"{what}: not valid YAML ({parse_error_text(e)})") from None
    check_tree(data, what)
    return data


def _load_yaml(text: str) -> Any:
    """yaml.safe_load, refusing aliases (``*name``): a jobs file has no use for them, and
    nine levels of nine aliases of a list expand a file of under a kilobyte to 9**9 = 387,420,489
    items. libyaml's loader (yaml.CSafeLoader, in PyYAML's wheels) reads the file where it can,
    about eight times faster (65 -> 8 ms for a 256-job file): its document is taken where no
    node is reached twice (an alias is its anchor's node again); anything else, an alias or an
    error, or a PyYAML without libyaml, is read again by the pure-Python loader below, whose
    answer and error messages are the file's."""
    import yaml  # imported here: only `plan buy` reads YAML

    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            c_loader = fast(text)
            try:
                node = c_loader.get_single_node()
                if node is None:
                    return None
                if not _reaches_a_node_twice(node):
                    return c_loader.construct_document(node)
            finally:
                c_loader.dispose()
        except Exception:  # noqa: BLE001, S110 - the pure-Python loader below says what is wrong
            pass

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.YAMLError(f"aliases (*{event.anchor}) are not allowed in a jobs file, "
                                     f"line {event.start_mark.line + 1}; write the value out")
            return super().compose_node(parent, index)

    loader = NoAliasLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _reaches_a_node_twice(root: Any) -> bool:
    """Whether a composed YAML document reaches some node twice: an alias (``*name``) composes
    to its anchor's node itself, so a document without aliases is a tree."""
    import yaml

    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            return True
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack += (k, v)
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value
    return False


def _positive_int(v: Any, where: str, key: str, maximum: int) -> int:
    """A whole number from 1 to ``maximum`` (the same limit as the matching `plan` option)."""
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= maximum:
        raise UserError(f"{where}: {key} must be a whole number from 1 to {maximum:,}, not {v!r}")
    return v


def load_jobs(path: str | Path, today: datetime | None = None) -> JobsFile:
    """Read and check a jobs file (see the module docstring). Model paths are taken
    relative to the file; dates are anchored at the file's ``start`` (default ``today``)."""
    from planner.training.finetune import METHODS

    path = Path(path)
    data = _read(path)
    where = f"jobs file {path}"
    if not isinstance(data, dict) or "jobs" not in data:
        raise UserError(f"{where}: expected a mapping with a `jobs:` list (see examples/jobs.yaml)")
    unknown = set(data) - FILE_KEYS
    if unknown:
        raise UserError(f"{where}: unknown keys {sorted(map(str, unknown))}; allowed: {sorted(FILE_KEYS)}")
    anchor = today or datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if data.get("start") is not None:
        anchor = parse_date(data["start"], f"{where}: start")
    horizon = parse_duration_s(data["horizon"], f"{where}: horizon") if data.get("horizon") is not None else None
    gpus = data.get("gpus") or ()
    if isinstance(gpus, str):
        gpus = [g.strip() for g in gpus.split(",") if g.strip()]
    if isinstance(gpus, (list, tuple)):     # YAML reads [4090] as a number: the name it spells
        gpus = [str(g) if isinstance(g, int) and not isinstance(g, bool) else g for g in gpus]
    if not isinstance(gpus, (list, tuple)) or not all(isinstance(g, str) for g in gpus):
        raise UserError(f"{where}: gpus must be a list of GPU names (`plan gpus`), e.g. [h100, h200]")
    check_gpu_type_count(gpus, f"{where}: gpus")
    twice = next((g for i, g in enumerate(gpus) if g in gpus[:i]), None)
    if twice is not None:
        raise UserError(f"{where}: gpus lists {twice} twice; give each GPU type once")
    for g in gpus:
        try:
            get_gpu(g)
        except UserError as err:
            raise UserError(f"{where}: gpus: {err}") from None
    entries = data["jobs"]
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{where}: `jobs:` must be a non-empty list of jobs")
    if len(entries) > MAX_JOBS:
        raise UserError(f"{where}: {len(entries)} jobs; the planner sizes at most {MAX_JOBS} in one purchase "
                        f"(group similar runs into one job, or split the file)")
    jobs: list[JobSpec] = []
    models: dict[str, ModelSpec] = {}
    for i, e in enumerate(entries):
        at = f"{where}, job #{i + 1}"
        if not isinstance(e, dict):
            raise UserError(f"{at}: a job is a mapping with {', '.join(JOB_REQUIRED)}")
        if "name" in e:
            at = f"{where}, job {e['name']!r}"
        missing = [k for k in JOB_REQUIRED if e.get(k) is None]
        if missing:
            raise UserError(f"{at}: missing {', '.join(missing)} (a job needs {', '.join(JOB_REQUIRED)})")
        unknown = set(e) - JOB_KEYS
        if unknown:
            raise UserError(f"{at}: unknown keys {sorted(map(str, unknown))}; allowed: {sorted(JOB_KEYS)}")
        name = str(e["name"])
        check_label(name, f"{where}: job name")         # printed in the report and the plot
        if any(j.name == name for j in jobs):
            raise UserError(f"{at}: two jobs are named {name!r}; names must be unique")
        start_s = 0.0
        if e.get("start") is not None:
            start_s, _ = parse_when_s(e["start"], f"{at}: start", anchor, allow_zero=True)
            if start_s < 0:
                raise UserError(f"{at}: start {e['start']} is before the cluster's start "
                                f"{anchor.date().isoformat()}; move it or set the file's start")
        deadline, is_date = parse_when_s(e["deadline"], f"{at}: deadline", anchor)
        deadline_s = deadline if is_date else start_s + deadline
        if deadline_s <= start_s:
            raise UserError(f"{at}: deadline {e['deadline']} is not after the job's start")
        model = str(e["model"])
        check_name(model, f"{at}: model")
        local = path.parent / model
        if (model.endswith(".json") or "/" in model) and local.exists():
            model = str(local)
        try:    # an unknown name or a bad config.json: say which job; each model read once per file
            m = models[model] if model in models else models.setdefault(model, load_model(model))
        except UserError as err:
            raise UserError(f"{at}: model {e['model']!r}: {err}") from None
        method = str(e.get("method", "full"))
        if method not in METHODS:
            raise UserError(f"{at}: method {method!r} is not one of {', '.join(METHODS)}")
        job = JobSpec(
            name=name, model=model, tokens=parse_tokens(e["tokens"], f"{at}: tokens"), start_s=start_s,
            deadline_s=deadline_s, method=method, lora_targets=_targets(e.get("lora_targets"), at, method),
            seq_len=_positive_int(e.get("seq_len", default_seq_len(m)), at, "seq_len", MAX_SEQ_LEN),
            global_batch=(None if e.get("global_batch") is None
                          else _positive_int(e["global_batch"], at, "global_batch", MAX_GLOBAL_BATCH)))
        check_job(m, job, at)
        jobs.append(job)
    return JobsFile(jobs=tuple(jobs), start=anchor, horizon_s=horizon, gpus=tuple(gpus), path=str(path))


def _targets(value: Any, at: str, method: str) -> tuple[str, ...]:
    """A job's lora_targets: a comma-separated string or a list of names (attention, mlp,
    all-linear or module names), for method lora or qlora only."""
    if value is None:
        return ()
    if method not in ("lora", "qlora"):
        raise UserError(f"{at}: lora_targets needs method lora or qlora, not {method}")
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(t, str) for t in names) or not any(t.strip() for t in names):
        raise UserError(f"{at}: lora_targets must name layers: attention, mlp, all-linear or module names (q_proj)")
    return tuple(t.strip() for t in names if t.strip())


def job_setup(job: JobSpec, base: TrainingSetup, m: Any) -> TrainingSetup:
    """The training set-up a job plans with: ``base`` with its sequence, batch and method (a
    job without global_batch: planner.training.batch.default_global_batch for model ``m``)."""
    from dataclasses import replace

    from planner.models.spec import count_params
    from planner.training.batch import default_global_batch
    from planner.training.finetune import FinetuneSpec

    batch = job.global_batch
    if batch is None:       # issue 33: not 1,024 sequences for every job whatever its size and method
        batch = default_global_batch(count_params(m).total, job.tokens, job.seq_len, job.method)
    return replace(base, seq_len=job.seq_len, global_batch=batch,
                   finetune=FinetuneSpec.named(job.method, targets=job.lora_targets or None))


def check_job(m: Any, job: JobSpec, at: str) -> None:
    """A job's set-up against the rules a plan's options meet (planner.training.checks) and
    its LoRA targets against the model's layers, before any search: a UserError naming the
    job and its keys (issue 32, U2: the refusal came after seconds of search and named
    --lora-targets, which plan buy does not have)."""
    from planner.training.finetune import resolve_targets

    setup = job_setup(job, TrainingSetup(), m)
    try:
        check_setup(m, setup)
        resolve_targets(m, setup.finetune, option="the job's lora_targets")
        why = tokens_refusal(setup, job.tokens, "tokens", "global_batch")
        if why is not None:
            raise UserError(why)
    except UserError as err:
        raise UserError(f"{at}: {err}") from None

