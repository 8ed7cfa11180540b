"""The memory panel read as a user reads it (issue 20, plots): no tick labels overlap, bars
with the same memory are told apart (each label ends with its step time), and a category
too thin to see in every bar has its size in the legend."""

import pytest

from planner import api
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import SearchSpace
from planner.models.spec import load_model
from planner.report import plot
from planner.training.setup import TrainingSetup


@pytest.fixture(scope="module")
def figure():
    # Llama 3.1 70B on H100: the chosen plan and five alternatives (six bars, the most the
    # panel draws), whose logits and buffers are a few pixels at most
    r = api.plan(load_model("70b"), get_gpu("h100"), TrainingSetup(), SearchSpace(), max_gpus=16)
    fig = plot.plan_figure(r)
    fig.canvas.draw()
    return r, fig


@pytest.mark.slow
def test_tick_labels_do_not_overlap(figure):
    _, fig = figure
    mem = fig.axes[0]
    boxes = [t.get_window_extent() for t in mem.get_xticklabels() if t.get_text()]
    assert len(boxes) >= 3
    for a, b in zip(boxes, boxes[1:]):
        assert a.x1 <= b.x0, (a, b)


def test_every_bar_is_labelled_with_its_step_time(figure):
    r, fig = figure
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert all(label.endswith("/step") for label in labels), labels
    assert len(labels) == 1 + len(r.alternatives)


def test_thin_categories_carry_their_size_in_the_legend(figure):
    r, fig = figure
    (legend,) = fig.legends
    texts = [t.get_text() for t in legend.get_texts()]
    y_max = fig.axes[0].get_ylim()[1]
    cands = [r.best, *r.alternatives]
    for name, label in plot.LABELS.items():
        top_gib = max(getattr(c.memory.breakdown, name) for c in cands) / 2**30
        (text,) = [t for t in texts if t.startswith(label)]
        assert ("at most" in text) == (top_gib < plot.THIN_FRACTION * y_max), (text, top_gib)
