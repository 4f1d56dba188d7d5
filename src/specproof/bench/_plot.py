"""The bench plot: speedup vs k per workload, with tokens per round beside it (matplotlib, Agg).

``plot_series`` says what is drawn (one ``Series`` per target, rollback and kind of figure, each
with its own marker and line style); ``plot_result`` draws it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

import attrs

__all__ = ["Series", "plot_result", "plot_series"]

# checkpoint and replay differ in line style *and* marker, so a single k (one point) still tells them apart
_MEASURED: Final = {"checkpoint": ("-", "o"), "replay": ("--", "s")}
_PROJECTED: Final = {"checkpoint": "x", "replay": "+"}
# with one k, the two rollbacks' points are drawn this far either side of it
_ONE_K_OFFSET: Final = {"checkpoint": -0.08, "replay": 0.08}


@attrs.frozen(kw_only=True)
class Series:
    """One line or set of points of one workload's panel."""

    kind: str  # "measured" | "projected" | "tokens_per_round"
    target: str
    rollback: str
    ks: tuple[int, ...]
    xs: tuple[float, ...]  # where the points are drawn: the ks, offset apart when there is one k
    ys: tuple[float, ...]
    linestyle: str
    marker: str
    label: str


def plot_series(result: Mapping[str, Any]) -> dict[str, list[Series]]:
    """What each workload's panel draws: measured and projected speedup per target and rollback, and
    tokens per round of the first target's checkpoint cells."""
    cells = result["cells"]
    workloads = list(dict.fromkeys(c["workload"] for c in cells))
    targets = list(dict.fromkeys(c["target"] for c in cells))
    out: dict[str, list[Series]] = {}
    for wl in workloads:
        mine = [c for c in cells if c["workload"] == wl]
        one_k = len({c["k"] for c in mine}) == 1
        series: list[Series] = []
        for target in targets:
            for rollback, (style, marker) in _MEASURED.items():
                row = sorted((c for c in mine if c["target"] == target and c["rollback"] == rollback), key=_k)
                if not row:
                    continue
                ks = tuple(c["k"] for c in row)
                xs = tuple(k + (_ONE_K_OFFSET[rollback] * k if one_k else 0.0) for k in ks)
                common = {"target": target, "rollback": rollback, "ks": ks, "xs": xs}
                series.append(
                    Series(
                        kind="measured",
                        ys=tuple(c["speedup"] for c in row),
                        linestyle=style,
                        marker=marker,
                        label=f"{target} {rollback}: measured",
                        **common,
                    )
                )
                series.append(
                    Series(
                        kind="projected",
                        ys=tuple(c["projected_speedup"] for c in row),
                        linestyle="none",
                        marker=_PROJECTED[rollback],
                        label=f"{target} {rollback}: projected (bandwidth-bound)",
                        **common,
                    )
                )
        tpr = sorted((c for c in mine if c["target"] == targets[0] and c["rollback"] == "checkpoint"), key=_k)
        if tpr:
            ks = tuple(c["k"] for c in tpr)
            series.append(
                Series(
                    kind="tokens_per_round",
                    target=targets[0],
                    rollback="checkpoint",
                    ks=ks,
                    xs=tuple(float(k) for k in ks),
                    ys=tuple(c["tokens_per_round"] for c in tpr),
                    linestyle=":",
                    marker="D",
                    label=f"tokens per round ({targets[0]})",
                )
            )
        out[wl] = series
    return out


def _k(cell: Mapping[str, Any]) -> int:
    return int(cell["k"])


def plot_result(result: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a PNG: one panel per workload; measured speedup (solid circles: checkpoint, dashed squares:
    replay) and projected bandwidth-bound speedup (x / +) per target, and tokens per round (grey);
    a workload whose greedy continuation is degenerate (a loop) is shaded and titled so.

    ``result`` is ``BenchResult.to_json()`` (or the JSON file ``--json`` wrote).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display: CI and headless machines
    import matplotlib.pyplot as plt

    cells = result["cells"]
    panels = plot_series(result)
    targets = list(dict.fromkeys(c["target"] for c in cells))
    colours = {t: plt.get_cmap("tab10")(i) for i, t in enumerate(targets)}
    ncols = min(len(panels), 2) or 1
    nrows = (len(panels) + ncols - 1) // ncols or 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 3.9 * nrows), squeeze=False, sharey=True)
    for ax, (wl, series) in zip(axes.flat, panels.items()):
        for s in series:
            grey = s.kind == "tokens_per_round"
            ax.plot(
                s.xs,
                s.ys,
                linestyle=s.linestyle,
                marker=s.marker,
                markersize=4 if grey else (8 if s.kind == "projected" else 6),
                fillstyle="none" if s.rollback == "replay" and s.kind == "measured" else "full",
                color="grey" if grey else colours[s.target],
                label=s.label,
            )
        _decorate(ax, wl, [c for c in cells if c["workload"] == wl])
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.suptitle(_title(result), fontsize=10)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1 + 0.02 * len(targets), 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _decorate(ax: Any, wl: str, mine: list[Mapping[str, Any]]) -> None:
    """A panel's axes, ticks and title (shaded and titled so when its continuation is a loop)."""
    ax.axhline(1.0, color="black", linewidth=0.6)
    loops = [c for c in mine if c.get("degenerate")]
    if loops:
        # a looping greedy continuation: its figures measure the loop (docs/bench.md, degeneracy)
        ax.set_facecolor("#fbe9e7")
        share = min(c["distinct_4gram_share"] for c in loops)
        ax.set_title(f"{wl}: DEGENERATE continuation (distinct 4-grams {share:.3f}), not a headline", fontsize=9)
    else:
        ax.set_title(wl)
    ks_all = sorted({c["k"] for c in mine})
    ax.set_xlabel("draft length k" if len(ks_all) > 1 else f"draft length k (this run measured k={ks_all[0]} only)")
    ax.set_ylabel("speedup over plain greedy (x)")
    ax.set_xticks(ks_all)
    if len(ks_all) > 1 and ks_all[-1] / ks_all[0] >= 4:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks_all, [str(k) for k in ks_all])
    elif len(ks_all) == 1:
        ax.set_xlim(ks_all[0] * 0.75, ks_all[0] * 1.25)
    ax.grid(True, alpha=0.3)


def _title(result: Mapping[str, Any]) -> str:
    cells = result["cells"]
    platform = result.get("platform", {})
    mode = result.get("config", {}).get("mode", "?")
    title = (
        f"specproof bench ({mode}): speedup = median of interleaved greedy/speculative chunk pairs, "
        f"{platform.get('cpus', '?')}-core {platform.get('machine', '')}, Python {platform.get('python', '?')}"
    )
    if cells and max(c["tokens_per_round"] for c in cells) < 1.1:
        title += "\ntokens per round ~ 1: drafts are almost never accepted on these targets, so speculation cannot win"
    return title
