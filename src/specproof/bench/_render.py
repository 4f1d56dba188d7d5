"""A bench result (``BenchResult.to_json()``) as plain text lines, per kind of figure: what
``specproof bench`` prints below its table of cells (``cli_support``). Reads the JSON only, so a
saved result renders as a fresh one does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "batch_lines",
    "degeneracy_label",
    "drafter_table_lines",
    "peer_lines",
    "real_context_lines",
    "sampled_context_lines",
]


def drafter_table_lines(result: Mapping[str, Any]) -> list[str]:
    """The drafter comparison of a bench result (``BenchResult.to_json()``) as plain text lines."""
    cells = result.get("drafter_cells") or []
    if not cells:
        return []
    k = cells[0]["k"]
    lines = [
        f"drafters on {cells[0]['target']}, free-running (k={k}, {cells[0]['rollback']}): tok/round | accepted by "
        "position | draft fwd/round | proposal / target step (wall) | projected (draft bytes counted) | target-only | "
        "lossless | continuation: distinct 4-gram share, final period"
    ]
    for c in cells:
        acc = " ".join(f"{a:.2f}" for a in c["acceptance_by_position"])
        lines.append(
            f"  {c['workload']:<13} {c['drafter']:<24} {c['tokens_per_round']:5.2f} | {acc} | "
            f"{c['draft_forwards_per_round']:4.2f} | {c['proposal_cost']:6.2f}x | {c['projected_speedup']:5.2f}x | "
            f"{c['projected_speedup_target_only']:5.2f}x | {'yes' if c['lossless'] else 'NO'} | "
            f"{degeneracy_label(c)}"
        )
    for skipped in result.get("drafters_skipped") or []:
        lines.append(f"  drafter {skipped['drafter']} not compared: {skipped['reason']}")
    return lines


def degeneracy_label(cell: Mapping[str, Any]) -> str:
    """``0.14 p11 DEGENERATE`` (distinct 4-gram share, final period) for a cell with those figures, else ``-``."""
    if "distinct_4gram_share" not in cell:
        return "-"
    period = cell.get("final_period")
    text = f"{cell['distinct_4gram_share']:.3f} p{period if period else '-'}"
    return text + (" DEGENERATE" if cell.get("degenerate") else "")


def real_context_lines(result: Mapping[str, Any]) -> list[str]:
    """The real-context (teacher-forced) acceptance of a bench result as plain text lines."""
    real = result.get("real_contexts") or {}
    if real.get("status") == "skip":
        return [f"real contexts: not measured ({real.get('reason')})"]
    cells = real.get("cells") or []
    if not cells:
        return []
    sources = ", ".join(t["source"] for t in real.get("texts", []))
    lines = [
        f"drafters on {cells[0]['target']}, real contexts (teacher-forced, k={cells[0]['k']}, "
        f"{real.get('positions')} positions of {sources}): expected tok/round | accepted by position | per text"
    ]
    for c in cells:
        acc = " ".join(f"{a:.2f}" for a in c["acceptance_by_position"])
        per_text = " ".join(f"{t:.2f}" for t in c.get("tokens_per_round_by_text", []))
        lines.append(f"  {c['drafter']:<24} {c['tokens_per_round']:5.2f} | {acc} | {per_text}")
    return lines + sampled_context_lines(result)


def sampled_context_lines(result: Mapping[str, Any]) -> list[str]:
    """The sampled real-context figures beside greedy's, as plain text lines (none when not measured)."""
    real = result.get("real_contexts") or {}
    sampled = real.get("sampled") or {}
    cells = sampled.get("cells") or []
    if not cells:
        return []
    greedy = {c["drafter"]: c for c in real.get("cells") or []}
    temps = [float(t) for t in sampled.get("temperatures", [])]
    by = {(c["drafter"], float(c["temperature"])): c for c in cells}
    lines = [
        f"drafters on {cells[0]['target']}, real contexts sampled ({sampled.get('scheme')} sampling, "
        f"k={cells[0]['k']}, {sampled.get('seeds')} seeds x {cells[0]['positions']} positions per temperature): "
        "tok/round (accepted at position 1) at greedy | " + " | ".join(f"T={t:g}" for t in temps) + " | drafter q"
    ]
    for name in dict.fromkeys(c["drafter"] for c in cells):
        parts = []
        g = greedy.get(name)
        parts.append(f"{g['tokens_per_round']:5.2f} ({_first(g):.2f})" if g else "    -       ")
        for t in temps:
            c = by.get((name, t))
            parts.append(f"{c['tokens_per_round']:5.2f} ({_first(c):.2f})" if c else "    -       ")
        q = next(c["q"] for c in cells if c["drafter"] == name)
        lines.append(f"  {name:<24} " + " | ".join(parts) + f" | {q}")
    return lines


def _first(cell: Mapping[str, Any]) -> float:
    acc = cell.get("acceptance_by_position") or [0.0]
    return float(acc[0])


def peer_lines(result: Mapping[str, Any]) -> list[str]:
    """The peer comparison of a bench result as plain text lines (median, spread, pairs, load)."""
    out = []
    for peer in result.get("peers") or []:
        if peer.get("status") != "ok":
            out.append(f"peer {peer.get('peer')}: {peer.get('status')} - {peer.get('reason')}")
            continue
        out.append(
            f"peer {peer['peer']} on {peer['target']}: specproof/peer tokens/s median "
            f"{peer['tokens_per_second_ratio']:.2f}x "
            f"(min {peer['ratio_min']:.2f}, max {peer['ratio_max']:.2f}, spread {peer['ratio_spread']:.0%}) over "
            f"{peer['pairs']} alternating pairs of {peer['tokens']} tokens after a warm-up, torch threads "
            f"{peer.get('torch_threads')}, load {peer['load_before']:.2f} -> {peer['load_after']:.2f}; forwards after "
            f"prefill: specproof {peer.get('specproof_forwards')}, peer {peer.get('peer_forwards')}; "
            f"outputs equal: {'yes' if peer['outputs_equal'] else 'NO'}"
            + (f"; mlx-lm speculative decoding: {peer['mlx_speculative']}" if peer.get("mlx_speculative") else "")
        )
    return out


def batch_lines(result: Mapping[str, Any]) -> list[str]:
    """The batched reference decoder beside the single-request engine, one line per batch size."""
    batches = result.get("batches") or {}
    if batches.get("status") == "skip":
        return [f"batches: not measured ({batches.get('reason')})"]
    cells = batches.get("cells") or []
    if not cells:
        return []
    lines = [
        f"batches on {batches['target']} (BatchSpecDecoder, k={batches['k']}, {batches['rollback']}, "
        f"{batches['tokens']} tokens a request; the single engine in brackets): tok/round | verify fwd/token | "
        "tok/s wall | tok/s CPU | throughput ratio | lossless"
    ]
    for c in cells:
        single = c["single"]
        lines.append(
            f"  batch {c['batch']:<3} {c['tokens_per_round']:5.2f} ({single['tokens_per_round']:5.2f}) | "
            f"{c['forwards_per_token']:5.3f} ({single['forwards_per_token']:5.3f}) | "
            f"{c['tokens_per_second']:7.1f} ({single['tokens_per_second']:7.1f}) | "
            f"{c['cpu_tokens_per_second']:7.1f} ({single['cpu_tokens_per_second']:7.1f}) | "
            f"{c['throughput_ratio']:4.2f}x | {'yes' if c['lossless'] else 'NO'}"
        )
    return lines


def tree_lines(result: Mapping[str, Any]) -> list[str]:
    """Token trees beside chains (``--trees``): per drafter and shape, real-context tokens per round against the
    physical limit, and decoding's tokens per round and CPU speedup against plain greedy."""
    trees = result.get("trees") or {}
    if trees.get("status") == "skip":
        return [f"trees: not measured ({trees.get('reason')})"]
    if not trees:
        return []
    real = {(c["drafter"], c["shape"]): c for c in (trees.get("real_contexts") or {}).get("cells", [])}
    decoding = trees.get("decoding") or {}
    lines = [
        f"trees on {trees['target']} (depth <= {trees['depth']}; real contexts teacher-forced | "
        f"decoding {decoding.get('tokens')} tokens a workload): shape | nodes | tok/round real (limit) | "
        "tok/round decoding | CPU speedup | lossless"
    ]
    for c in decoding.get("cells", []):
        r = real.get((c["drafter"], c["shape"]))
        real_text = f"{r['nodes_per_round']:5.1f} | {r['tokens_per_round']:4.2f} ({r['limit']})" if r else "    - | -"
        lines.append(
            f"  {c['drafter']:<20} {c['shape']:<10} {real_text} | {c['tokens_per_round']:4.2f} | "
            f"{c['cpu_speedup']:4.2f}x | {'yes' if c['lossless'] else 'NO'}"
        )
    return [*lines, *_sampled_tree_lines(trees.get("sampled") or {})]


def _sampled_tree_lines(sampled: Mapping[str, Any]) -> list[str]:
    """``trees.sampled``: the same variants at T = 0.7, real-context tokens per round and acceptance by depth,
    decoding's tokens per round and CPU speedup against plain sampling."""
    if sampled.get("status") != "ok":
        return [f"  sampled trees: not measured ({sampled.get('reason')})"] if sampled else []
    real = {(c["drafter"], c["shape"]): c for c in (sampled.get("real_contexts") or {}).get("cells", [])}
    lines = [
        f"  sampled at T = {sampled['temperature']:g}: shape | nodes | tok/round real (limit) | acceptance by depth "
        "| tok/round decoding | CPU speedup vs plain sampling"
    ]
    for c in (sampled.get("decoding") or {}).get("cells", []):
        r = real.get((c["drafter"], c["shape"]))
        depths = " ".join(f"{a:.2f}" for a in r["acceptance_by_depth"]) if r else "-"
        real_text = f"{r['nodes_per_round']:5.1f} | {r['tokens_per_round']:4.2f} ({r['limit']})" if r else "    - | -"
        lines.append(
            f"  {c['drafter']:<20} {c['shape']:<10} {real_text} | {depths} | {c['tokens_per_round']:4.2f} | "
            f"{c['cpu_speedup']:4.2f}x"
        )
    return lines
