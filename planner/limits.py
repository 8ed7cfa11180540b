"""Input limits: the largest values the planner accepts, and why.

Each limit sits far above anything trained today, so no real model or cluster meets it,
and low enough that a typo (an extra zero, a pasted exponent) is refused at once with a
message instead of making the planner search for minutes or build huge objects. The
README's "Input limits" table lists them; tests/test_fuzz_cli.py holds the planner to
them. Limits on command-line options (GPU counts, sequence length, batch sizes) live
next to their options in planner.training.setup and planner.api.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# A model's widths and counts (config.json): hidden size, MLP width, vocabulary, heads,
# head width, layers, experts. The largest published models stay below 1e6 in each
# (Llama 3.1 405B: hidden 16,384, MLP 53,248, vocabulary 128,256, 126 layers).
MAX_MODEL_DIM = 10**7
# Learned or rotary positions a config may declare (Llama 4 Scout declares 10,485,760).
MAX_POSITIONS = 2**31 - 1
# Total parameters: about 500 times Llama 3.1 405B's 4.05e11 (1e15 is still accepted).
MAX_PARAMS = 10**15
# A config.json or topology file is a few KiB; a larger file is the wrong file (weights).
MAX_CONFIG_BYTES = 16 * 2**20
# Jobs in one `plan buy` file: each is searched on every GPU type and count (about a second
# each) and adds options to the purchase ILP.
MAX_JOBS = 256

# GPU types one `plan --tokens` or `plan buy` chooses among (--gpus h100,b200,..., a jobs file's
# gpus): each is a search of its own, so the time grows with the list (issue 32's hunt:
# DeepSeek-V3 --tokens 15T over 64 types, the 23-type catalog and 41 GPU files, took 8.8 s of
# CPU on 2 cores, and nothing bounded the list). The catalog's 24 and 8 of a user's own.
MAX_GPU_TYPES = 32

# config.json keys the loader reads, by the type each must have (None: use the default).
CONFIG_INT_KEYS = (
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers",
    "intermediate_size", "vocab_size", "max_position_embeddings", "num_local_experts",
    "num_experts_per_tok", "n_embd", "n_head", "n_layer", "n_inner", "n_positions",
    "type_vocab_size", "num_kv_heads", "ffn_hidden_size", "n_embed",
    # the 2024-2026 families (planner.models.recent)
    "moe_intermediate_size", "num_experts", "n_routed_experts", "n_shared_experts", "q_lora_rank",
    "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "first_k_dense_replace",
    "decoder_sparse_step", "intermediate_size_mlp", "interleave_moe_layer_step", "sliding_window",
    "attention_chunk_size", "num_nextn_predict_layers", "sliding_window_pattern", "max_window_layers",
    "no_rope_layer_interval",
)
CONFIG_BOOL_KEYS = (
    "attention_bias", "mlp_bias", "tie_word_embeddings", "new_decoder_architecture", "multi_query",
    "parallel_attn", "alibi", "bias", "use_parallel_residual", "use_sliding_window",
)
CONFIG_PROBABILITY_KEYS = (
    "attention_dropout", "resid_pdrop", "attn_pdrop", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "hidden_dropout",
)
CONFIG_STR_KEYS = ("model_type", "hidden_act", "hidden_activation", "activation_function")


def check_config_types(cfg: Mapping[str, Any], where: str) -> str | None:
    """The first key of a config.json dict whose value has the wrong type or range, as a
    message naming the key, the value and what is expected; None when all are fine.

    Integers must be JSON integers (not true/false, not 4096.0) between 0 and their limit;
    flags must be true or false; dropout probabilities numbers in [0, 1]; activation
    names strings. A key set to null takes the architecture's default."""
    for key in CONFIG_INT_KEYS:
        v = cfg.get(key)
        if v is None:
            continue
        cap = MAX_POSITIONS if key in ("max_position_embeddings", "n_positions") else MAX_MODEL_DIM
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= cap:
            return f"{where}: key {key!r} must be an integer from 0 to {cap:,}, got {_show(v)}"
    for key in CONFIG_BOOL_KEYS:
        v = cfg.get(key)
        if v is not None and not isinstance(v, bool):
            return f"{where}: key {key!r} must be true or false, got {_show(v)}"
    for key in CONFIG_PROBABILITY_KEYS:
        v = cfg.get(key)
        if v is None:
            continue
        # NaN and inf fail the comparison, and an integer of any size compares without a float
        # (math.isfinite(10**400) raises OverflowError)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            return f"{where}: key {key!r} must be a probability from 0 to 1, got {_show(v)}"
    for key in CONFIG_STR_KEYS:
        v = cfg.get(key)
        if v is not None and not isinstance(v, str):
            return f"{where}: key {key!r} must be a string, got {_show(v)}"
    return None


# Topology files (topologies/README.md): each key's type and range. The bounds keep the
# graph the planner builds (planner.hardware.graph.build_graph, a few nodes of the cluster) to
# thousands of vertices: an NVL576 domain, 64 NICs or switch chips per node, 100,000 nodes.
_INT, _NUM, _BOOL, _STR, _TABLE = "an integer", "a number", "true or false", "a string", "a table"
TOPOLOGY_KEY_RULES: dict[str, tuple[str, float, float]] = {
    "name": (_STR, 0, 0), "description": (_STR, 0, 0), "gpu": (_STR, 0, 0), "fabric": (_STR, 0, 0),
    "source": (_STR, 0, 0),
    "gpus_per_node": (_INT, 1, 256),
    "max_nodes": (_INT, 1, 100_000),
    "domain_gpus": (_INT, 1, 1024),
    "switches": (_INT, 0, 64),
    "sockets": (_INT, 1, 16),
    "nics_per_node": (_INT, 1, 64),
    "nodes_per_leaf": (_INT, 1, 100_000),
    "gpu_link_gb_per_s": (_NUM, 1e-3, 1e6), "peer_link_gb_per_s": (_NUM, 1e-3, 1e6),
    "link_gb_per_s": (_NUM, 1e-3, 1e6), "uplink_gb_per_s": (_NUM, 1e-3, 1e6),
    "socket_link_gb_per_s": (_NUM, 1e-3, 1e6), "nic_gbit_per_s": (_NUM, 1e-3, 1e7),
    "latency_us": (_NUM, 0, 1e6), "switch_latency_us": (_NUM, 0, 1e6),
    "oversubscription": (_NUM, 1, 1e3),
    "memory_gib": (_NUM, 1e-3, 1e9), "nvme_gb": (_NUM, 1e-3, 1e12),
    "rail_optimized": (_BOOL, 0, 0),
    "intra_node": (_TABLE, 0, 0), "pcie": (_TABLE, 0, 0), "network": (_TABLE, 0, 0), "host": (_TABLE, 0, 0),
}


def check_topology_types(table: Mapping[str, Any], where: str,
                         rules: Mapping[str, tuple[str, float, float]] = TOPOLOGY_KEY_RULES) -> str | None:
    """The first key of a topology table whose value has the wrong type or is out of
    range (``rules``: TOPOLOGY_KEY_RULES), as a message; None when all are fine. Unknown
    keys are left to the caller, which names the allowed ones."""
    for key, v in table.items():
        rule = rules.get(key)
        if rule is None:
            continue
        kind, lo, hi = rule
        if kind == _STR:
            ok = isinstance(v, str)
        elif kind == _BOOL:
            ok = isinstance(v, bool)
        elif kind == _TABLE:
            ok = isinstance(v, Mapping)
        else:
            number = isinstance(v, int) if kind == _INT else isinstance(v, (int, float))
            # an int of any size compares without a float (math.isfinite(10**400) raises)
            ok = number and not isinstance(v, bool) and (isinstance(v, int) or math.isfinite(v)) and lo <= v <= hi
            kind = f"{kind} from {lo:g} to {hi:g}"
        if not ok:
            return f"{where}: {key} must be {kind}, got {_show(v)}"
    return None


# GPU files (presets/gpus.toml and a user's own, `--gpus ./my-gpu.toml`): each key's type and
# range. The bounds sit far above any GPU sold (B300: 288 GB, 8 TB/s, 4.5 PFLOP/s dense FP8)
# and refuse a unit slip (TB/s typed as GB/s, sparse rates typed in PFLOP/s as TFLOP/s).
GPU_KEY_RULES: dict[str, tuple[str, float, float]] = {
    "name": (_STR, 0, 0), "full_name": (_STR, 0, 0), "intra_node_link": (_STR, 0, 0), "source": (_STR, 0, 0),
    "default_topology": (_STR, 0, 0), "architecture": (_STR, 0, 0),
    "training_mfu_ceiling_basis": (_STR, 0, 0), "training_mfu_ceiling_source": (_STR, 0, 0),
    # a share of the dense 16-bit peak: no training step reaches 1 (timing.efficiency)
    "training_mfu_ceiling": (_NUM, 0.01, 1.0),
    "memory_mib": (_NUM, 1, 2**24), "memory_gib": (_NUM, 1e-3, 2**14), "memory_gb": (_NUM, 1e-3, 2**14),
    "bf16_tflops": (_NUM, 1e-3, 1e6), "fp16_tflops": (_NUM, 1e-3, 1e6), "fp8_tflops": (_NUM, 1e-3, 1e6),
    "tf32_tflops": (_NUM, 1e-3, 1e6), "fp32_tflops": (_NUM, 1e-3, 1e6),
    "hbm_gb_per_s": (_NUM, 1e-3, 1e6), "intra_node_gb_per_s": (_NUM, 1e-3, 1e6),
    "inter_node_gbit_per_s": (_NUM, 1e-3, 1e7), "tdp_w": (_NUM, 1, 1e5),
    "gpus_per_node": (_INT, 1, 1024),
    "sms": (_INT, 1, 100_000),      # B200: 148 SMs; MI300X: 304 compute units
}


def check_gpu_types(table: Mapping[str, Any], where: str) -> str | None:
    """The first key of a [[gpu]] table with the wrong type or out of range (GPU_KEY_RULES),
    or an ``aliases`` that is not a list of strings, as a message; None when all are fine."""
    aliases = table.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases) or len(aliases) > 64:
        return f"{where}: aliases must be a list of strings, got {_show(aliases)}"
    return check_topology_types({k: v for k, v in table.items() if k in GPU_KEY_RULES}, where, GPU_KEY_RULES)


def check_gpu_type_count(names: Sequence[str], what: str) -> None:
    """Refuse (UserError) a list of more than MAX_GPU_TYPES GPU types to choose among
    (``what`` names the input: --gpus, a jobs file's gpus)."""
    from planner.errors import UserError

    if len(names) > MAX_GPU_TYPES:
        raise UserError(f"{what} names {len(names):,} GPU types; at most {MAX_GPU_TYPES} are compared at once "
                        f"(each is a search of its own): give the ones you would buy or rent")


def _show(v: Any) -> str:
    """A value for an error message, cut short (a fuzzed file may hold megabytes)."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------------ input files and names
#
# Every file a user passes (config.json, topology TOML, jobs YAML/TOML/JSON, prices TOML) is
# read through read_input_file: a regular file (not /dev/zero, a FIFO, a directory), at most
# its size cap, read in one bounded read; parsed text goes through check_tree. A name that
# cannot be a path on Linux (a component over NAME_MAX = 255 bytes, a path over PATH_MAX =
# 4096 bytes: <linux/limits.h>) is refused before any file-system call sees it.

# <linux/limits.h>: NAME_MAX 255 bytes per path component, PATH_MAX 4096 bytes per path.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
# A jobs file of MAX_JOBS jobs at ~200 bytes each is ~50 KiB; a prices file a few KiB.
MAX_JOBS_FILE_BYTES = 1 * 2**20
MAX_PRICES_FILE_BYTES = 1 * 2**20
# Tables and lists nest 3 deep in every schema (file -> jobs -> job); 32 is ample.
MAX_NESTING = 32
# Whole numbers beyond a signed 64-bit integer (about 9.2e18) mean nothing to the planner
# (token counts stop at 1e18, bytes at exabytes) and overflow float() past 1.8e308.
MAX_ABS_INT = 2**63 - 1
# Per-rank memory terms are int64 bytes. A term computed in float (activations: layers x
# bytes per layer x micro-batches in flight) can pass 2**63 at the option limits (405B,
# sequence 4,194,304, eager attention, one rank: 1.35e19 bytes), and casting it to int64
# gives garbage (a negative total that "fits"). Such terms saturate at 2**56 bytes (64 PiB,
# a million times any GPU's memory), low enough that a few dozen of them still sum inside
# int64: a saturated layout never fits, and the least-memory figure is shown as at least that.
MAX_MODELLED_BYTES = 2**56


def check_keys(table: Mapping[str, Any], required: set[str], optional: set[str], where: str) -> None:
    """Refuse (UserError) a table with keys outside ``required | optional`` or without every
    required key, naming them and what is allowed."""
    from planner.errors import UserError

    unknown = table.keys() - required - optional
    if unknown:
        raise UserError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(required | optional)}")
    missing = required - table.keys()
    if missing:
        raise UserError(f"{where}: missing keys {sorted(missing)}")


def saturated_bytes(x: Any) -> Any:
    """A float array of bytes as int64, values past MAX_MODELLED_BYTES (and NaN) clipped
    to it: never the undefined result of casting an out-of-range float."""
    import numpy as np

    # fmin returns the number where one side is NaN; the floor keeps -inf castable too
    cap = float(MAX_MODELLED_BYTES)
    return np.fmax(np.fmin(x, cap), -cap).astype(np.int64)


def check_name(value: str, what: str) -> None:
    """Refuse (UserError) a name or path no file system takes: NUL bytes, a component
    longer than 255 bytes or a path longer than 4,096 (``what`` names the input)."""
    from planner.errors import UserError

    shown = value if len(value) <= 60 else value[:57] + "..."
    if "\x00" in value:
        raise UserError(f"{what} {shown!r} holds a NUL character; give a preset name or a file path")
    raw = value.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_PATH_BYTES or any(len(part) > MAX_NAME_BYTES for part in raw.split(b"/")):
        raise UserError(f"{what} {shown!r} ({len(raw):,} bytes) is too long for a name or a path "
                        f"(at most {MAX_NAME_BYTES} bytes per path component); give a shorter one")


def special_kind(path: Any) -> str | None:
    """What a path that exists but is no regular file is ("a directory", "a FIFO", "a device",
    "a socket"), or None for a regular file or no file: so that a message names it as what it
    is (issue 32, U5: a FIFO given as --model was "not found")."""
    import os
    import stat

    try:
        mode = os.stat(os.fspath(path)).st_mode
    except (OSError, ValueError):
        return None
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None


def not_found(what: str, path: Any, hint: str) -> str:
    """The message for an input file that is missing, or is there as something else."""
    kind = special_kind(path)
    if kind is not None:
        return f"{what} {str(path)!r} is {kind}, not a regular file; {hint}"
    return f"{what} {str(path)!r} not found; {hint}"


def check_label(value: str, what: str) -> None:
    """Refuse (UserError) a name that holds a control character (a newline, a tab, ESC, a
    line or paragraph separator, ...) or is not text (an undecodable byte of a file name):
    names are printed in one-line answers and written into launch files, where such a
    character would end a line (``what`` names the input). Unicode categories Cc, Cs, Zl, Zp
    (Python's unicodedata)."""
    import unicodedata

    from planner.errors import UserError

    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp")), None)
    if bad is not None:
        shown = value if len(value) <= 60 else value[:57] + "..."
        raise UserError(f"{what} {shown!r} holds the control character {bad!r}; "
                        f"rename it without newlines or other control characters")


def read_input_file(path: Any, what: str, max_bytes: int) -> bytes:
    """The bytes of a user's input file, after checking that it is a regular file of at
    most ``max_bytes``: a device (/dev/zero), a FIFO or a directory is refused before it is
    opened, so nothing grows without end or blocks. ``what`` starts each error message."""
    import os
    import stat

    from planner.errors import UserError

    name = os.fspath(path)
    check_name(name, what)
    try:
        st = os.stat(name)
    except FileNotFoundError:
        raise UserError(f"{what}: no such file") from None
    except OSError as e:
        raise UserError(f"{what}: cannot read it ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{what} is a directory; give a file")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{what} is not a regular file (a device, FIFO or socket); give a file")
    if st.st_size > max_bytes:
        raise UserError(f"{what} is {st.st_size:,} bytes, more than the {max_bytes:,} such a file may hold")
    try:
        with open(name, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise UserError(f"{what}: cannot read it ({e.strerror or e})") from None
    if len(data) > max_bytes:       # it grew after the check
        raise UserError(f"{what} is more than the {max_bytes:,} bytes such a file may hold")
    return data


def decode_text(data: bytes, what: str, kind: str) -> str:
    """UTF-8 text of an input file, or UserError naming the file and the format expected."""
    from planner.errors import UserError

    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{what} is not UTF-8 text; expected {kind}") from None


def load_toml(text: str, what: str, schema_hint: str = "") -> dict[str, Any]:
    """A TOML document; every parse failure (bad syntax, an integer of more than 4,300
    digits, nesting that exhausts the parser) is a UserError naming ``what``; a syntax
    error's message ends with ``schema_hint`` (e.g. where the schema is described)."""
    import tomllib

    from planner.errors import UserError

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{what}: not valid TOML ({e}){schema_hint}") from None
    except ValueError as e:         # Python's 4,300-digit limit on int(str) (bench/fuzz.py found it: exit 1)
        raise UserError(f"{what}: not valid TOML ({parse_error_text(e)})") from None
    except RecursionError:
        raise UserError(f"{what}: not valid TOML (nested too deeply)") from None


def parse_toml(text: str, what: str, schema_hint: str = "") -> dict[str, Any]:
    """A TOML document (load_toml), checked by check_tree."""
    data = load_toml(text, what, schema_hint)
    check_tree(data, what)
    return data


def parse_json(text: str, what: str) -> Any:
    """A JSON document, checked by check_tree; parse failures are UserErrors."""
    import json

    from planner.errors import UserError

    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{what}: not valid JSON ({e})") from None
    except ValueError as e:         # Python's 4,300-digit limit on int(str)
        raise UserError(f"{what}: not valid JSON ({parse_error_text(e)})") from None
    except RecursionError:
        raise UserError(f"{what}: not valid JSON (nested too deeply)") from None
    check_tree(data, what)
    return data


def parse_error_text(e: BaseException) -> str:
    """A parser's error in one line for a user (Python's advice on its digit limit dropped)."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "integer string conversion" in text:
        return "a whole number of more than 4,300 digits"
    return text if len(text) <= 160 else text[:157] + "..."


def check_tree(data: Any, what: str) -> None:
    """Refuse (UserError) parsed data nested deeper than MAX_NESTING, or holding a whole
    number beyond MAX_ABS_INT (``1`` and 400 zeros: float() of it overflows) or a string
    longer than MAX_PATH_BYTES characters. Each container is visited once (a YAML alias
    refers to a shared one), so the walk is linear in the parsed size."""
    from planner.errors import UserError

    seen: set[int] = set()
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        v, where, depth = stack.pop()
        at = where or "the top level"
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            if not -MAX_ABS_INT <= v <= MAX_ABS_INT:
                raise UserError(f"{what}: {at} is a whole number of {len(str(abs(v))):,} digits, beyond "
                                f"{MAX_ABS_INT:,}; give a number in range")
            continue
        if isinstance(v, str):
            if len(v) > MAX_PATH_BYTES:
                raise UserError(f"{what}: {at} is a string of {len(v):,} characters; at most {MAX_PATH_BYTES:,}")
            continue
        if isinstance(v, (dict, list, tuple)):
            if depth >= MAX_NESTING:
                raise UserError(f"{what}: nested more than {MAX_NESTING} levels deep (at {at})")
            if id(v) in seen:
                continue
            seen.add(id(v))
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, child in items:
                key = str(k) if len(str(k)) <= 40 else str(k)[:37] + "..."
                stack.append((child, f"{where}.{key}" if where else key, depth + 1))
