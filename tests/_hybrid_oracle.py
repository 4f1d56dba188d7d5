"""An independent oracle for the packaged byte-level models: their forward pass and their held-out data.

The fixture tests judge two things with it: the package's loader and ``ReferenceHybrid``
(the subject that serves these weights), and the figures in the packaged records
(``fixtures/data/*.json``), which ``scripts/train_fixture.py`` and ``scripts/train_draft.py``
computed with their torch models. To judge either, this module is an independent copy ON
PURPOSE: it imports nothing from ``specproof`` or ``scripts``, reads the npz files itself and
rebuilds the held-out text from the standard library by the split the records state in words.
Written from that description (LFM2-style blocks: gated short conv, GQA attention with
per-head QK RMSNorm and rotate-half RoPE, SwiGLU feed-forward, tied LM head), in float64.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import sysconfig
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

# The records' data.source / data.split, restated: which files the models never trained on.
RECORDED_PYTHON = (3, 11, 7)
SKIPPED_DIRS = frozenset({"__pycache__", "idle_test", "site-packages", "test", "tests"})


def packaged_weights(name: str) -> dict[str, np.ndarray]:
    """The arrays of ``fixtures/data/<name>.npz`` as float64, read without the package's loader."""
    blob = resources.files("specproof.fixtures").joinpath("data", f"{name}.npz")
    with resources.as_file(blob) as path, np.load(path) as data:
        return {k: data[k].astype(np.float64) for k in data.files}


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


class OracleLM:
    """Logits of whole token sequences at once (no cache, no chunking): the plain definition.

    ``dtype`` float64 (default) for comparing logits; float32 halves the time of the held-out
    figures, whose float32 rounding (~1e-6 bits/byte) is far inside their tolerances.
    """

    def __init__(self, cfg: dict[str, Any], weights: dict[str, np.ndarray], dtype: Any = np.float64) -> None:
        self.cfg = cfg
        self.w = {k: v.astype(dtype) for k, v in weights.items()}
        self.dtype = dtype

    def logits(self, tokens: list[int] | np.ndarray) -> np.ndarray:
        """Logits ``[T, vocab]`` of one sequence."""
        return self.batch_logits(np.asarray(tokens, dtype=np.int64)[None])[0]

    def batch_logits(self, tokens: np.ndarray) -> np.ndarray:
        """Logits ``[B, T, vocab]`` of ``B`` sequences of the same length (each on its own)."""
        cfg, w = self.cfg, self.w
        eps = cfg["norm_eps"]
        h = w["model.embed_tokens.weight"][tokens]
        for i, kind in enumerate(cfg["layers"]):
            p = f"model.layers.{i}."
            x = _rms(h, w[p + "operator_norm.weight"], eps)
            h = h + (self._conv(x, p + "conv.") if kind == "conv" else self._attention(x, p + "self_attn."))
            x = _rms(h, w[p + "ffn_norm.weight"], eps)
            gate = x @ w[p + "feed_forward.w1.weight"].T
            silu = gate / (1.0 + np.exp(-gate))
            h = h + (silu * (x @ w[p + "feed_forward.w3.weight"].T)) @ w[p + "feed_forward.w2.weight"].T
        h = _rms(h, w["model.embedding_norm.weight"], eps)
        return h @ w["model.embed_tokens.weight"].T

    def _conv(self, x: np.ndarray, p: str) -> np.ndarray:
        d, t = x.shape[-1], x.shape[1]
        proj = x @ self.w[p + "in_proj.weight"].T
        b, c, v = proj[..., :d], proj[..., d : 2 * d], proj[..., 2 * d :]
        u = b * v
        kernel = self.w[p + "conv.weight"][:, 0, :]  # [d, K]: tap K-1 is the current position
        k = kernel.shape[1]
        padded = np.concatenate([np.zeros((len(x), k - 1, d), dtype=x.dtype), u], axis=1)
        conv = sum(padded[:, j : j + t] * kernel[:, j] for j in range(k))
        return (c * conv) @ self.w[p + "out_proj.weight"].T

    def _attention(self, x: np.ndarray, p: str) -> np.ndarray:
        cfg, w = self.cfg, self.w
        bsz, t = x.shape[:2]
        hd, nh, nkv, eps = cfg["head_dim"], cfg["n_heads"], cfg["n_kv_heads"], cfg["norm_eps"]
        # [B, heads, T, hd]
        q = _rms((x @ w[p + "q_proj.weight"].T).reshape(bsz, t, nh, hd), w[p + "q_layernorm.weight"], eps)
        k = _rms((x @ w[p + "k_proj.weight"].T).reshape(bsz, t, nkv, hd), w[p + "k_layernorm.weight"], eps)
        v = (x @ w[p + "v_proj.weight"].T).reshape(bsz, t, nkv, hd)
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
        freq = cfg["rope_theta"] ** (-np.arange(0, hd, 2) / hd)
        angle = np.arange(t)[:, None] * freq[None, :]  # [T, hd/2]: pair (j, j + hd/2) turns by angle j
        cos, sin = np.cos(angle).astype(self.dtype), np.sin(angle).astype(self.dtype)

        def turn(a: np.ndarray) -> np.ndarray:
            lo, hi = a[..., : hd // 2], a[..., hd // 2 :]
            return np.concatenate([lo * cos - hi * sin, hi * cos + lo * sin], axis=-1)

        q, k = turn(q), turn(k)
        # consecutive query heads share a kv head: head h reads kv head h * n_kv // n_heads
        kv = np.arange(nh) * nkv // nh
        keys, values = k[:, kv].transpose(0, 1, 3, 2), v[:, kv]
        out = np.empty_like(q)
        # causal softmax attention, 256 queries at a time: a block reads only the keys up to its last
        # query (about 5/8 of the work of the full square at 1024 positions)
        for lo in range(0, t, 256):
            hi = min(lo + 256, t)
            s = q[:, :, lo:hi] @ keys[..., :hi] / np.sqrt(hd).astype(self.dtype)
            s += np.triu(np.full((hi - lo, hi), -np.inf, dtype=self.dtype), lo + 1)
            s -= s.max(-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(-1, keepdims=True)
            out[:, :, lo:hi] = s @ values[:, :, :hi]
        return out.transpose(0, 2, 1, 3).reshape(bsz, t, nh * hd) @ w[p + "out_proj.weight"].T

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        ctx = list(prompt)
        for _ in range(n):
            ctx.append(int(np.argmax(self.logits(ctx)[-1])))
        return ctx[len(prompt) :]


def heldout_text(excluded: list[str]) -> tuple[bytes, int]:
    """The held-out text (files joined by a blank line) and its file count, rebuilt from this stdlib.

    The records' split: a ``.py`` file of the standard library (outside ``SKIPPED_DIRS``) is held
    out iff ``int(sha256(relative path), 16) % 10 == 0``; empty files and the ``excluded`` ones
    (the bench's sources) are in neither part; files in sorted path order.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    rels = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS]
        rels += [(Path(dirpath) / f).relative_to(root).as_posix() for f in filenames if f.endswith(".py")]
    parts = []
    for rel in sorted(rels):
        if rel in excluded or int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 10:
            continue
        raw = (root / rel).read_bytes()
        if raw.strip():
            parts.append(raw)
    return b"\n\n".join(parts), len(parts)


def heldout_windows(text: bytes, count: int, window_bytes: int) -> np.ndarray:
    """``count`` windows of ``window_bytes + 1`` bytes spread evenly over ``text`` (one per stride)."""
    stride = len(text) // count
    return np.stack(
        [np.frombuffer(text[i * stride : i * stride + window_bytes + 1], dtype=np.uint8) for i in range(count)]
    ).astype(np.int64)


def same_stdlib() -> bool:
    """Whether this interpreter's standard library is the one the records were measured on."""
    return sys.implementation.name == "cpython" and sys.version_info[:3] == RECORDED_PYTHON


def load_record(name: str) -> dict[str, Any]:
    """``fixtures/data/<name>.json`` read as plain JSON (not through the package's metadata loader)."""
    return json.loads(resources.files("specproof.fixtures").joinpath("data", f"{name}.json").read_text())


# Every 8th of the records' 192 held-out windows (0, 8, 16, ...): 24 windows, fixed in advance
# (not chosen by how close they land), so the figures below are deterministic. A window of 1024
# bytes costs the float32 oracle ~0.2 s (trained) on a quiet core; all 192 would take minutes.
SUBSAMPLE_EVERY = 8


@functools.cache
def heldout_sample() -> np.ndarray:
    """The records' held-out windows (``heldout.windows`` x ``heldout.window_bytes + 1``), every
    ``SUBSAMPLE_EVERY``-th; rebuilt from this interpreter's standard library."""
    meta = load_record("trained")
    text, _ = heldout_text(meta["data"]["excluded_bench_files"])
    held = meta["heldout"]
    return heldout_windows(text, held["windows"], held["window_bytes"])[::SUBSAMPLE_EVERY]


@functools.cache
def scored_sample(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Model ``name`` on ``heldout_sample()``: bits/byte per window and the argmax at every position."""
    lm = OracleLM(load_record(name)["config"], packaged_weights(name), np.float32)
    windows = heldout_sample()
    bits, argmax = [], []
    for i in range(0, len(windows), 4):
        rows = windows[i : i + 4]
        logits = lm.batch_logits(rows[:, :-1]).astype(np.float64)
        top = logits.max(-1, keepdims=True)
        logz = top[..., 0] + np.log(np.exp(logits - top).sum(-1))
        picked = np.take_along_axis(logits, rows[:, 1:, None], axis=-1)[..., 0]
        bits.append((logz - picked).mean(-1) / np.log(2))
        argmax.append(logits.argmax(-1))
    return np.concatenate(bits), np.concatenate(argmax)


def mean_and_error(values: np.ndarray, population: int) -> tuple[float, float]:
    """The sample mean and its standard error (with the finite-population correction: the sample
    is ``len(values)`` of ``population`` windows, drawn without replacement)."""
    n = len(values)
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(n) * np.sqrt(1 - n / population))


# A recorded figure is accepted within this many standard errors of the sample's estimate. The
# sample is fixed, so this is no flake rate but how far off a record may be before it is refused:
# measured, 0.22 bits/byte on trained's held-out figure (a record 25% off is refused), 0.28 on the
# draft's (15% off is refused) and 0.037 on its top-1 agreement with trained (0.05 off is refused);
# tests/fixtures/test_trained_fixture.py and tests/fixtures/test_draft_fixture.py show each refusal.
TOLERANCE_ERRORS = 3.0


def judge_figure(recorded: float, values: np.ndarray, population: int, what: str) -> str | None:
    """None when ``recorded`` is within ``TOLERANCE_ERRORS`` standard errors of ``values``' mean; else why not."""
    mean, error = mean_and_error(values, population)
    if abs(recorded - mean) <= TOLERANCE_ERRORS * error:
        return None
    return (
        f"{what}: the record says {recorded}, recomputed {mean:.4f} +- {error:.4f} "
        f"(a mean over {len(values)} of {population} windows; allowed {TOLERANCE_ERRORS} standard errors)"
    )
