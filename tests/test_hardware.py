"""The GPU catalog: it loads, names resolve, and figures match the vendor data sheets."""

from importlib import resources

import pytest

from planner.errors import UserError
from planner.hardware.gpus import GpuSpec, get_gpu, list_gpus, load_gpus, parse_gpus
from planner.units import GB, GiB, MiB

SHORT_NAMES = ["h100", "h100-pcie", "h200", "b200", "a100", "a100-40gb", "l40s", "a10g", "4090", "v100",
               "mi300x", "gb200", "h100-nvl", "h20", "gh200", "b300", "gb300", "mi325x", "mi355x", "5090",
               "rtx-pro-6000", "l4", "a6000", "rtx6000-ada"]
TFLOPS = 1e12


def test_catalog_loads_every_short_name():
    assert set(SHORT_NAMES) <= set(load_gpus())
    assert [g.name for g in list_gpus()] == list(load_gpus())
    assert load_gpus() is load_gpus()                       # cached
    assert all(isinstance(g, GpuSpec) for g in list_gpus())


@pytest.mark.parametrize("name", SHORT_NAMES)
def test_short_names_resolve_in_any_case(name):
    assert get_gpu(name).name == name
    assert get_gpu(name.upper()).name == name
    assert get_gpu(f"  {name} ").name == name


def test_every_alias_resolves_to_its_gpu():
    for gpu in list_gpus():
        for alias in gpu.aliases:
            assert get_gpu(alias) is gpu
            assert get_gpu(alias.swapcase()) is gpu


@pytest.mark.parametrize("typo, close", [("h10", "h100"), ("a100-80", "a100"), ("mi300", "mi300x")])
def test_unknown_name_lists_close_names(typo, close):
    with pytest.raises(UserError) as err:
        get_gpu(typo)
    message = str(err.value)
    assert "unknown GPU" in message and close in message and "`plan gpus`" in message


# Vendor figures, dense (no sparsity), for the GPUs and precisions tests/data/gpu_specs.json (the
# source table, checked in test_gpu_datasheets.py) does not give. Sources are in gpus.toml; the
# data-sheet line is repeated here.
@pytest.mark.parametrize("name, dtype, tflops", [
    ("h100", "fp32", 66.9),
    ("gb200", "bf16", 2500),        # GB200 NVL72: 360 PFLOPS BF16 sparse over 72 GPUs
    ("a100", "fp32", 19.5),
    ("a10g", "bf16", 125),          # A10 datasheet (proxy for A10G): BF16 125 / 250 sparse
    ("v100", "fp16", 125),          # V100 datasheet: 125 tensor TFLOPS (SXM2)
    ("v100", "fp32", 15.7),
    ("h100-nvl", "bf16", 1671 / 2),  # H100 datasheet, NVL: BF16 1,671 with sparsity
    ("h100-nvl", "fp8", 3341 / 2),
    ("h20", "bf16", 148),           # H20 (partners' briefs): FP16 148 dense
    ("gh200", "bf16", 989.4),       # GH200 datasheet: FP16/BF16 1,979 with sparsity (H100 whitepaper: 989.4 dense)
    ("b300", "bf16", 36000 / 8 / 2),  # HGX B300: FP16/BF16 36 PFLOPS sparse over 8 GPUs
    ("b300", "fp8", 72000 / 8 / 2),
    ("b300", "fp32", 600 / 8),      # HGX B300: FP32 600 TFLOPS over 8
    ("gb300", "bf16", 360000 / 72 / 2),  # GB300 NVL72: 360 PFLOPS BF16 sparse over 72
    ("mi325x", "bf16", 1307.4),     # AMD MI325X page: BF16 1307.4 dense
    ("mi355x", "fp8", 5000),        # AMD (ISSCC 2026): FP8 5 PFLOPS dense
    ("5090", "bf16", 209.5),        # RTX Blackwell whitepaper: 209.5 with FP32 accumulate
    ("rtx-pro-6000", "fp32", 125),  # RTX PRO 6000 datasheet: 125 TFLOPS FP32
    ("rtx-pro-6000", "fp8", 4000 / 2 / 2),  # 4,000 AI TOPS = FP4 with sparsity; FP8 dense a quarter
    ("l4", "bf16", 242 / 2),        # L4 datasheet: BF16 242 with sparsity
    ("l4", "fp8", 485 / 2),
    ("a6000", "bf16", 309.7 / 2),   # RTX A6000 datasheet: Tensor 309.7 with sparsity
    ("a6000", "fp32", 38.7),
    ("rtx6000-ada", "fp8", 1457 / 2),  # RTX 6000 Ada datasheet: 1,457 FP8 with sparsity
    ("rtx6000-ada", "fp32", 91.1),
])
def test_peak_flops_match_data_sheets(name, dtype, tflops):
    assert get_gpu(name).peak_flops_per_s(dtype) == pytest.approx(tflops * TFLOPS)


# (the GPUs of tests/data/gpu_specs.json: test_gpu_datasheets.py)
@pytest.mark.parametrize("name, hbm_tb_per_s", [
    ("h100-nvl", 3.9),              # H100 NVL: 3.9 TB/s
    ("h20", 4.0),
    ("gh200", 4.0),                 # GH200 HBM3 version: 4 TB/s
    ("b300", 8.0), ("gb300", 8.0),  # GB300 NVL72: 576 TB/s over 72
    ("mi325x", 6.0), ("mi355x", 8.0),
    ("5090", 1.792), ("rtx-pro-6000", 1.792),   # GDDR7 28 Gbps x 512 bit
    ("l4", 0.300), ("a6000", 0.768), ("rtx6000-ada", 0.960),
])
def test_memory_bandwidth_matches_data_sheets(name, hbm_tb_per_s):
    assert get_gpu(name).hbm_bytes_per_s == pytest.approx(hbm_tb_per_s * 1e12)


@pytest.mark.parametrize("name, memory_bytes", [
    ("h100", 81559 * MiB),          # nvidia-smi memory.total on H100 80GB HBM3
    ("h100-pcie", 81559 * MiB),
    ("h200", 143771 * MiB),         # nvidia-smi on H200 ("141 GB")
    ("b200", 183359 * MiB),         # nvidia-smi on B200 ("180 GB")
    ("a100", 81920 * MiB),          # nvidia-smi on A100-SXM4-80GB
    ("a100-40gb", 40960 * MiB),
    ("l40s", 46068 * MiB),
    ("a10g", 23028 * MiB),
    ("4090", 24564 * MiB),
    ("v100", 32 * GiB),             # vendor 32 GB HBM2
    ("mi300x", 192 * GiB),          # vendor 192 GB HBM3
    ("h100-nvl", 94 * GB),          # datasheet 94 GB, decimal (no nvidia-smi reading cited)
    ("b300", 288 * GB),
    ("mi325x", 256 * GiB), ("mi355x", 288 * GiB),
    ("5090", 32 * GiB), ("rtx-pro-6000", 96 * GiB), ("l4", 24 * GB), ("a6000", 48 * GiB),
])
def test_memory_capacity(name, memory_bytes):
    gpu = get_gpu(name)
    assert isinstance(gpu.memory_bytes, int)
    assert gpu.memory_bytes == memory_bytes


@pytest.mark.parametrize("name, nvlink_gb_per_s, nic_gbit_per_s", [
    ("h100", 900, 400),             # NVLink 4: 900 GB/s both directions; DGX H100: 400 Gb/s NIC per GPU
    ("h200", 900, 400),
    ("b200", 1800, 400),            # NVLink 5: 1.8 TB/s
    ("gb200", 1800, 400),
    ("a100", 600, 200),             # NVLink 3: 600 GB/s; DGX A100: 200 Gb/s HDR per GPU
    ("v100", 300, 50),              # NVLink 2: 300 GB/s; DGX-1: 4x 100 Gb/s per 8 GPUs
    ("mi300x", 896, 400),           # 7 Infinity Fabric links x 128 GB/s both directions
])
def test_link_bandwidths_are_per_direction(name, nvlink_gb_per_s, nic_gbit_per_s):
    gpu = get_gpu(name)
    assert gpu.intra_node_bytes_per_s == pytest.approx(nvlink_gb_per_s / 2 * GB)
    assert gpu.inter_node_bytes_per_s == pytest.approx(nic_gbit_per_s * GB / 8)


def test_pcie_only_gpus_report_pcie_links():
    assert get_gpu("l40s").intra_node_link == "pcie4"
    assert get_gpu("l40s").intra_node_bytes_per_s == 32 * GB    # Gen4 x16: 64 GB/s both directions
    assert get_gpu("4090").intra_node_link == "pcie4"


def test_missing_precisions_raise_a_clear_error():
    with pytest.raises(UserError, match="no bf16"):
        get_gpu("v100").peak_flops_per_s("bf16")
    with pytest.raises(UserError, match="no fp8"):
        get_gpu("a100").peak_flops_per_s("fp8")
    with pytest.raises(UserError, match="unknown dtype"):
        get_gpu("h100").peak_flops_per_s("int4")


def test_every_entry_has_sources_and_consistent_rates():
    for gpu in list_gpus():
        assert "http" in gpu.source or "whitepaper" in gpu.source, gpu.name
        assert gpu.fp16_flops_per_s > gpu.fp32_flops_per_s
        if gpu.fp8_flops_per_s is not None:   # fp8 doubles fp16 (L40S sheet: 733 vs 2 x 362.05, so 2%)
            assert gpu.fp8_flops_per_s == pytest.approx(2 * gpu.fp16_flops_per_s, rel=0.02)


def test_default_topologies_exist_and_use_this_gpu():
    from planner.hardware.topology import load_topology

    for gpu in list_gpus():
        if gpu.default_topology is not None:
            top = load_topology(gpu.default_topology)
            assert top.gpu == gpu.name
            assert top.gpus_per_node == gpu.gpus_per_node


ENTRY = """
[[gpu]]
name = "x"
full_name = "X"
aliases = []
memory_gib = 1
fp16_tflops = 1.0
fp32_tflops = 0.5
hbm_gb_per_s = 1
gpus_per_node = 1
intra_node_link = "pcie4"
intra_node_gb_per_s = 1
inter_node_gbit_per_s = 1
tdp_w = 1
source = "test"
"""


def test_parse_converts_units_once():
    gpu = parse_gpus(ENTRY)["x"]
    assert gpu.memory_bytes == GiB
    assert gpu.fp16_flops_per_s == 1e12
    assert gpu.inter_node_bytes_per_s == 1e9 / 8
    assert gpu.bf16_flops_per_s is None and gpu.default_topology is None


@pytest.mark.parametrize("text, message", [
    (ENTRY + "hbm_gbps = 3\n", "unknown keys"),
    (ENTRY.replace('tdp_w = 1\n', ''), "missing keys"),
    (ENTRY + "memory_gb = 2\n", "exactly one of"),
    (ENTRY + ENTRY, "defined twice"),
    (ENTRY + "[other]\nx = 1\n", "unknown top-level"),
])
def test_parse_rejects_bad_catalogs(text, message):
    with pytest.raises(UserError, match=message):
        parse_gpus(text)


# ------------------------------------------------------------ a user's own GPU (--gpus FILE)

MY_GPU = ENTRY.replace('name = "x"', 'name = "my-gpu"').replace('full_name = "X"', 'full_name = "My GPU"')


def test_gpu_file_loads_through_get_gpu(tmp_path):
    path = tmp_path / "my-gpu.toml"
    path.write_text(MY_GPU)
    gpu = get_gpu(str(path))
    assert gpu.name == "my-gpu" and gpu.memory_bytes == GiB and gpu.fp16_flops_per_s == 1e12


@pytest.mark.parametrize("content, message", [
    (MY_GPU + "hbm_gbps = 3\n", "unknown keys"),
    (MY_GPU.replace("tdp_w = 1\n", 'tdp_w = "lots"\n'), "tdp_w must be a number"),
    (MY_GPU.replace("gpus_per_node = 1", "gpus_per_node = 1.5"), "gpus_per_node must be an integer"),
    (MY_GPU.replace("hbm_gb_per_s = 1", "hbm_gb_per_s = -3"), "hbm_gb_per_s must be a number from"),
    (MY_GPU.replace("aliases = []", "aliases = [1]"), "aliases must be a list of strings"),
    (MY_GPU + MY_GPU.replace('"my-gpu"', '"other"'), "exactly one"),
    ("[[gpu]\nname=", "not valid TOML"),
    ("", "exactly one"),
])
def test_gpu_file_errors_are_one_line(tmp_path, content, message):
    path = tmp_path / "bad.toml"
    path.write_text(content)
    with pytest.raises(UserError, match=message) as err:
        get_gpu(str(path))
    assert "\n" not in str(err.value) and "bad.toml" in str(err.value)


def test_gpu_file_missing_big_or_binary(tmp_path):
    with pytest.raises(UserError, match="not found"):
        get_gpu(str(tmp_path / "absent.toml"))
    with pytest.raises(UserError, match="is a directory, not a regular file"):     # named as what it is
        (tmp_path / "dir.toml").mkdir()
        get_gpu(str(tmp_path / "dir.toml"))
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (16 * 2**20))
    with pytest.raises(UserError, match="more than the 16,777,216"):
        get_gpu(str(big))
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match="not UTF-8"):
        get_gpu(str(binary))


def test_cli_plans_on_a_gpu_file(tmp_path):
    from click.testing import CliRunner

    from planner.cli.main import cli

    path = tmp_path / "my-h100.toml"
    # the shipped H100 entry under another name: the same plan as --gpus h100
    text = resources.files("planner").joinpath("presets", "gpus.toml").read_text()
    start = text.index("[[gpu]]\nname = \"h100\"")
    entry = text[start:text.index("[[gpu]]", start + 7)]
    path.write_text(entry.replace('name = "h100"', 'name = "my-h100"').replace('default_topology = "dgx-h100"\n', ""))
    runner = CliRunner()
    mine = runner.invoke(cli, ["--model", "8b", "--gpus", str(path), "--n-gpus", "8", "--quiet"])
    assert mine.exit_code == 0, mine.output
    bad = runner.invoke(cli, ["--model", "8b", "--gpus", str(tmp_path / "none.toml")])
    assert bad.exit_code == 2 and "not found" in bad.output and "Traceback" not in bad.output
