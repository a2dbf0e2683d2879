"""Pictures of a demo run: loss with restart markers, phases per attempt, placement on the
topology. matplotlib with the Agg backend; nothing is shown, PNGs are written."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from railyard.demo.groups import GroupReport, group_marks
from railyard.demo.record import Cell, PlacementPicture, Record, placement_picture

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PHASE_COLORS = {
    "Pending": "#bbbbbb", "Placing": "#9ecae1", "Starting": "#6baed6", "Running": "#31a354",
    "Restarting": "#fd8d3c", "Suspended": "#969696", "Succeeded": "#006d2c", "Failed": "#de2d26",
}


def draw_all(record: Record, out: Path, groups: GroupReport | None = None) -> list[Path]:
    """``groups`` (``--replica-groups``): the step picture shows each group's steps as its
    trainer logged them, the node loss and the heals (railyard.demo.groups.group_marks)."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    return [draw_loss(record, out / "loss.png", groups), draw_timeline(record, out / "timeline.png"),
            draw_placement(record, out / "placement.png", groups)]


def _restarts(record: Record) -> list[tuple[float, int]]:
    out = []
    for a, b in zip(record.samples, record.samples[1:], strict=False):
        if b.attempt > a.attempt:
            out.append((b.t - record.started_at, b.attempt))
    return out


def draw_loss(record: Record, path: Path, groups: GroupReport | None = None) -> Path:
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_step) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    attempts = sorted({s.attempt for s in record.samples})
    for attempt in attempts:
        # from the attempt's first reported step on (before it, status still shows the last one)
        own = [s for s in record.samples if s.attempt == attempt]
        first = next((i for i, s in enumerate(own) if s.tokens_per_s > 0), len(own))
        pts = [(s.t - record.started_at, s.loss, s.step) for s in own[first:] if s.loss is not None]
        if pts:
            ax_loss.plot([p[0] for p in pts], [p[1] for p in pts], ".-", label=f"attempt {attempt}")
            if groups is None:
                ax_step.plot([p[0] for p in pts], [p[2] for p in pts], "-", label=f"attempt {attempt}")
    if groups is not None:
        _draw_group_steps(ax_step, groups, record.started_at)
    for t, attempt in _restarts(record):
        for ax in (ax_loss, ax_step):
            ax.axvline(t, color="#de2d26", linestyle="--", linewidth=1)
        ax_loss.annotate(
            f"restart -> attempt {attempt}",
            (t, ax_loss.get_ylim()[1]),
            rotation=90,
            va="top",
            ha="right",
            fontsize=8,
            color="#de2d26",
        )
    for t, what in record.actions:
        ax_step.axvline(t - record.started_at, color="#756bb1", linestyle=":", linewidth=1)
        ax_step.annotate(
            what, (t - record.started_at, 0), rotation=90, va="bottom", ha="right", fontsize=8, color="#756bb1"
        )
    ax_loss.set_ylabel("loss")
    ax_loss.set_title("Training loss; dashed: restarts, dotted: injected faults")
    ax_loss.legend(fontsize=8)
    ax_step.set_ylabel("step" if groups is None else "step (each group's rank 0)")
    ax_step.set_xlabel("seconds since kubectl apply")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _draw_group_steps(ax: object, groups: GroupReport, started_at: float) -> None:
    """Each replica group's steps as its trainer logged them (gaps: not training), the node
    loss and every heal marked on the group it happened to."""
    from typing import Any

    a: Any = ax
    colors = {}
    markers = ["o", "x", "+", "^"]
    for story in groups.stories:
        pts = [(t - started_at, step) for t, step in story.steps]
        if pts:
            # groups step together: hollow and open markers keep every group visible
            (line,) = a.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                markers[story.group % len(markers)],
                markersize=5,
                markerfacecolor="none",
                linestyle="none",
                label=f"group {story.group}" + (" (node lost, healed)" if story.heals else ""),
            )
            colors[story.group] = line.get_color()
    for m in group_marks(groups, started_at):
        color = "#de2d26" if m.kind == "node lost" else colors.get(m.group, "#31a354")
        a.plot(
            [m.t],
            [m.step],
            "X" if m.kind == "node lost" else "*",
            markersize=12,
            color=color,
            markeredgecolor="#333333",
        )
        a.annotate(
            m.label,
            (m.t, m.step),
            xytext=(6, -12 if m.kind == "healed" else 6),
            textcoords="offset points",
            fontsize=8,
            color=color,
        )
    a.legend(fontsize=8, loc="lower right")


def phase_spans(record: Record) -> list[tuple[int, str, float, float]]:
    """(attempt, phase, start, end) spans in seconds since the start."""
    spans: list[tuple[int, str, float, float]] = []
    end = (record.finished_at or (record.samples[-1].t if record.samples else record.started_at)) - record.started_at
    for i, s in enumerate(record.samples):
        nxt = record.samples[i + 1].t - record.started_at if i + 1 < len(record.samples) else end
        start = s.t - record.started_at
        if spans and spans[-1][0] == s.attempt and spans[-1][1] == s.phase:
            spans[-1] = (s.attempt, s.phase, spans[-1][2], nxt)
        else:
            spans.append((s.attempt, s.phase, start, nxt))
    return spans


def draw_timeline(record: Record, path: Path) -> Path:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    spans = phase_spans(record)
    attempts = sorted({a for a, *_ in spans}) or [0]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(attempts)))
    for attempt, phase, start, end in spans:
        ax.broken_barh(
            [(start, max(end - start, 0.05))], (attempt - 0.35, 0.7), color=PHASE_COLORS.get(phase, "#cccccc")
        )
    ax.set_yticks(attempts, [f"attempt {a}" for a in attempts])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since kubectl apply")
    ax.set_title("Phases per attempt")
    used = sorted({p for _, p, *_ in spans}, key=list(PHASE_COLORS).index)
    ax.legend(
        handles=[Patch(color=PHASE_COLORS[p], label=p) for p in used],
        fontsize=8,
        ncol=len(used),
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35),
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_placement(record: Record, path: Path, groups: GroupReport | None = None) -> Path:
    import matplotlib.pyplot as plt

    fig = placement_figure(record, groups)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


NVLINK_COLOR = "#3182bd"


def placement_figure(record: Record, groups: GroupReport | None = None) -> Figure:
    """The placement picture: each leaf's nodes under its ``spine / leaf`` bar and, where nodes
    carry the NVLink-domain label, each domain outlined (dashed) around its nodes with its name
    and the TP groups inside it; a TP group spanning several pods joined by a bar."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    picture = placement_picture(record)
    domains = picture.domains()
    group_of = {i: s.group for s in groups.stories for i in s.pod_indices} if groups is not None else {}
    colors = {"pod": "#a1d99b", "spare": "#c6dbef", "quarantined": "#fcbba1", "free": "#f0f0f0"}
    width = sum(len(cells) for cells in picture.leaves.values())
    fig, ax = plt.subplots(figsize=(2.2 * max(width, 2), 3.2 if not domains else 3.8))
    x = 0.0
    for (spine, leaf), cells in sorted(picture.leaves.items()):
        left = x
        starts: list[float] = []
        for i, c in enumerate(cells):
            if i and c.domain != cells[i - 1].domain:
                x += 0.3  # room between two NVLink domains' outlines
            label = c.node
            if c.role == "pod":
                label = (
                    f"{c.node}\npod {c.pod_index}"
                    + (f" group {group_of[c.pod_index]}" if c.pod_index in group_of else "")
                    + (" (moved)" if c.moved else "")
                )
                if c.tp_groups:
                    label += "\nTP " + ", ".join(str(g) for g in c.tp_groups)
            elif c.role != "free":
                label = f"{c.node}\n{c.role}"
            ax.add_patch(
                FancyBboxPatch((x, 0), 1.8, 1, boxstyle="round,pad=0.05", facecolor=colors[c.role], edgecolor="#333333")
            )
            ax.text(x + 0.9, 0.5, label, ha="center", va="center", fontsize=8)
            starts.append(x)
            x += 2.0
        if domains:
            _draw_nvlink_domains(ax, cells, starts, domains)
        ax.plot([left + 0.9, x - 1.1], [1.35, 1.35], color="#555555")
        ax.text((left + x - 0.2) / 2, 1.5, f"{spine} / {leaf}", ha="center", fontsize=9)
        x += 0.5
    ax.set_xlim(-0.3, x)
    ax.set_ylim(-0.3 if not domains else -0.8, 1.9)
    ax.axis("off")
    if groups is not None:
        how = "one replica group per pod (FSDP inside it), HSDP across groups"
    elif any(len(_pods_of(picture, g)) > 1 for gs in domains.values() for g in gs):
        how = "TP across the nodes of one NVLink domain (dashed), FSDP across domains on one rail"
    else:
        how = "TP inside each node, FSDP across nodes on one rail" + ("; dashed: NVLink domains" if domains else "")
    ax.set_title(f"Placement of the final gang (attempt {picture.attempt}); {how}")
    return fig


def _pods_of(picture: PlacementPicture, tp_group: int) -> list[str]:
    return [c.node for cells in picture.leaves.values() for c in cells if tp_group in c.tp_groups]


def _draw_nvlink_domains(
    ax: object, cells: list[Cell], starts: list[float], domains: dict[str, tuple[int, ...]]
) -> None:
    """One leaf's NVLink domains: a dashed outline around each run of its nodes in one domain
    (placement_picture keeps them together), named below with the TP groups inside it; a TP
    group on several of those nodes is joined by a bar across them."""
    from typing import Any

    from matplotlib.patches import FancyBboxPatch

    a: Any = ax
    run_start = 0
    for i in range(1, len(cells) + 1):
        if i < len(cells) and cells[i].domain == cells[run_start].domain:
            continue
        domain = cells[run_start].domain
        if domain:
            x0, x1 = starts[run_start] - 0.12, starts[i - 1] + 1.92
            a.add_patch(FancyBboxPatch((x0, -0.12), x1 - x0, 1.24, boxstyle="round,pad=0.02", fill=False,
                                       edgecolor=NVLINK_COLOR, linestyle="--", linewidth=1.5))
            tp = domains.get(domain, ())
            a.text(
                (x0 + x1) / 2,
                -0.25,
                f"NVLink {domain}" + (f"\nTP groups {', '.join(str(g) for g in tp)}" if tp else ""),
                ha="center",
                va="top",
                fontsize=8,
                color=NVLINK_COLOR,
            )
            for g in tp:
                on = [starts[j] for j in range(run_start, i) if g in cells[j].tp_groups]
                if len(on) > 1:
                    a.plot(
                        [on[0] + 0.2, on[-1] + 1.6],
                        [0.12, 0.12],
                        color=NVLINK_COLOR,
                        linewidth=3,
                        solid_capstyle="round",
                    )
        run_start = i
