"""The planner's moments of a step beside torchtitan's tracker, moment by moment.

A step's peak is one moment, and the categories a tracker reports are those of that moment. The
planner chooses its peak among its own moments (planner.memory.peak.MOMENTS); the tracker's
run keeps the peak snapshot of each phase bucket (planner.measure.titan_depth.BUCKETS). Holding
the planner's categories at one moment against the tracker's at another compares different
things (the totals may agree while the categories do not), so each planner moment is read
against the bucket that is the same moment of torchtitan's step:

- ``forward-end`` (the last block's forward, its all-gathers in flight): ``forward``;
- ``backward-start`` (every block's saved tensors and the loss's): ``loss``, the chunked loss's
  forward and per-chunk backward (torchtitan 0.3.0 components/loss.py, ChunkedLossWrapper);
- ``block-backward`` (inside the last block's backward, its recomputation): ``backward-start``;
- ``backward-end`` (FSDP2's end of backward): ``backward-end``, block 0's backward and what runs
  after the decoder (the embedding's backward, the root's post-backward);
- ``optimizer-step``: ``optimizer``.

The rows compare categories at the tracker's peak moment; the total row stays peak against
peak. Where a category is still over 10% apart at the same moment, ``category_notes`` names
the term that the planner files elsewhere or the sub-moment the two differ in, with its bytes.
Pure functions over plain dicts; no torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from planner.measure.accuracy import Row
from planner.measure.accuracy import predicted_rows as accuracy_rows
from planner.measure.readout import CATEGORIES
from planner.memory.peak import MOMENT_PARTS
from planner.training.setup import TrainingSetup

# planner moment -> the tracker's bucket at the same moment of torchtitan's step
BUCKET_OF_MOMENT = {"forward-end": "forward", "backward-start": "loss", "block-backward": "backward-start",
                    "backward-end": "backward-end", "optimizer-step": "optimizer"}
MOMENT_OF_BUCKET = {b: m for m, b in BUCKET_OF_MOMENT.items()}
LABELS = {"forward-end": "end of forward (the last block's forward)",
          "backward-start": "loss (the chunked loss's forward and backward)",
          "block-backward": "the last block's backward (its recomputation)",
          "backward-end": "end of backward (block 0 and the root's backward)",
          "optimizer-step": "optimizer step"}
# how the output names each moment
SHORT = {"forward-end": "end of forward", "backward-start": "loss", "block-backward": "last block's backward",
         "backward-end": "end of backward", "optimizer-step": "optimizer step"}
ROWS = ("weights", "gradients", "optimizer", "activations", "buffers")
WITHIN = 0.10
FLOOR_SHARE = 0.002
GIB = 2**30


@dataclass(frozen=True, kw_only=True, slots=True)
class MomentTotals:
    """One moment's tracked total, bytes: the planner's and the tracker's."""

    moment: str
    predicted_bytes: int
    measured_bytes: int


def measured_rows(raw: Mapping[str, int]) -> dict[str, int]:
    """The tracker's categories of one snapshot in the planner's rows (activations: the tracker's
    activations, temporaries and inputs), bytes."""
    cat = {c: sum(int(raw.get(n, 0)) for n in names) for c, names in CATEGORIES.items()}
    return {"weights": cat["weights"], "gradients": cat["gradients"], "optimizer": cat["optimizer"],
            "activations": cat["activations"] + cat["temporaries"] + cat["inputs"], "buffers": cat["buffers"]}


def predicted_rows(weights_bytes: int, optimizer_bytes: int, parts: tuple[int, ...]) -> dict[str, int]:
    """The planner's rows at one moment from its parts (memory.peak.MOMENT_PARTS) and the weights
    and optimizer states every moment holds, bytes (as memory.model.rank_memories sums them)."""
    p = dict(zip(MOMENT_PARTS, parts, strict=True))
    return {"weights": weights_bytes + p["extra_weights"], "gradients": p["gradients"],
            "optimizer": optimizer_bytes + p["step_temporaries"], "activations": p["activations"] + p["logits"],
            "buffers": p["buffers"]}


def peak_bucket(moments: Mapping[str, Mapping[str, int]]) -> str:
    """The tracker's bucket with the highest total."""
    return max(moments, key=lambda b: int(moments[b].get("Total", 0)))


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if abs(n) >= 0.1 * GIB else f"{n / 2**20:.1f} MiB"


def _error(pred: int, meas: int) -> float | None:
    return None if meas == 0 else (pred - meas) / meas


def category_notes(moment: str, predicted: Mapping[str, int], measured: Mapping[str, int],
                   raw: Mapping[str, int], terms: Mapping[str, Any], where: str = "") -> tuple[str, ...]:
    """Why a category is still over 10% from the tracker's at the same moment: the planner term
    filed in another category, or the sub-moment the two differ in, each with its bytes.

    ``terms``: the planner's terms at the row (memory.model.RankTerms fields: root_gathered,
    head_grad, fsdp_done, buffers); ``raw``: the tracker's snapshot; ``where``: the innermost
    module running at the tracker's snapshot ("" outside any). The sources are torchtitan 0.3.0's
    FSDP2 wrapping (distributed/fsdp.py, apply_fsdp_to_decoder: the embedding and [norm, lm_head]
    as units of their own, the latter not resharded after forward) and its chunked loss
    (components/loss.py: the LM head's gradient accumulated unsharded over the chunks, reduced
    after the last chunk)."""
    # apart: over 10%, by more than 0.2% of the moment's measured total (so that a category of a few
    # bytes, 100% off, is not a finding; category_notes says so of those)
    floor = FLOOR_SHARE * sum(measured.values())
    off = {c for c in ROWS if abs(predicted[c] - measured[c]) > floor
           and ((e := _error(predicted[c], measured[c])) is None or abs(e) > WITHIN)}
    notes: list[tuple[set[str], str]] = []     # (the categories a note accounts for, the note)
    root = int(terms.get("root_gathered", 0))
    head = int(terms.get("head_grad", 0))
    unsharded_param = int(raw.get("Unsharded Param", 0))
    unsharded_grad = int(raw.get("Unsharded Grad", 0))
    sharded_grad = int(raw.get("Sharded Grad", 0))
    temp = int(raw.get("Temp", 0))
    rs = int(raw.get("Reduce Scatter", 0))
    if moment == "backward-end":
        block = re.search(r"\.layers\.(\d+)", where)
        inside = (f"inside block {block.group(1)}'s backward" if block else
                  "after the decoder, in the embedding's backward and the root's post-backward")
        notes.append(({"weights", "gradients", "activations", "buffers"},
                      f"end of backward: the tracker peaks {inside}, holding {_gib(sharded_grad + unsharded_grad)} "
                      f"of gradients ({_gib(unsharded_grad)} of them unsharded) and {_gib(temp)} of temporaries; the "
                      f"planner's FSDP2 moment is inside a block's backward with {terms.get('fsdp_done', 0)} blocks' "
                      "gradients reduced (memory.peak.fsdp_blocks_done), with a gathered block, reduce-scatter "
                      "buffers and one block's activations in place of the last gradients: a nearby moment, split "
                      "otherwise"))
    if root > 0 and moment != "optimizer-step":
        notes.append(({"weights"},
                      f"weights, the root unit: the planner keeps FSDP2's root unit gathered at every moment "
                      f"({_gib(root)}: "
                      "embedding, final norm and LM head in 16 bits, as a transformers model is wrapped); "
                      "torchtitan 0.3.0 wraps the embedding and [norm, lm_head] as units of their own "
                      "(distributed/fsdp.py, apply_fsdp_to_decoder), gathered around their use: the tracker holds "
                      f"{_gib(unsharded_param)} of unsharded parameters here"))
    if moment == "backward-start" and unsharded_grad:
        notes.append(({"gradients", "activations"},
                      "LM-head gradient at the loss: the planner counts it, unsharded, in the loss (the fp32 "
                      "accumulator and the 16-bit chunk gradient, memory.loss.chunked_loss_bytes); the tracker files "
                      "the 16-bit "
                      f"one ({_gib(unsharded_grad)}) as a gradient and the rest among its {_gib(temp)} of temporaries"))
    if moment == "backward-start" and predicted["buffers"] > measured["buffers"]:
        notes.append(({"buffers"},
                      f"buffers at the loss: the planner holds FSDP2's all-gather buffer for the next unit "
                      f"({_gib(predicted['buffers'])}, memory.buffers) at every moment before the end of backward; "
                      "torchtitan's chunked loss unshards the LM head itself while FSDP2 is idle (ChunkedLossWrapper, "
                      f"components/loss.py) and nothing else is gathered then: {_gib(measured['buffers'])} here"))
    if moment == "block-backward" and head:
        notes.append(({"gradients", "activations", "buffers"},
                      f"LM-head gradient in backward: the planner holds it, unsharded, through the decoder's backward "
                      f"({_gib(head)}, in the activations: the root unit reduced last, memory.peak head_grad); "
                      "torchtitan's [norm, lm_head] unit reduce-scatters it in the last chunk's backward "
                      "(ChunkedLossWrapper, components/loss.py), so the tracker holds "
                      f"sharded gradients ({_gib(sharded_grad)}: that unit's and the last block's) and reduce-scatter "
                      f"buffers ({_gib(rs)}) instead"))
    out = [text for cats, text in notes if cats & off]
    covered = set().union(*(cats for cats, _ in notes if cats & off)) if out else set()
    out += [f"unmatched {c}: {_gib(predicted[c])} predicted, {_gib(measured[c])} measured at this moment, not "
            "matched to a planner term" for c in ROWS if c in off - covered]
    small = [c for c in ROWS if c not in off and (e := _error(predicted[c], measured[c])) is not None
             and abs(e) > WITHIN or e is None and predicted[c] > 0]
    if small:
        out.append(f"small: {', '.join(small)} over 10% apart by less than {100 * FLOOR_SHARE:.1f}% of the "
                   "moment's total, not explained here")
    return tuple(out)


def moment_rows(pred: Any, setup: TrainingSetup, peak_bytes: int, peak_raw: Mapping[str, int],
                buckets: Mapping[str, Mapping[str, int]], where: Mapping[str, str],
                ) -> tuple[tuple[Row, ...], str, tuple[MomentTotals, ...], tuple[str, ...]]:
    """The comparison's rows at the tracker's peak moment (each category predicted at the planner's
    same moment, planner.measure.titan_moments) and the total peak against peak; every moment's
    totals; the notes on categories still over 10% apart. ``pred``: memory.model.RankMemory of the
    measured layout (with its terms); the measurement's peak and its snapshot (the tracker's
    categories), and its ``moments`` and ``moment_modules`` (planner.measure.torchtitan.TitanMeasurement)."""
    terms = pred.terms
    view = terms.view(setup)
    weights, optimizer = int(terms.get("weights")), int(terms.get("offload.optimizer"))
    moments = terms.moments()
    # the planner's FSDP2 end of backward is the same moment as the tracker's (block 0 and the root)
    # only near the end; where a block's activations outweigh its gradients it is the second block
    # in backward (memory.peak.fsdp_blocks_done), which no bucket holds: left out of the totals
    early = int(view.fsdp_done) < int(view.n_act_layers) - 2
    totals = tuple(MomentTotals(moment=k, predicted_bytes=weights + optimizer + sum(moments[k]),
                                measured_bytes=int(buckets[b].get("Total", 0)))
                   for k, b in BUCKET_OF_MOMENT.items()
                   if k in moments and b in buckets and not (k == "backward-end" and early))
    predicted_total = accuracy_rows(pred.breakdown)["total"]
    total = Row(category="total", predicted_bytes=predicted_total, measured_bytes=peak_bytes)
    bucket = peak_bucket(buckets) if buckets else ""
    moment = MOMENT_OF_BUCKET.get(bucket, "")
    if moment not in moments:        # no such moment in the planner (or no buckets): at the peaks
        peak = accuracy_rows(pred.breakdown)
        measured = measured_rows(peak_raw)
        rows = tuple(Row(category=c, predicted_bytes=peak[c], measured_bytes=measured[c]) for c in ROWS)
        return (*rows, total), "", totals, ()
    predicted = predicted_rows(weights, optimizer, moments[moment])
    raw = buckets[bucket]
    measured = measured_rows(raw)
    rows = tuple(Row(category=c, predicted_bytes=predicted[c], measured_bytes=measured[c]) for c in ROWS)
    notes = category_notes(moment, predicted, measured, raw, asdict(view), where.get(bucket, ""))
    return (*rows, total), moment, totals, notes
