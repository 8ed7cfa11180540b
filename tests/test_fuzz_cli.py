"""Fuzzing the command line: random and malformed arguments, config.json and topology
files (missing keys, wrong types, negative, zero and huge numbers, 1e15 parameters,
unicode, empty files, binary data).

Whatever the input, `plan` exits with status 0 or 2 and a message, never a traceback,
and never leaves a half-written file in --out. Most cases run in-process (click's
CliRunner); a few run `python -m planner` to see what a user's terminal shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli.main import cli
from planner.limits import (
    CONFIG_BOOL_KEYS,
    CONFIG_INT_KEYS,
    CONFIG_PROBABILITY_KEYS,
)
from planner.models.spec import preset_config

# PLANNER_HYPOTHESIS_EXAMPLES=1000 for a long hunt with fresh random examples
EXAMPLES = int(os.environ.get("PLANNER_HYPOTHESIS_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="PLANNER_HYPOTHESIS_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOPOLOGIES = Path(__file__).resolve().parents[1] / "planner" / "presets" / "topologies"
# small models keep each search short; one of each config.json family the loader reads
BASE_CONFIGS = ["gpt2", "qwen2.5-0.5b", "bert-base", "mixtral-8x7b", "falcon-40b", "bloom-176b",
                "gemma2-9b", "llama3.1-8b"]


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, prog_name="plan", catch_exceptions=True)


def assert_clean(r: Result, args: list[str]) -> None:
    """Exit 0, or 2 with a message; no exception escaped, no traceback printed."""
    where = f"plan {' '.join(args)}\n{r.output}"
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"exception escaped: {r.exception!r}\n{where}") from r.exception
    assert r.exit_code in (0, 2), where
    assert "Traceback" not in r.output and "internal error" not in r.output, where
    if r.exit_code == 2:
        assert r.output.strip(), where
        # the README's contract: a user error is one line on stderr (issue 20); a plan that
        # does not fit prints its report on stdout and, at most, that line
        err = r.stderr.strip()
        assert len(err.splitlines()) <= 1 and (not err or err.startswith("error: ")), where
        assert err or r.stdout.strip(), where


def assert_out_dir_whole(out: Path, r: Result) -> None:
    """--out holds every file of a plan, complete, or nothing at all; never a temporary."""
    if not out.exists():
        return
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if n.startswith(".") or n.endswith(".tmp")], names
    if r.exit_code != 0:
        assert names == [], (names, r.output)
    elif names:
        assert "plan.json" in names and "launch.sh" in names, names
        json.loads((out / "plan.json").read_text())


# ---------------------------------------------------------------------------- values

WEIRD_JSON = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 2, 3, 7, 10**15, 1e15, 2**63, -2**63, 10**30, 0.5, 1.5,
                     float("inf"), float("-inf"), float("nan"), 1e308, "", "x", "ℵ", "4096", [], {}, [1, 2]]),
    st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    # hostile values (issue 20): beyond float's range, beyond int64, long text, deep nesting
    st.sampled_from([10**400, -10**400, 2**64, "x" * 5000,
                     [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
                     1e-300, 5e-324]),
)
CONFIG_KEYS = sorted({*CONFIG_INT_KEYS, *CONFIG_BOOL_KEYS, *CONFIG_PROBABILITY_KEYS, "model_type",
                      "hidden_act", "activation_function"})


@st.composite
def mutated_configs(draw) -> dict:
    cfg = dict(preset_config(draw(st.sampled_from(BASE_CONFIGS))))
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["set", "set", "set", "delete"]))
        key = draw(st.sampled_from(sorted(set(cfg) | set(CONFIG_KEYS))))
        if action == "delete":
            cfg.pop(key, None)
        else:
            cfg[key] = draw(WEIRD_JSON)
    return cfg


def write(directory: Path, name: str, data: bytes | str) -> Path:
    p = directory / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return p


# ------------------------------------------------------------------------ config.json

@pytest.mark.slow
@FUZZ
@given(cfg=mutated_configs(), gpu=st.sampled_from(["h100", "a100", "4090", "mi300x"]), as_json=st.booleans())
def test_fuzzed_config_json_never_crashes(cfg, gpu, as_json):
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), "config.json", json.dumps(cfg))      # json.dumps writes NaN, Infinity
        args = ["--model", str(path), "--gpus", gpu, "--max-gpus", "64"] + (["--json"] if as_json else [])
        assert_clean(invoke(args), args)


@pytest.mark.parametrize("content, needle", [
    (b"", "not valid JSON"),
    (b"\x00\xff\xfe\x89PNG\r\n", "not valid JSON"),
    ("ℵ ∞ 🚀".encode(), "not valid JSON"),
    (b"[1, 2, 3]", "expected a JSON object"),
    (b'"llama"', "expected a JSON object"),
    (b"{", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    (b'{"model_type": "gpt5"}', "unsupported model_type"),
    (b'{"model_type": ["llama"]}', "unsupported model_type"),
    (b'{"model_type": "llama"}', "missing key"),
])
def test_malformed_config_files(tmp_path, content, needle):
    path = write(tmp_path, "config.json", content)
    args = ["--model", str(path), "--gpus", "h100"]
    r = invoke(args)
    assert_clean(r, args)
    assert r.exit_code == 2 and needle in r.output and str(path) in r.output


def llama(**over) -> dict:
    return {**preset_config("llama3.1-8b"), **over}


@pytest.mark.parametrize("over, needle", [
    ({"hidden_size": 0}, "'hidden_size' must be an integer >= 1"),
    ({"hidden_size": -4096}, "'hidden_size' must be an integer from 0"),
    ({"hidden_size": 4096.0}, "'hidden_size' must be an integer"),
    ({"hidden_size": "4096"}, "'hidden_size' must be an integer"),
    ({"hidden_size": True}, "'hidden_size' must be an integer"),
    ({"num_hidden_layers": 10**15}, "'num_hidden_layers' must be an integer from 0 to 10,000,000"),
    ({"num_key_value_heads": 0.5}, "'num_key_value_heads' must be an integer"),
    ({"num_key_value_heads": -8}, "'num_key_value_heads' must be an integer"),
    ({"num_key_value_heads": 5}, "must be a multiple of num_key_value_heads"),
    ({"num_attention_heads": 2**63}, "'num_attention_heads' must be an integer"),
    ({"num_attention_heads": 8192, "num_key_value_heads": 8}, "head_dim = 0 must be at least 1"),
    ({"head_dim": 0, "num_attention_heads": 8192, "num_key_value_heads": 8}, "'head_dim' must be an integer >= 1"),
    ({"max_position_embeddings": float("nan")}, "'max_position_embeddings' must be an integer"),
    ({"tie_word_embeddings": "false"}, "'tie_word_embeddings' must be true or false"),
    ({"attention_dropout": 7}, "'attention_dropout' must be a probability"),
    ({"attention_dropout": float("nan")}, "'attention_dropout' must be a probability"),
    ({"hidden_act": ["silu"]}, "'hidden_act' must be a string"),
    # 1e15 parameters and beyond: refused by the parameter limit
    ({"hidden_size": 2_000_000, "intermediate_size": 8_000_000, "num_attention_heads": 16_000,
      "num_key_value_heads": 16_000, "num_hidden_layers": 10_000}, "beyond the planner's limit of 1e+15"),
])
def test_config_values_of_wrong_type_or_range(tmp_path, over, needle):
    path = write(tmp_path, "config.json", json.dumps(llama(**over)))
    args = ["--model", str(path), "--gpus", "h100"]
    r = invoke(args)
    assert_clean(r, args)
    assert r.exit_code == 2 and needle in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


@pytest.mark.slow
@pytest.mark.parametrize("value", [None, "delete"])
def test_every_preset_key_set_to_null_or_deleted(tmp_path, value):
    # null means "the default" (as a missing key does); a missing required key is a UserError
    from planner.errors import UserError
    from planner.models.families import SUPPORTED_MODEL_TYPES
    from planner.models.spec import load_config_file, load_presets

    path = tmp_path / "config.json"
    for name in load_presets():
        base = preset_config(name)
        if base["model_type"] not in SUPPORTED_MODEL_TYPES:
            # a generic-path preset: every changed config is a new model, measured on transformers'
            # own code (minutes each); its translator is transformers' config class
            continue
        for key in base:
            cfg = {k: v for k, v in base.items() if not (k == key and value == "delete")}
            if value is None:
                cfg[key] = None
            path.write_text(json.dumps(cfg))
            try:
                load_config_file(path)
            except UserError:
                pass


def test_mixtral_with_infinite_experts(tmp_path):
    cfg = {**preset_config("mixtral-8x7b"), "num_local_experts": 1e300}
    path = write(tmp_path, "config.json", json.dumps(cfg))
    r = invoke(["--model", str(path), "--gpus", "h100"])
    assert r.exit_code == 2 and "'num_local_experts' must be an integer" in r.output


@pytest.mark.slow
def test_a_model_near_1e15_parameters_answers_quickly(tmp_path):
    # ~9.6e14 parameters: accepted, and no GPU count up to 16,384 holds its states
    cfg = llama(hidden_size=1_000_000, intermediate_size=4_000_000, num_attention_heads=8000,
                num_key_value_heads=8000, num_hidden_layers=60)
    path = write(tmp_path, "config.json", json.dumps(cfg))
    args = ["--model", str(path), "--gpus", "h100"]
    r = invoke(args)
    assert_clean(r, args)
    assert r.exit_code == 2 and "fit" in r.output


def test_config_file_too_large(tmp_path):
    path = tmp_path / "config.json"
    with path.open("wb") as f:
        f.truncate(17 * 2**20)
    r = invoke(["--model", str(path), "--gpus", "h100"])
    assert r.exit_code == 2 and "too large for a config.json" in r.output


# ---------------------------------------------------------------------------- topology

WEIRD_TOML = st.sampled_from(["0", "-1", "1e15", "inf", "nan", "-inf", '"x"', '""', '"ℵ"', "[]", "{}", "true",
                              "false", "1.5", "99999999999999999", "[1, 2]", "{ a = 1 }", "1e308", "0.0",
                              "2", "8", "72", "10000000"])


@st.composite
def mutated_topologies(draw) -> tuple[str, str]:
    path = draw(st.sampled_from(sorted(TOPOLOGIES.glob("*.toml"))))
    text = path.read_text(encoding="utf-8")
    gpu = next(line.split('"')[1] for line in text.splitlines() if line.startswith("gpu ="))
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        keyed = [i for i, line in enumerate(lines) if "=" in line and not line.lstrip().startswith("#")]
        i = draw(st.sampled_from(keyed))
        key = lines[i].split("=")[0].strip()
        action = draw(st.sampled_from(["set", "set", "set", "drop", "unknown key"]))
        if action == "set":
            lines[i] = f"{key} = {draw(WEIRD_TOML)}"
        elif action == "drop":
            lines[i] = ""
        else:
            lines[i] += f"\n{draw(st.sampled_from(['bogus', 'ℵ', 'gpus']))}_extra = 1"
    return "\n".join(lines), gpu


@pytest.mark.slow
@FUZZ
@given(case=mutated_topologies())
def test_fuzzed_topology_files_never_crash(case):
    text, gpu = case
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), "cluster.toml", text)
        args = ["--model", "qwen2.5-0.5b", "--gpus", gpu, "--topology", str(path), "--max-gpus", "64"]
        assert_clean(invoke(args), args)


@pytest.mark.parametrize("content, needle", [
    (b"", "missing keys"),
    (b"\x00\xff\xfe binary", "not UTF-8"),
    ("ℵ = 1".encode(), "not valid TOML"),
    (b"bogus = 1", "unknown keys"),
    (b"[[[", "not valid TOML"),
    (b"name = ", "not valid TOML"),
    (b"intra_node = 5", "missing keys"),
])
def test_malformed_topology_files(tmp_path, content, needle):
    path = write(tmp_path, "cluster.toml", content)
    args = ["--model", "8b", "--gpus", "h100", "--topology", str(path)]
    r = invoke(args)
    assert_clean(r, args)
    assert r.exit_code == 2 and needle in r.output, r.output


def dgx(**over: str) -> str:
    lines = (TOPOLOGIES / "dgx-h100.toml").read_text().splitlines()
    for key, value in over.items():
        lines = [f"{key} = {value}" if line.split("=")[0].strip() == key else line for line in lines]
    return "\n".join(lines)


@pytest.mark.parametrize("over, needle", [
    ({"gpus_per_node": "0"}, "gpus_per_node must be an integer from 1 to 256"),
    ({"gpus_per_node": "[1, 2]"}, "gpus_per_node must be an integer"),
    ({"max_nodes": "nan"}, "max_nodes must be an integer"),
    ({"switches": "0"}, "switches >= 1"),
    ({"switches": '"x"'}, "switches must be an integer"),
    ({"gpu_link_gb_per_s": "1e308"}, "gpu_link_gb_per_s must be a number"),
    ({"gpu_link_gb_per_s": "-450"}, "gpu_link_gb_per_s must be a number"),
    ({"nic_gbit_per_s": "{ a = 1 }"}, "nic_gbit_per_s must be a number"),
    ({"nodes_per_leaf": "false"}, "nodes_per_leaf must be an integer"),
    ({"rail_optimized": "0"}, "rail_optimized must be true or false"),
    ({"latency_us": "true"}, "latency_us must be a number"),
    ({"source": "true"}, "source must be a string"),
    ({"gpu": "[]"}, "gpu must be a string"),
    ({"memory_gib": "0"}, "memory_gib must be a number"),
])
def test_topology_values_of_wrong_type_or_range(tmp_path, over, needle):
    path = write(tmp_path, "cluster.toml", dgx(**over))
    args = ["--model", "8b", "--gpus", "h100", "--topology", str(path)]
    r = invoke(args)
    assert_clean(r, args)
    assert r.exit_code == 2 and needle in r.output, r.output


# ---------------------------------------------------------------------------- arguments

NUMBERS = ["0", "-1", "1", "2", "3", "8", "64", "1e15", "99999999999999999999", "x", "", "ℵ", "1.5", "nan",
           "inf", "-inf", "65536", "4194304", "131072"]
OPTIONS: dict[str, list[str] | None] = {
    "--n-gpus": NUMBERS, "--max-gpus": NUMBERS, "--dp": NUMBERS, "--tp": NUMBERS, "--pp": NUMBERS,
    "--cp": NUMBERS, "--ep": NUMBERS, "--zero": NUMBERS, "--fsdp": ["full", "grad-op", "hybrid", "x"],
    "--vp": NUMBERS, "--sp": None, "--no-sp": None, "--micro-batch": NUMBERS, "--seq-len": NUMBERS,
    "--global-batch": NUMBERS, "--grad-accum": NUMBERS, "--recompute": ["none", "selective", "full", "x"],
    "--precision": ["bf16-mixed", "fp16-mixed", "fp32", "bf16", "fp8"],
    "--optimizer": ["adamw", "sgd", "adafactor", "adam8bit"], "--attention": ["flash", "eager"],
    "--kernels": ["auto", "eager", "fused"], "--fragmentation": ["0", "0.5", "1", "-1", "nan", "inf"],
    "--usable-memory": ["0.05", "0.5", "1", "0", "nan", "-inf"], "--json": None,
    "--method": ["full", "lora", "qlora", "freeze", "auto", "x"], "--lora-rank": NUMBERS,
    "--lora-alpha": NUMBERS, "--lora-targets": ["attention", "mlp", "all-linear", "q_proj,v_proj", ",", "ℵ"],
    "--lora-dropout": ["0", "0.1", "1", "nan"], "--quant": ["int8", "int4", "nf4", "x"],
    "--trainable-layers": NUMBERS, "--task": ["train", "load", "x"], "--mla-cache": ["latent", "per-head", "x"],
    "--topology": ["dgx-h100", "dgx-a100", "gb200-nvl72", "x", "/nonexistent.toml", "/dev/null", "ℵ"],
    "--tokens": ["2e12", "300B", "15T", "0", "-1", "x", "1e30", "nan", "inf", "", "1e17"],
    "--offload-optimizer": ["none", "cpu", "nvme"], "--offload-params": ["none", "cpu", "nvme"],
    "--deadline": ["30d", "12h", "0d", "-1d", "2030-01-01", "1900-01-01", "x", "1e300d", "nan"],
    "--budget": ["1M", "20000", "0", "-5", "1e30", "x", "nan", "$5k"],
    "--objective": ["cost", "time", "x"], "--solver": ["auto", "highs", "cbc", "x"],
    "--prices": ["/nonexistent.toml", "/dev/null"],
    "--force": None, "--bogus-option": None,
    "--pp-layout": ["Et*16|t*16L", "Et*4|(t*4|)*14tmL", "E(t|)*3L", "E|L", "(", "Et*99999999L", "t;rm", "",
                    "E((t|)*2)*2L", "L" * 3000],
}
MODELS = ["8b", "70b", "405b", "mixtral-8x7b", "gpt2", "bert-base", "falcon-40b", "gemma2-9b", "qwen2.5-0.5b",
          "x", "ℵ", "/dev/null", "/nonexistent/config.json", "", "-1", "x" * 300, "/dev/zero", "a/" + "b" * 300]
GPUS = ["h100", "a100", "4090", "mi300x", "v100", "a10g", "l40s", "b200", "x", "", "h100,a100", "ℵ", "g" * 300]


@st.composite
def argument_lists(draw) -> list[str]:
    args = []
    if draw(st.integers(0, 9)):
        args += ["--model", draw(st.sampled_from(MODELS))]
    if draw(st.integers(0, 9)):
        args += ["--gpus", draw(st.sampled_from(GPUS))]
    for opt in draw(st.lists(st.sampled_from(sorted(OPTIONS)), max_size=5, unique=True)):
        values = OPTIONS[opt]
        args.append(opt)
        if values is not None:
            args.append(draw(st.one_of(st.sampled_from(values), st.text(max_size=4))) if draw(st.integers(0, 9))
                        else draw(st.sampled_from(values)))
    return args


@pytest.mark.slow
@settings(FUZZ, max_examples=EXAMPLES * 3 // 2)
@given(args=argument_lists(), with_out=st.booleans())
def test_fuzzed_arguments_never_crash(args, with_out):
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out"
        if with_out:
            args = [*args, "--out", str(out)]
        r = invoke(args)
        assert_clean(r, args)
        assert_out_dir_whole(out, r)


@pytest.mark.parametrize("args", [
    ["--model", "8b", "--gpus", "h100", "--usable-memory", "nan"],
    ["--model", "8b", "--gpus", "h100", "--fragmentation", "nan"],
    ["--model", "8b", "--gpus", "h100", "--method", "lora", "--lora-dropout", "nan"],
    ["--model", "8b", "--gpus", "h100", "--n-gpus", str(10**30)],
    ["--model", "8b", "--gpus", "h100", "--seq-len", "0"],
    ["--model", "8b", "--gpus", "h100", "--tokens", "nan"],
])
def test_non_numbers_are_usage_errors(args):
    r = invoke(args)
    assert_clean(r, args)
    assert r.exit_code == 2 and "Invalid value" in r.output


def test_out_is_a_file_writes_nothing(tmp_path):
    target = tmp_path / "out"
    target.write_text("keep me")
    args = ["--model", "gpt2", "--gpus", "h100", "--out", str(target)]
    r = invoke(args)
    assert_clean(r, args)
    assert r.exit_code == 2 and target.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_out_when_nothing_fits_writes_nothing(tmp_path):
    out = tmp_path / "out"
    args = ["--model", "8b", "--gpus", "4090", "--n-gpus", "1", "--out", str(out)]
    r = invoke(args)
    assert_clean(r, args)
    assert r.exit_code == 2 and not out.exists()


def test_an_internal_error_exits_1_with_one_line(monkeypatch):
    from planner import api

    def broken(*a, **k):
        raise ZeroDivisionError("division by zero")
    monkeypatch.setattr(api, "plan", broken)
    r = invoke(["--model", "8b", "--gpus", "h100"])
    assert r.exit_code == 1
    assert r.output.startswith("internal error: ZeroDivisionError") and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


# --------------------------------------------------------------------------- jobs files

JOBS = """start: 2026-01-05
horizon: 365d
gpus: [h100]
jobs:
  - name: a
    model: gpt2
    tokens: 1B
    deadline: 30d
  - name: b
    model: qwen2.5-0.5b
    tokens: 2B
    start: 10d
    deadline: 2026-03-01
    seq_len: 2048
    global_batch: 256
"""
WEIRD_YAML = st.sampled_from(["0", "-1", "1e15", ".inf", ".nan", "x", "''", "ℵ", "[]", "{}", "true", "null", "1.5",
                              "99999999999999999999", "[1, 2]", "{a: 1}", "0d", "-5d", "1e300d", "2026-13-45",
                              "1900-01-01", "9999-12-31", "1e15T", "0B", "4194304", "\"\\x00\""])


@st.composite
def mutated_jobs(draw) -> str:
    lines = JOBS.splitlines()
    for _ in range(draw(st.integers(1, 2))):
        keyed = [i for i, line in enumerate(lines) if ":" in line]
        i = draw(st.sampled_from(keyed))
        key = lines[i].split(":")[0]
        action = draw(st.sampled_from(["set", "set", "set", "drop", "unknown key"]))
        if action == "set":
            lines[i] = f"{key}: {draw(WEIRD_YAML)}"
        elif action == "drop":
            lines[i] = ""
        else:
            lines[i] += "\n" + key.replace(key.strip(), "bogus") + ": 1"
    return "\n".join(lines)


@pytest.mark.slow
@settings(FUZZ, max_examples=max(10, EXAMPLES // 2))
@given(text=mutated_jobs(), as_json=st.booleans())
def test_fuzzed_jobs_files_never_crash(text, as_json):
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), "jobs.yaml", text)
        args = ["buy", str(path), "--max-gpus", "16"] + (["--json"] if as_json else [])
        assert_clean(invoke(args), args)


@pytest.mark.parametrize("name, content", [
    ("jobs.yaml", b""), ("jobs.yaml", b"\x00\xff\xfe"), ("jobs.yaml", "ℵ: [".encode()),
    ("jobs.json", b"[1, 2]"), ("jobs.toml", b"jobs = 5"), ("jobs.yaml", b"jobs: []"),
    ("jobs.yaml", b"jobs:\n  - 5"), ("jobs.yaml", b"jobs:\n  - {name: a, model: gpt2, tokens: 1e30, deadline: 1d}"),
])
def test_malformed_jobs_files(tmp_path, name, content):
    path = write(tmp_path, name, content)
    args = ["buy", str(path)]
    r = invoke(args)
    assert_clean(r, args)
    assert r.exit_code == 2 and "jobs file" in r.output


# ------------------------------------------------------------------------- prices files

PRICES = """electricity_usd_per_kwh = 0.12
pue = 1.3
[[gpu]]
name = "h100"
rent_usd_per_gpu_hour = 2.99
rent_source = "our contract"
node_purchase_usd = 300000
node_power_kw = 10.2
"""


@st.composite
def mutated_prices(draw) -> str:
    lines = PRICES.splitlines()
    for _ in range(draw(st.integers(1, 2))):
        i = draw(st.sampled_from([i for i, line in enumerate(lines) if "=" in line]))
        key = lines[i].split("=")[0].strip()
        action = draw(st.sampled_from(["set", "set", "set", "drop", "unknown key"]))
        if action == "set":
            lines[i] = f"{key} = {draw(WEIRD_TOML)}"
        elif action == "drop":
            lines[i] = ""
        else:
            lines[i] += "\nbogus = 1"
    return "\n".join(lines)


@settings(FUZZ, max_examples=max(10, EXAMPLES // 2))
@given(text=mutated_prices(), plan=st.booleans())
def test_fuzzed_prices_files_never_crash(text, plan):
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), "prices.toml", text)
        args = (["--model", "gpt2", "--gpus", "h100", "--tokens", "1B", "--max-gpus", "8"] if plan else ["gpus"])
        args += ["--prices", str(path)]
        assert_clean(invoke(args), args)


def test_an_absurd_price_is_refused_before_the_solver(tmp_path):
    # 1e17 $/GPU-hour made HiGHS fail inside PuLP (IndexError): refused as input now
    path = write(tmp_path, "prices.toml", PRICES.replace("2.99", "99999999999999999"))
    args = ["--model", "gpt2", "--gpus", "h100", "--tokens", "1B", "--max-gpus", "8", "--prices", str(path)]
    r = invoke(args)
    assert_clean(r, args)
    assert r.exit_code == 2 and "rent_usd_per_gpu_hour must be a number >= 0 and at most 10000" in r.output


# ------------------------------------------------------------- what a terminal shows

@pytest.mark.slow
@pytest.mark.parametrize("setup", ["binary-config", "bad-topology", "nan-option", "huge-model"])
def test_no_traceback_reaches_the_terminal(tmp_path, setup):
    cfg = tmp_path / "config.json"
    top = tmp_path / "t.toml"
    args = {
        "binary-config": ["--model", str(cfg), "--gpus", "h100"],
        "bad-topology": ["--model", "8b", "--gpus", "h100", "--topology", str(top)],
        "nan-option": ["--model", "8b", "--gpus", "h100", "--usable-memory", "nan"],
        "huge-model": ["--model", str(cfg), "--gpus", "h100"],
    }[setup]
    cfg.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" if setup == "binary-config" else
                    json.dumps(llama(num_hidden_layers=10**15)).encode())
    top.write_text(dgx(gpus_per_node="[1, 2]"))
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    p = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, env=env,
                       timeout=60, check=False)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr + p.stdout and p.stderr.strip()


@pytest.mark.slow
@pytest.mark.parametrize("args", [["models"], ["--model", "gpt2", "--gpus", "h100", "--json"], ["--help"]])
def test_a_reader_that_goes_away_is_not_an_error(args):
    # `plan ... | head -1`: the pipe closes before plan writes; it stops quietly, status 0
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        p = subprocess.run([sys.executable, "-m", "planner", *args], stdout=write_end, stderr=subprocess.PIPE,
                           timeout=60, check=False)
    finally:
        os.close(write_end)
    assert p.returncode == 0, p.stderr
    assert b"Traceback" not in p.stderr and b"BrokenPipe" not in p.stderr, p.stderr
