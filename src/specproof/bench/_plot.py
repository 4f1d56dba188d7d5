"""The bench plot: speedup vs k per workload, with tokens per round beside it (matplotlib, Agg)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["plot_result"]

_STYLES = {"checkpoint": "-", "replay": "--"}


def plot_result(result: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a PNG: one panel per workload; measured speedup (solid: checkpoint, dashed: replay)
    and projected bandwidth-bound speedup (markers only) per target, and tokens per round (grey);
    a workload whose greedy continuation is degenerate (a loop) is shaded and titled so.

    ``result`` is ``BenchResult.to_json()`` (or the JSON file ``--json`` wrote).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display: CI and headless machines
    import matplotlib.pyplot as plt

    cells = result["cells"]
    workloads = list(dict.fromkeys(c["workload"] for c in cells))
    targets = list(dict.fromkeys(c["target"] for c in cells))
    colours = {t: plt.get_cmap("tab10")(i) for i, t in enumerate(targets)}
    ncols = min(len(workloads), 2) or 1
    nrows = (len(workloads) + ncols - 1) // ncols or 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 3.9 * nrows), squeeze=False, sharey=True)
    for ax, wl in zip(axes.flat, workloads):
        mine = [c for c in cells if c["workload"] == wl]
        for target in targets:
            for rollback, style in _STYLES.items():
                row = [c for c in mine if c["target"] == target and c["rollback"] == rollback]
                row.sort(key=lambda c: c["k"])
                if not row:
                    continue
                ks = [c["k"] for c in row]
                ax.plot(
                    ks,
                    [c["speedup"] for c in row],
                    style,
                    marker="o",
                    color=colours[target],
                    label=f"{target} {rollback}: measured",
                )
                ax.plot(
                    ks,
                    [c["projected_speedup"] for c in row],
                    linestyle="none",
                    marker="x" if rollback == "checkpoint" else "+",
                    markersize=8,
                    color=colours[target],
                    label=f"{target} {rollback}: projected (bandwidth-bound)",
                )
        tpr = sorted(
            {
                (c["k"], c["tokens_per_round"])
                for c in mine
                if c["target"] == targets[0] and c["rollback"] == "checkpoint"
            }
        )
        if tpr:
            ax.plot(
                [k for k, _ in tpr],
                [v for _, v in tpr],
                ":",
                color="grey",
                marker="s",
                markersize=4,
                label=f"tokens per round ({targets[0]})",
            )
        ax.axhline(1.0, color="black", linewidth=0.6)
        loops = [c for c in mine if c.get("degenerate")]
        if loops:
            # a looping greedy continuation: its figures measure the loop (docs/bench.md, degeneracy)
            ax.set_facecolor("#fbe9e7")
            share = min(c["distinct_4gram_share"] for c in loops)
            ax.set_title(f"{wl}: DEGENERATE continuation (distinct 4-grams {share:.3f}), not a headline", fontsize=9)
        else:
            ax.set_title(wl)
        ax.set_xlabel("draft length k")
        ax.set_ylabel("speedup over plain greedy (x)")
        ks_all = sorted({c["k"] for c in mine})
        ax.set_xticks(ks_all)
        if len(ks_all) > 1 and ks_all[-1] / ks_all[0] >= 4:
            ax.set_xscale("log", base=2)
            ax.set_xticks(ks_all, [str(k) for k in ks_all])
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(workloads) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    platform = result.get("platform", {})
    mode = result.get("config", {}).get("mode", "?")
    title = (
        f"specproof bench ({mode}): speedup = median of interleaved greedy/speculative chunk pairs, "
        f"{platform.get('cpus', '?')}-core {platform.get('machine', '')}, Python {platform.get('python', '?')}"
    )
    if cells and max(c["tokens_per_round"] for c in cells) < 1.1:
        title += "\ntokens per round ~ 1: drafts are almost never accepted on these targets, so speculation cannot win"
    fig.suptitle(title, fontsize=10)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1 + 0.02 * len(targets), 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
