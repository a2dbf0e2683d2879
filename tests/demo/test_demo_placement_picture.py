"""The placement picture draws NVLink domains from what the demo records (node labels and
``status.placement``), and is unchanged when no node carries the label. No cluster, no pixels:
the assertions are on the matplotlib artists."""

from __future__ import annotations

from typing import Any

import pytest

from railyard.demo.plots import NVLINK_COLOR, placement_figure
from railyard.demo.record import Record, note_nodes, note_placement, placement_picture
from railyard.demo.scenario import Scenario
from railyard.logic.topology import NVLINK_LABEL

pytest.importorskip("matplotlib").use("Agg")


def _nodes(nvlink_key: str | None) -> list[dict[str, Any]]:
    """8 nodes, 2 leaves of 4, NVLink domains of 2 nodes each (nvl-<leaf>-<i>) when labelled."""
    out = []
    for i in range(8):
        labels = {"railyard.dev/spine": "spine-0", "railyard.dev/leaf": f"leaf-{i // 4}"}
        if nvlink_key:
            labels[nvlink_key] = f"nvl-{i // 4}-{i % 4 // 2}"
        out.append({"metadata": {"name": f"node-{i}", "labels": labels}})
    return out


def _record(nvlink_key: str | None, **job_topology: str) -> Record:
    """4 pods x 2 ranks, tensor 4: each TP group spans 2 pods (TP group 0 on pods 0, 1; 1 on 2, 3)."""
    job = Scenario(nodes=4, tensor=4).training_job()
    job["spec"]["topology"].update(job_topology)
    r = Record(started_at=0.0)
    note_nodes(r, job, _nodes(nvlink_key))
    note_placement(r, {"placement": {"attempt": 0, "nodes": ["node-0", "node-1", "node-4", "node-5"], "spares": ["node-2"]}})
    return r


def _texts(fig: Any) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def _outlines(fig: Any) -> list[Any]:
    return [p for ax in fig.axes for p in ax.patches if not p.get_fill() and p.get_edgecolor()[:3] == _rgb(NVLINK_COLOR)]


def _rgb(color: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return to_rgb(color)


def test_each_nvlink_domain_is_outlined_and_named_with_the_tp_groups_inside_it() -> None:
    import matplotlib.pyplot as plt

    r = _record(NVLINK_LABEL)
    assert r.nvlink["node-5"] == "nvl-1-0" and r.tp_groups == {0: (0,), 1: (0,), 2: (1,), 3: (1,)}
    pic = placement_picture(r)
    assert pic.domains() == {"nvl-0-0": (0,), "nvl-0-1": (), "nvl-1-0": (1,), "nvl-1-1": ()}
    fig = placement_figure(r)
    try:
        texts = _texts(fig)
        # every domain named once, the TP groups inside it under its name
        assert sorted(t for t in texts if t.startswith("NVLink")) == [
            "NVLink nvl-0-0\nTP groups 0", "NVLink nvl-0-1", "NVLink nvl-1-0\nTP groups 1", "NVLink nvl-1-1"]
        assert "node-4\npod 2\nTP 1" in texts and "node-2\nspare" in texts
        # one dashed outline per domain, around exactly its two nodes
        outlines = sorted(_outlines(fig), key=lambda p: p.get_x())
        assert len(outlines) == 4 and all(p.get_linestyle() == "--" for p in outlines)
        cells = [p for p in fig.axes[0].patches if p.get_fill()]
        assert len(cells) == 8
        for box, pair in zip(outlines, [cells[0:2], cells[2:4], cells[4:6], cells[6:8]], strict=True):
            assert box.get_x() < pair[0].get_x() and pair[1].get_x() + pair[1].get_width() < box.get_x() + box.get_width()
        # each TP group spanning two pods is joined by a bar
        bars = [ln for ln in fig.axes[0].lines if ln.get_color() == NVLINK_COLOR]
        assert len(bars) == 2
        assert "TP across the nodes of one NVLink domain" in fig.axes[0].get_title()
    finally:
        plt.close(fig)


def test_the_label_named_in_topology_nvlinklevel_is_the_one_read() -> None:
    r = _record("example.com/rack", nvlinkLevel="example.com/rack")
    assert placement_picture(r).domains()["nvl-1-0"] == (1,)
    assert _record("example.com/rack").nvlink == {}, "another key than the job's is not an NVLink domain"


def test_without_the_label_the_picture_is_as_before() -> None:
    import matplotlib.pyplot as plt

    r = _record(None)
    assert r.nvlink == {} and placement_picture(r).domains() == {}
    fig = placement_figure(r)
    try:
        texts = _texts(fig)
        assert not [t for t in texts if "NVLink" in t or "TP " in t]
        assert "node-4\npod 2" in texts
        assert _outlines(fig) == [] and fig.axes[0].get_ylim() == (-0.3, 1.9)
        assert fig.axes[0].get_title().endswith("TP inside each node, FSDP across nodes on one rail")
    finally:
        plt.close(fig)
