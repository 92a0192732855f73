"""The history drawn: one static HTML page (``tfmem history PATH --html=OUT``) and sparklines.

The page is self-contained: inline CSS and one inline SVG chart per test, no script and nothing
fetched, so it opens from a CI job's artifacts as it is. Each chart draws the test's figure at
each measured commit; a point's tooltip (its SVG ``<title>``) names the commit, its date and the
figure; each step is a dashed line at its first commit. Tests come in the order of their creep,
largest first, one section per environment (``history.series_label``).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_tfmem.files import Output, starts_with
from pytest_tfmem.gates.history import Series, series_label
from pytest_tfmem.gates.steps import Creep, Step, short
from pytest_tfmem.units import Tolerance, format_size

WIDTH, HEIGHT, MARGIN = 720, 170, 34
MIN_SPAN = 0.2
SPARKS = "▁▂▃▄▅▆▇█"
MARKER = "<!-- pytest-tfmem memory history -->"  # near its start: a page of its own kind, which may be replaced

OUTPUT = Output("history page", starts_with(f"<!DOCTYPE html>\n{MARKER}"))

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 780px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }
section.test { margin: 1.5em 0 2em; }
h3 { font: 600 13px/1.3 ui-monospace, monospace; word-break: break-all; margin: 0 0 .3em; }
p.creep { margin: .2em 0; } ul.steps { margin: .2em 0; padding-left: 1.2em; }
code { font: 12px ui-monospace, monospace; background: #f4f4f4; padding: 0 .2em; }
svg .line { fill: none; stroke: #1f77b4; stroke-width: 1.5; }
svg .point { fill: #1f77b4; } svg .point:hover { fill: #d62728; r: 5; }
svg .point.failed { fill: #fff; stroke: #ff7f0e; stroke-width: 2; }
svg .step { stroke: #d62728; stroke-dasharray: 4 3; } svg .axis { stroke: #999; }
svg text { font: 10px sans-serif; fill: #555; }
"""


@dataclass(frozen=True)
class Drawn:
    """One test's series with what was found in it."""

    series: Series
    steps: tuple[Step, ...]
    creep: Creep | None

    @property
    def creep_share(self) -> float:
        return (self.creep.share or 0.0) if self.creep is not None else 0.0

    def crept(self, min_step: Tolerance) -> bool:
        """It crept beyond ``min_step`` and its noise since its best level."""
        return self.creep is not None and self.creep.notable(min_step)


def sparkline(values: Sequence[float]) -> str:
    """``▁▂▂▃▇█``: the values from their lowest to their highest."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = high - low
    return "".join(SPARKS[0 if span == 0 else min(len(SPARKS) - 1, int((value - low) / span * len(SPARKS)))]
                   for value in values)


def chart(drawn: Drawn) -> str:
    """The SVG of one test: its figure per commit, its steps marked, a tooltip on every point."""
    points = drawn.series.points
    values = [point.value for point in points]
    # the scale spans at least a fifth of the highest figure: noise of a few pages draws flat
    high = max(values) or 1.0
    low = min(min(values), high * (1 - MIN_SPAN))
    width, height = WIDTH - 2 * MARGIN, HEIGHT - 2 * MARGIN

    def x(index: int) -> float:
        return MARGIN + (index * width / (len(points) - 1) if len(points) > 1 else width / 2)

    def y(value: float) -> float:
        return MARGIN + height - (value - low) / (high - low) * height

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(drawn.series.nodeid)}">',
        f'<line class="axis" x1="{MARGIN}" y1="{MARGIN + height}" x2="{WIDTH - MARGIN}" y2="{MARGIN + height}"/>',
        f'<text x="2" y="{MARGIN + 4}">{html.escape(format_size(int(high)))}</text>',
        f'<text x="2" y="{MARGIN + height}">{html.escape(format_size(int(low)))}</text>',
    ]
    for step in drawn.steps:
        parts.append(
            f'<line class="step" data-commit="{step.commit}" x1="{x(step.index):.1f}" y1="{MARGIN - 6}" '
            f'x2="{x(step.index):.1f}" y2="{MARGIN + height}"><title>{html.escape(step.describe())}</title></line>'
        )
    line = " ".join(f"{x(index):.1f},{y(value):.1f}" for index, value in enumerate(values))
    parts.append(f'<polyline class="line" points="{line}"/>')
    for index, point in enumerate(points):
        tip = f"{short(point.commit)} {point.date} {format_size(int(point.value))}"
        if len(point.samples) > 1:
            tip += f" (median of {len(point.samples)} runs)"
        failed = ""
        if point.failed:
            tip += f", failed: {point.failed}"
            failed = " failed"
        parts.append(
            f'<circle class="point{failed}" data-commit="{point.commit}" data-bytes="{int(point.value)}" '
            f'cx="{x(index):.1f}" cy="{y(point.value):.1f}" r="3"><title>{html.escape(tip)}</title></circle>'
        )
    parts.append(f'<text x="{MARGIN}" y="{HEIGHT - 6}">{html.escape(short(points[0].commit))}</text>')
    parts.append(f'<text x="{WIDTH - MARGIN - 40}" y="{HEIGHT - 6}">{html.escape(short(points[-1].commit))}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def page(groups: Sequence[Sequence[Drawn]], source: str, quantity: str) -> str:
    """The whole page: a section per environment, a chart per test, largest creep first."""
    body = [f"<h1>pytest-tfmem: memory history ({html.escape(quantity)})</h1>",
            f"<p>From <code>{html.escape(source)}</code>; each environment is a series of its own.</p>"]
    for drawn_tests in groups:
        if not drawn_tests:
            continue
        body.append(f"<h2>{html.escape(series_label(drawn_tests[0].series.environment))}</h2>")
        for drawn in sorted(drawn_tests, key=lambda d: -d.creep_share):
            body.append(f'<section class="test" data-test="{html.escape(drawn.series.nodeid)}">')
            body.append(f"<h3>{html.escape(drawn.series.nodeid)}</h3>")
            if drawn.creep is not None:
                body.append(f'<p class="creep">since its best: {html.escape(drawn.creep.describe())}</p>')
            if drawn.steps:
                body.append('<ul class="steps">' + "".join(
                    f"<li>step {html.escape(step.describe())}</li>" for step in drawn.steps) + "</ul>")
            body.append(chart(drawn))
            body.append("</section>")
    return "\n".join([
        "<!DOCTYPE html>", MARKER, '<html lang="en"><head><meta charset="utf-8">',
        "<title>pytest-tfmem: memory history</title>", f"<style>{_STYLE}</style></head><body>",
        *body, "</body></html>", "",
    ])


def markdown(groups: Sequence[Sequence[Drawn]], min_step: Tolerance) -> str:
    """A Markdown table per environment: each test that stepped or crept, its sparkline, its steps."""
    lines = ["### pytest-tfmem: memory history", ""]
    for drawn_tests in groups:
        moved = [drawn for drawn in drawn_tests if drawn.steps or drawn.crept(min_step)]
        if not drawn_tests:
            continue
        lines += [f"**{series_label(drawn_tests[0].series.environment)}**: {len(moved)} of {len(drawn_tests)} "
                  "test(s) moved", ""]
        if not moved:
            continue
        lines += ["| test | history | steps | since its best |", "|---|---|---|---|"]
        for drawn in sorted(moved, key=lambda d: -d.creep_share):
            values = [point.value for point in drawn.series.points]
            steps = "; ".join(step.describe() for step in drawn.steps) or "-"
            since = drawn.creep.describe() if drawn.creep is not None else "-"
            lines.append(f"| `{drawn.series.nodeid}` | {sparkline(values)} | {steps} | {since} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
