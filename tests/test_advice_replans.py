"""Every way out planner/report/advice.py offers for a plan that does not fit is planned
again through the CLI, as a user would type it, and must fit (issue 20: LoRA of 8B at
sequence 4,096 on one 4090 was offered "2 x 4090" and an MI300X but not --method qlora or
--seq-len 2048; 405B on one GPU was offered offload and QLoRA, which do not fit on it)."""

import json
import re

import pytest
from click.testing import CliRunner

from planner.cli.main import cli


def run(args):
    return CliRunner().invoke(cli, list(args))


def advice(args):
    r = run([*args, "--json"])
    assert r.exit_code == 2, r.output
    return json.loads(r.stdout)["advice"]


def without(args, *names):
    """``args`` less the options ``names`` and their values."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in names:
            skip = True
        else:
            out.append(a)
    return out


def replans(args, lines):
    """The command lines the advice suggests, one per way out."""
    out = []
    for line in lines:
        if "more than topology" in line:
            continue             # no count flag reaches it (test_a_count_the_topology_caps_is_named_as_such)
        if m := re.match(r"It fits from (\d+) x ", line):
            out.append([*without(args, "--n-gpus", "--max-gpus"), "--max-gpus", m[1]])
        elif m := re.match(r"A GPU with enough memory for that layout on (\d+) GPUs?: (.*)\.$", line):
            for name in re.findall(r"([\w.-]+) \([\d,.]+ GiB\)", m[2]):
                out.append([*without(args, "--gpus", "--n-gpus", "--max-gpus"), "--gpus", name, "--n-gpus", m[1]])
        elif line.startswith("Re-planned with one change each: "):
            # a way's note in parentheses may hold "; " itself (--pp-microbatch-group's)
            for way in re.split(r"; (?![^()]*\))", line.removeprefix("Re-planned with one change each: ").rstrip(".")):
                change, n = re.match(r"(.*) fits on (\d+) x ", way).groups()
                flags = change.split()
                names = [f for f in flags if f.startswith("--")]
                out.append([*without(args, *names, "--n-gpus", "--max-gpus"), *flags, "--n-gpus", n])
    return out


CASES = {
    "lora-8b-4090": ["--model", "8b", "--gpus", "4090", "--method", "lora", "--seq-len", "4096", "--n-gpus", "1"],
    "405b-one-h100": ["--model", "405b", "--gpus", "h100", "--max-gpus", "1"],
    "70b-8-a100": ["--model", "70b", "--gpus", "a100", "--n-gpus", "8"],
    "qlora-70b-4090": ["--model", "70b", "--gpus", "4090", "--method", "qlora"],
    "8b-1m-tokens": ["--model", "8b", "--gpus", "h100", "--n-gpus", "8", "--seq-len", "1048576",
                     "--global-batch", "8"],
    "nvfp4-lora-8b-rtx-pro-6000": ["--model", "llama3.1-8b", "--gpus", "rtx-pro-6000", "--precision", "nvfp4",
                                   "--method", "lora", "--n-gpus", "1", "--micro-batch", "8", "--recompute", "none"],
    # Llama 3 405B as its paper ran it on 8,192 H100s (arXiv:2407.21783, Sec. 3.3.2; issue 29)
    "405b-llama3-paper": ["--model", "llama3.1-405b", "--gpus", "h100", "--n-gpus", "8192", "--tp", "8", "--pp", "16",
                          "--dp", "64", "--vp", "8", "--pp-balance", "embedding-loss", "--fsdp", "grad-op",
                          "--fsdp-pipeline-grad-sync", "micro-batch", "--seq-len", "8192", "--micro-batch", "1",
                          "--global-batch", "2048", "--recompute", "none"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_way_out_the_advice_offers_fits(name):
    args = CASES[name]
    lines = advice(args)
    commands = replans(args, lines)
    assert commands, lines
    for cmd in commands:
        r = run([*cmd, "--quiet"])
        assert r.exit_code == 0 and "/" in r.stdout, (cmd, r.output)


def test_the_cheap_ways_out_are_offered_and_the_ones_that_do_not_fit_are_not():
    text = " ".join(advice(CASES["lora-8b-4090"]))
    assert "--method qlora fits on 1 x 4090" in text and "--seq-len 2048 fits on 1 x 4090" in text
    text = " ".join(advice(CASES["405b-one-h100"]))
    # 405B's 16-bit weights alone (756 GiB) and its 4-bit base (189 GiB) overflow one H100;
    # dgx-h100 gives a node 2 TiB of CPU memory, less than the 6 TB of states to offload
    assert "It fits from 96 x h100" in text
    assert "--method qlora" not in text and "--offload" not in text and "A GPU with" not in text


def test_a_bigger_gpu_is_offered_only_where_the_precision_runs():
    """An NVFP4 LoRA plan that overflows an RTX PRO 6000 was offered mi325x (256 GiB), which the
    CLI refuses at --precision nvfp4 (no FP4 tensor cores): the advice checked bf16 and fp8
    support only. One rule now answers both (training.checks.precision_refusal)."""
    args = CASES["nvfp4-lora-8b-rtx-pro-6000"]
    line = next(x for x in advice(args) if x.startswith("A GPU with enough memory"))
    assert "mi325x" not in line and "b300" in line, line
    refused = run([*without(args, "--gpus"), "--gpus", "mi325x", "--quiet"])
    assert refused.exit_code == 2 and "no FP4 tensor cores" in refused.output, refused.output


def test_no_way_out_is_one_the_set_up_rules_refuse():
    """A full NVFP4 plan was offered '--method qlora fits', which the CLI refuses (training.checks
    SETUP_RULES 'low-precision-methods': a 4-bit base under --precision nvfp4); refit now asks
    the set-up rules first."""
    args = ["--model", "llama3.1-8b", "--gpus", "rtx-pro-6000", "--precision", "nvfp4", "--n-gpus", "1",
            "--micro-batch", "2", "--recompute", "none"]
    text = " ".join(advice(args))
    assert "--method lora fits" in text and "--method qlora" not in text, text
    refused = run([*args, "--method", "qlora", "--quiet"])
    assert refused.exit_code == 2 and "--precision nvfp4 is modelled for full training and LoRA" in refused.output


@pytest.mark.slow   # 2 s; the fast tier keeps test_cost's topology cap
def test_a_count_the_topology_caps_is_named_as_such():
    """QLoRA of 70B on 4090s fits from 16 GPUs, but the 4090's default topology is one 4-GPU
    workstation: --max-gpus 16 gave the same answer and the same advice (issue 33). The advice
    names the cap and the topology file instead; --max-gpus would not have changed the answer."""
    args = CASES["qlora-70b-4090"]
    text = " ".join(advice(args))
    assert "raise --max-gpus" not in text
    assert "more than topology rtx4090-4x-workstation describes (4 GPUs)" in text and "--topology PATH" in text
    same = run([*args, "--max-gpus", "16", "--quiet"])
    assert "no layout fits on 1 to 4 x 4090" in same.stdout, same.output


@pytest.mark.slow
def test_method_auto_reports_the_method_closest_to_fitting_with_its_memory():
    """--method auto on 70B and 4090s: nothing fits; the answer is QLoRA's (the least memory of
    the methods), not full training's 292.58 GiB (issue 33). Referee: --method qlora's own run."""
    auto = json.loads(run(["--model", "70b", "--gpus", "4090", "--method", "auto", "--json"]).stdout)
    qlora = json.loads(run(["--model", "70b", "--gpus", "4090", "--method", "qlora", "--json"]).stdout)
    assert auto["least_memory"]["memory_bytes"] == qlora["least_memory"]["memory_bytes"]
    line = run(["--model", "70b", "--gpus", "4090", "--method", "auto", "--quiet"]).stdout
    assert line.startswith("llama3.1-70b (qlora): no layout fits") and "least memory 30.19 GiB" in line


def test_llama3_405b_as_trained_fits_with_its_papers_micro_batch_group():
    """The Llama 3 405B layout (issue 29) holds (pp - r - 1) x 2 + (vp - 1) x N chunks on stage r at
    megatron-core's N = pp; Llama 3 tuned N below pp (its paper, Sec. 3.3.2). The advice names the
    largest N that fits, and the plan with it fits."""
    args = CASES["405b-llama3-paper"]
    text = " ".join(advice(args))
    m = re.search(r"--pp-microbatch-group (\d+) fits on 8192 x h100", text)
    assert m and int(m[1]) < 16, text
    r = run([*args, "--pp-microbatch-group", m[1], "--quiet"])
    assert r.exit_code == 0 and "/" in r.stdout, r.output
