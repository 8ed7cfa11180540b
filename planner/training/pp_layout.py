"""A pipeline layout stated in megatron-core's syntax (`--pp-layout`, held in
TrainingSetup.pp_balance in place of a split rule's name): which transformer layers each virtual
pipeline stage builds, as Megatron-Bridge's recipes set it.

The syntax (megatron-core 0.16.1 docs/source/api-guide/pipeline_parallel_layout.md and
transformer/pipeline_parallel_layer_layout.py, parse_str_to_list): one letter per layer, "E" the
embedding, "t" a transformer (decoder) layer, "m" an MTP module, "L" the loss with the output
layer; "|" ends a virtual stage; "X*n" repeats a letter and "(...)*n" a group; commas are
cosmetic. Virtual stages run in layer order: stage k sits on pipeline rank k mod pp as its
chunk k // pp (PipelineParallelLayerLayout.__init__, the 1-D to 2-D conversion).
This parser is the planner's own; tests/test_pp_layout.py referees it with megatron-core's.
"""

from __future__ import annotations

import re
from functools import lru_cache

LETTERS = "EtmL"              # embedding, transformer layer, MTP module, loss
MAX_LAYOUT_CHARS = 2048       # the text as given
MAX_LAYOUT_LAYERS = 1 << 14   # letters and stage breaks once repeats are unrolled
_ATOM = re.compile(r"\(([^()]*)\)\*(\d+)|([EtmL|])\*(\d+)")


class LayoutError(ValueError):
    """A layout text that is not megatron-core's syntax or cannot hold a model: the message
    says why in words, without naming the option (the caller does)."""


def is_layout(balance: str) -> bool:
    """Whether TrainingSetup.pp_balance holds a layout rather than a split rule's name: a
    layout has an embedding ("E"), which no rule's name holds."""
    return "E" in balance


@lru_cache(maxsize=256)
def stages(text: str) -> tuple[str, ...]:
    """The layout's virtual stages in layer order, each as its letters (repeats unrolled,
    commas and blanks dropped). Raises LayoutError where the text is not a layout."""
    if len(text) > MAX_LAYOUT_CHARS:
        raise LayoutError(f"is {len(text):,} characters long; at most {MAX_LAYOUT_CHARS:,} are read")
    flat = text.replace(",", "").replace(" ", "")
    while True:     # innermost repeats first, so groups may nest
        flat, n = _ATOM.subn(_unroll, flat)
        if len(flat) > MAX_LAYOUT_LAYERS:
            raise LayoutError(f"unrolls to more than {MAX_LAYOUT_LAYERS:,} layers")
        if not n:
            break
    bad = sorted(set(flat) - set(LETTERS + "|"))
    if bad:
        raise LayoutError(f"holds {''.join(bad)!r}: a layout has only E, t, m, L, '|', 'X*n' and '(...)*n'")
    return tuple(flat.split("|"))


def _unroll(g: re.Match[str]) -> str:
    """One repeat unrolled, refused before it is built where it would pass MAX_LAYOUT_LAYERS."""
    body, times = (g[1], g[2]) if g[1] is not None else (g[3], g[4])
    if len(body) * int(times) > MAX_LAYOUT_LAYERS:
        raise LayoutError(f"unrolls to more than {MAX_LAYOUT_LAYERS:,} layers")
    return body * int(times)


def check(text: str, n_layers: int, mtp_layers: int) -> None:
    """Raise LayoutError where the layout cannot describe a model of ``n_layers`` transformer
    layers and ``mtp_layers`` MTP modules: megatron-core 0.16.1's validate_layer_layout (one
    embedding first, one loss last, every decoder layer before the MTP modules, all of which
    sit in one virtual stage), with the counts named."""
    st = stages(text)
    flat = "".join(st)
    if not flat.startswith("E") or flat.count("E") != 1:
        raise LayoutError("must begin with the embedding 'E', once")
    if not flat.endswith("L") or flat.count("L") != 1:
        raise LayoutError("must end with the loss 'L', once")
    if flat.count("t") != n_layers:
        raise LayoutError(f"holds {flat.count('t')} transformer layers 't'; the model has {n_layers}")
    if flat.count("m") != mtp_layers:
        raise LayoutError(f"holds {flat.count('m')} MTP modules 'm'; --mtp is {mtp_layers}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise LayoutError("puts a transformer layer after an MTP module")
    if mtp_layers and not any(s.count("m") == mtp_layers for s in st):
        raise LayoutError("splits the MTP modules over virtual stages; megatron-core builds them in one")


def stage_refusal(text: str, pp: int, vp: int) -> str | None:
    """Why the layout cannot run at ``pp`` ranks x ``vp`` virtual stages each, or None: it must
    have pp x vp virtual stages (megatron-core infers vp from it), and its MTP modules must sit
    with the loss on the last rank, where the planner times them (a layout that puts them on
    another rank, megatron-core's standalone MTP stage, is not planned)."""
    st = stages(text)
    if len(st) != pp * vp:
        return (f"--pp-layout has {len(st)} virtual stages; pp={pp} x vp={vp} = {pp * vp}: give a pp "
                f"dividing {len(st)} and vp = {len(st)} / pp")
    if "m" in "".join(st) and "m" not in st[-1]:
        return ("--pp-layout puts the MTP modules on a rank before the last (megatron-core's standalone MTP "
                "stage), which the planner does not time: put them in the last virtual stage, with 'L'")
    return None


@lru_cache(maxsize=1024)
def rank_chunks(text: str, pp: int) -> tuple[tuple[int, ...], ...]:
    """Transformer layers per model chunk, per pipeline rank: rank r's chunk c is virtual stage
    c x pp + r. Call only where pp divides the layout's stages (stage_refusal)."""
    counts = [s.count("t") for s in stages(text)]
    vp = len(counts) // pp
    return tuple(tuple(counts[c * pp + r] for c in range(vp)) for r in range(pp))


def shown(text: str) -> str:
    """A layout as a message quotes it: its repr, cut at 60 characters."""
    return repr(text) if len(text) <= 60 else repr(text[:57]) + "..."


def stack_refusal(stack: str | None) -> str | None:
    """Why a stated layout cannot run on ``stack``, or None: the syntax is megatron-core's."""
    if stack in (None, "auto", "megatron"):
        return None
    return f"--pp-layout is megatron-core's syntax; --stack {stack} splits its own way: use --stack megatron"


def split_option(balance: str) -> str:
    """The option that set TrainingSetup.pp_balance, as a refusal names it."""
    return f"--pp-layout {shown(balance)}" if is_layout(balance) else f"--pp-balance {balance}"
