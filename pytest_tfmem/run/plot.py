"""A PNG of one ``tfmem run``'s memory over time: the process tree's RSS (host) and each
framework device view's memory in use, with the budget, the kill limit and a death marked."""

from __future__ import annotations

from pathlib import Path

from pytest_tfmem import frameworks
from pytest_tfmem.run.summary import RunSummary

MIB = 2**20
_VIEW_COLOURS = ["#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"]


def plot_run(run: RunSummary, path: str | Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    if run.timeline:
        times, rss = zip(*run.timeline)
        axes.plot(times, [value / MIB for value in rss], color="#1f77b4", label="host: process tree RSS")
    views = sorted({view for _, levels in run.device_timeline for view in levels})
    for view, colour in zip(views, _VIEW_COLOURS * len(views)):
        points = [(t, levels[view]) for t, levels in run.device_timeline if view in levels]
        axes.step([t for t, _ in points], [value / MIB for _, value in points], where="post", color=colour,
                  label=f"{frameworks.view_label(view) or view} in use")
    for value, label, style in ((run.budget, "--budget", "--"), (run.kill_at, "--kill-at", ":")):
        if value is not None:
            axes.axhline(value / MIB, color="grey", ls=style, label=label)
    axes.axhline(run.peak / MIB, color="black", lw=0.8, label="peak (high-water marks)")
    if run.death is not None and run.timeline:
        axes.plot([run.timeline[-1][0]], [run.death.last_rss / MIB], "x", color="#d62728", ms=12,
                  label=f"killed ({run.death.signal})")
    axes.set_xlabel("seconds since the start")
    axes.set_ylabel("MiB")
    axes.set_title(f"tfmem run {' '.join(run.command)}"[:100])
    axes.legend(loc="upper left", fontsize=8)
    figure.savefig(path, format="png")
