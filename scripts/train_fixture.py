#!/usr/bin/env python3
"""Train the ``trained`` fixture: a small byte-level LFM2-style hybrid on CPython's standard library.

The torch model below computes exactly the function of ``ReferenceHybrid`` (conv and
attention blocks; no ``gdn`` block, so the weights are a plain ``Lfm2ForCausalLM`` and
also load into the MLX and transformers LFM2 targets). Its ``state_dict`` names are the
reference's (Hugging Face LFM2) names, so export is a dtype cast.

Data: the ``.py`` files of the running interpreter's standard library
(``sysconfig.get_paths()["stdlib"]``, test suites and site-packages excluded), split
by file with a hash of the relative path (1 in 10 held out). Half of the training
windows are plain text; the other half are input-grounded examples built from the
training files (a function then a "rewritten" copy of it, a docstring then a quote
from it, JSON records of one schema, a passage repeated), so that the attention
layers learn to copy from the context.

Subcommands (all CPU, reproducible given the same seed, step count and thread count):

- ``train``   train, export ``trained.npz`` + ``trained.json``, check torch == numpy;
- ``check``   re-run the torch-vs-reference comparison on the exported weights;
- ``measure`` held-out-grounded prompts: n-gram drafter tokens per round at k=4, greedy samples.

Examples::

    python scripts/train_fixture.py train --budget-minutes 2.5 --steps 100000 --out /tmp/pilot   # pilot
    python scripts/train_fixture.py train --budget-minutes 24 --steps 2400
    python scripts/train_fixture.py measure
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import random
import re
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# OpenMP's default (busy-waiting) wait policy is kept on purpose: on a quiet 2-core machine a
# PASSIVE policy made a training step 2.8x slower (446 vs 161 ms at 8 x 512 bytes). When other jobs
# share the cores, busy-waiting threads stall each other instead; set OMP_WAIT_POLICY=PASSIVE then.

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:  # pragma: no cover - the script needs torch; the fixture loader does not
    sys.exit("scripts/train_fixture.py needs torch: pip install 'torch==2.13.0' (a CPU wheel)")

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = REPO / "src" / "specproof" / "fixtures" / "data"
MAX_NPZ_BYTES = 8 * 1024 * 1024
EXCLUDED_DIRS = frozenset({"site-packages", "__pycache__", "test", "tests", "idle_test"})
HELDOUT_MODULUS = 10  # a file is held out when sha256(relative path) % 10 == 0
QK_NORM_INIT = 1.5
# Grounded kinds and their weights: "repeat" (a passage, a gap, the passage again) is the
# purest copying signal, which a plain LM objective on ~5 MB of text did not teach (first run).
GROUNDED_KINDS = (("edit", 0.25), ("quote", 0.2), ("json", 0.2), ("repeat", 0.35))
# The copy curriculum (second run): the grounded kinds above did not make the model copy within
# 1.2K steps at 1024 bytes (a passage repeated scored the same loss on both copies). Windows packed
# with "string, separator, the same string", the second copy's loss weighted up, teach an
# induction head directly; half the strings are random bytes, which nothing but copying predicts.
COPY_ALPHABET = (*range(32, 127), 10)
COPY_SEPARATORS = (b"\n\n", b" | ", b"\n---\n", b"\n# again:\n", b' => "', b"\n>>> ")
COPY_RANDOM_FRACTION = 0.5

# The fixture's architecture. Three conv blocks each feed an attention block: the short
# conv mixes the previous tokens into each position, so one attention layer can match
# "the last two bytes" against earlier positions and copy what followed (an induction head).
MODEL_CONFIG: dict[str, Any] = {
    "vocab_size": 256,
    "d_model": 96,
    "layers": ["conv", "attn", "conv", "attn", "conv", "attn"],
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 24,
    "ffn_dim": 256,
    "conv_kernel": 3,
    "rope_theta": 10000.0,
    "norm_eps": 1e-5,
    "max_context": 4096,
    "tie_embeddings": True,
}


# --------------------------------------------------------------------------- determinism


def seed_everything(seed: int, threads: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


# --------------------------------------------------------------------------- the model (mirrors reference.py)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # reference: x / sqrt(mean(x^2) + eps) * weight, in float32
        x32 = x.float()
        return (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


class ShortConv(nn.Module):
    """LFM2 gated short conv: ``B, C, x = in_proj(h)``; ``out_proj(C * causal_depthwise_conv(B * x))``."""

    def __init__(self, d: int, kernel: int) -> None:
        super().__init__()
        self.in_proj = nn.Linear(d, 3 * d, bias=False)
        self.conv = nn.Conv1d(d, d, kernel, groups=d, bias=False, padding=kernel - 1)
        self.out_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        b, c, xx = self.in_proj(x).chunk(3, dim=-1)
        bx = (b * xx).transpose(1, 2)  # [B, d, T]
        conv = self.conv(bx)[..., :t].transpose(1, 2)  # causal: out_t = sum_l w[l] x_{t-L+1+l}
        return self.out_proj(c * conv)


def rope_tables(max_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    angles = np.arange(max_len, dtype=np.float64)[:, None] * inv_freq[None, :]
    emb = np.concatenate((angles, angles), axis=-1)
    # computed in float64 and stored in float32, exactly as the reference does
    return torch.from_numpy(np.cos(emb).astype(np.float32)), torch.from_numpy(np.sin(emb).astype(np.float32))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """GQA, per-head QK RMSNorm, then rotate-half RoPE; causal softmax attention, scale 1/sqrt(head_dim)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        d, hd = cfg["d_model"], cfg["head_dim"]
        self.n_heads, self.n_kv, self.hd = cfg["n_heads"], cfg["n_kv_heads"], hd
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=False)
        self.out_proj = nn.Linear(self.n_heads * hd, d, bias=False)
        self.q_layernorm = RMSNorm(hd, cfg["norm_eps"])
        self.k_layernorm = RMSNorm(hd, cfg["norm_eps"])

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, t, _ = x.shape
        q = self.q_layernorm(self.q_proj(x).view(bsz, t, self.n_heads, self.hd)).transpose(1, 2)
        k = self.k_layernorm(self.k_proj(x).view(bsz, t, self.n_kv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(bsz, t, self.n_kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.n_heads // self.n_kv
        # query head h reads kv head h // group, as the reference's reshape(n_kv, group, hd)
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(self.hd))
        return self.out_proj(o.transpose(1, 2).reshape(bsz, t, self.n_heads * self.hd))


class FeedForward(nn.Module):
    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d, f, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, kind: str, cfg: dict[str, Any]) -> None:
        super().__init__()
        d = cfg["d_model"]
        self.kind = kind
        self.operator_norm = RMSNorm(d, cfg["norm_eps"])
        if kind == "conv":
            self.conv = ShortConv(d, cfg["conv_kernel"])
        elif kind == "attn":
            self.self_attn = Attention(cfg)
        else:
            raise ValueError(f"train_fixture: block kind {kind!r} is not supported here (conv, attn)")
        self.ffn_norm = RMSNorm(d, cfg["norm_eps"])
        self.feed_forward = FeedForward(d, cfg["ffn_dim"])

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = self.operator_norm(h)
        h = h + (self.conv(x) if self.kind == "conv" else self.self_attn(x, cos, sin))
        return h + self.feed_forward(self.ffn_norm(h))


class Inner(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["d_model"])
        self.layers = nn.ModuleList(Block(kind, cfg) for kind in cfg["layers"])
        self.embedding_norm = RMSNorm(cfg["d_model"], cfg["norm_eps"])


class HybridLM(nn.Module):
    """``Lfm2ForCausalLM``-shaped: ``state_dict()`` keys are exactly ``ReferenceHybrid.weights`` keys."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        cos, sin = rope_tables(cfg["max_context"], cfg["head_dim"], cfg["rope_theta"])
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            h = layer(h, cos, sin)
        h = self.model.embedding_norm(h)
        return h @ self.model.embed_tokens.weight.T  # tied head

    def init_weights(self) -> None:
        n = len(self.cfg["layers"])
        for name, p in self.named_parameters():
            if name.endswith(("q_layernorm.weight", "k_layernorm.weight")):
                # QK-norm caps attention logits at sqrt(head_dim) * |w_q| * |w_k|; starting the gains
                # above 1 lets a copying head sharpen over a 1K context without first growing them
                nn.init.constant_(p, QK_NORM_INIT)
            elif name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith("conv.conv.weight"):
                nn.init.normal_(p, std=1.0 / math.sqrt(p.shape[-1]))
            elif name.endswith(("out_proj.weight", "w2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n))  # residual branches start small
            else:
                nn.init.normal_(p, std=0.02)


# --------------------------------------------------------------------------- data


@dataclass
class Corpus:
    train_files: list[str]
    heldout_files: list[str]
    bench_files: list[str]  # read by specproof bench's workloads: neither trained on nor in the held-out loss
    train_text: bytes
    heldout_text: bytes
    functions: list[tuple[str, str, int, list[str], str | None, str]]  # module, name, line, args, doc1, source
    docstrings: list[str]
    file_texts: dict[str, bytes]


def is_heldout(relpath: str) -> bool:
    return int(hashlib.sha256(relpath.encode()).hexdigest(), 16) % HELDOUT_MODULUS == 0


def bench_source_files(root: Path) -> frozenset[str]:
    """The files ``specproof bench``'s workloads read (relative to ``root``): kept out of training, so a
    workload's acceptance on the fixture measures copying from the prompt, not recall of a trained file."""
    from specproof.bench._workloads import SOURCE_MODULES

    out: set[str] = set()
    for module in SOURCE_MODULES:
        path = Path(module.__file__ or "").resolve()
        if path.is_relative_to(root.resolve()):
            out.add(path.relative_to(root.resolve()).as_posix())
    return frozenset(out)


def stdlib_files(root: Path) -> list[str]:
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                out.append(Path(dirpath, name).relative_to(root).as_posix())
    return sorted(out)


def _extract(relpath: str, text: str, corpus: Corpus) -> None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return
    lines = text.splitlines(keepends=True)
    module = relpath[:-3].replace("/", ".").removesuffix(".__init__")
    mod_doc = ast.get_docstring(tree)
    if mod_doc and len(mod_doc) >= 150:
        corpus.docstrings.append(mod_doc)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 150:
                corpus.docstrings.append(doc)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
            start = node.lineno - 1 - len(node.decorator_list)
            src = "".join(lines[start : node.end_lineno])
            args = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
            doc1 = doc.splitlines()[0] if (doc := ast.get_docstring(node)) else None
            corpus.functions.append((module, node.name, node.lineno, args, doc1, src))


def load_corpus(root: Path) -> Corpus:
    files = stdlib_files(root)
    bench = bench_source_files(root)
    corpus = Corpus([], [], [], b"", b"", [], [], {})
    train_parts: list[bytes] = []
    held_parts: list[bytes] = []
    for rel in files:
        raw = (root / rel).read_bytes()
        if not raw.strip():
            continue
        if rel in bench:
            corpus.bench_files.append(rel)
        elif is_heldout(rel):
            corpus.heldout_files.append(rel)
            held_parts.append(raw)
        else:
            corpus.train_files.append(rel)
            train_parts.append(raw)
            corpus.file_texts[rel] = raw
            _extract(rel, raw.decode("utf-8", errors="replace"), corpus)
    corpus.train_text = b"\n\n".join(train_parts)
    corpus.heldout_text = b"\n\n".join(held_parts)
    return corpus


EDIT_HEADERS = (
    "\n\n# Rewrite the function {name} above, keeping its behaviour:\n",
    "\n\n# Refactored version of {name}:\n",
    "\n\n# The same function, cleaned up:\n",
    "\n\n# Edited copy of {name}:\n",
)
QUOTE_HEADERS = (
    '\n\nQuote the passage above:\n"',
    '\n\nAs the documentation puts it, "',
    "\n\nRelevant excerpt:\n> ",
    '\n\nQ: What does the text say?\nA: It says "',
)
NEW_NAMES = ("value", "item", "result", "data", "obj", "arg", "name", "key", "text", "node")


def _edit_function(src: str, args: list[str], rng: random.Random) -> str:
    roll = rng.random()
    candidates = [a for a in args if a not in ("self", "cls") and len(a) > 1]
    if roll < 0.45 and candidates:
        old = rng.choice(candidates)
        new = rng.choice([n for n in NEW_NAMES if n != old and not re.search(rf"\b{n}\b", src)] or [old + "_"])
        return re.sub(rf"\b{re.escape(old)}\b", new, src)
    if roll < 0.7:
        lines = src.splitlines(keepends=True)
        for i, line in enumerate(lines):
            if line.rstrip().endswith(":") and i + 1 < len(lines):
                indent = re.match(r"\s*", lines[i + 1]).group(0)  # type: ignore[union-attr]
                lines.insert(i + 1, f"{indent}# {rng.choice(('TODO: simplify', 'rewritten', 'unchanged logic'))}\n")
                return "".join(lines)
    return src


class Sampler:
    """Deterministic windows of ``seq_len + 1`` bytes: plain stdlib text or an input-grounded example."""

    def __init__(
        self, corpus: Corpus, seq_len: int, seed: int, grounded_fraction: float,
        copy_fraction: float = 0.0, copy_weight: float = 1.0,
    ) -> None:
        self.c = corpus
        self.n = seq_len + 1
        self.rng = random.Random(seed)
        self.grounded_fraction = grounded_fraction
        self.copy_fraction = copy_fraction
        self.copy_weight = copy_weight
        longest = (self.n - 80) // 2
        # short windows (256 bytes) take short functions and docstrings cut to fit
        self.functions = [f for f in corpus.functions if min(100, longest // 2) <= len(f[5].encode()) <= longest]
        doc_limit = self.n - 120
        self.docstrings = [d if len(d.encode()) <= doc_limit else d[:doc_limit].encode()[:doc_limit].decode(
            "utf-8", errors="ignore") for d in corpus.docstrings]
        if not self.functions or not self.docstrings:
            raise SystemExit(f"train_fixture: --seq-len {seq_len} leaves no functions or docstrings that fit")
        self.kinds = tuple(kind for kind, _ in GROUNDED_KINDS)
        self.weights = tuple(weight for _, weight in GROUNDED_KINDS)

    def _plain(self, length: int) -> bytes:
        text = self.c.train_text
        start = self.rng.randrange(0, len(text) - length)
        return text[start : start + length]

    def _grounded(self) -> bytes:
        """Grounded examples joined by blank lines until the window is full, cut on the left."""
        parts: list[bytes] = []
        total = -2  # k parts are joined by k - 1 separators
        while total < self.n:
            kind = self.rng.choices(self.kinds, self.weights)[0]
            parts.append(getattr(self, "_" + kind)())
            total += len(parts[-1]) + 2
        window = b"\n\n".join(parts)[-self.n :]
        assert len(window) == self.n, (len(window), self.n)
        return window

    def _edit(self) -> bytes:
        _, name, _, args, _, src = self.rng.choice(self.functions)
        header = self.rng.choice(EDIT_HEADERS).format(name=name)
        return (src.rstrip("\n") + header + _edit_function(src, args, self.rng)).encode()

    def _quote(self) -> bytes:
        doc = self.rng.choice(self.docstrings)
        starts = [0] + [m.end() for m in re.finditer(r"[.:]\s+", doc)]
        s = self.rng.choice(starts[:-1] if len(starts) > 1 else starts)
        span = doc[s : s + self.rng.randint(40, 300)]
        header = self.rng.choice(QUOTE_HEADERS)
        close = "" if header.endswith("> ") else '"'
        return (doc + header + span + close).encode()

    def _json(self) -> bytes:
        start = self.rng.randrange(0, len(self.c.functions) - 12)
        rows = self.c.functions[start : start + self.rng.randint(4, 12)]
        lines = [
            json.dumps({"module": m, "name": n, "line": ln, "args": a, "doc": d}, ensure_ascii=False)
            for m, n, ln, a, d, _ in rows
        ]
        return ("Records (JSON lines):\n" + "\n".join(lines) + "\n").encode()

    def _repeat(self) -> bytes:
        a = self._plain(self.rng.randint(48, 360))
        gap = self._plain(self.rng.randint(0, 200))
        cut = self.rng.randint(24, len(a))
        return a + b"\n" + gap + b"\n" + a[:cut]

    def _copy_pair(self) -> tuple[bytes, bytes, bytes, float]:
        """(first copy, separator, second copy, weight of the first copy's bytes) for the copy curriculum."""
        half = max(16, (self.n - 16) // 2)
        # skewed to short strings: more copies per window and short copy distances first
        length = self.rng.randint(8, self.rng.randint(16, half))
        if self.rng.random() < COPY_RANDOM_FRACTION:
            # random bytes cannot be predicted from anything but the earlier copy: the gradient that
            # builds an induction head; the first copy is noise, so it carries no loss
            first = bytes(self.rng.choice(COPY_ALPHABET) for _ in range(length))
            first_weight = 0.0
        else:
            first = self._plain(length)
            first_weight = 1.0
        return first, self.rng.choice(COPY_SEPARATORS), first, first_weight

    def _copy(self) -> tuple[bytes, np.ndarray]:
        """A window packed with (string, separator, the same string) examples, cut on the left.

        The returned weights are per byte: the loss weight of predicting that byte.
        """
        parts: list[bytes] = []
        weights: list[np.ndarray] = []
        total = 0
        while total < self.n:
            first, sep, second, w_first = self._copy_pair()
            for piece, w in ((first, w_first), (sep, 1.0), (second, self.copy_weight), (b"\n\n", 1.0)):
                parts.append(piece)
                weights.append(np.full(len(piece), w, dtype=np.float32))
                total += len(piece)
        window = b"".join(parts)[-self.n :]
        return window, np.concatenate(weights)[-self.n :]

    def sample(self) -> tuple[bytes, np.ndarray]:
        if self.rng.random() < self.copy_fraction:
            return self._copy()
        if self.rng.random() >= self.grounded_fraction:
            window = self._plain(self.n)
        else:
            window = self._grounded()
        return window, np.ones(self.n, dtype=np.float32)

    def batch(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``size`` windows and the loss weights of their targets (``[size, seq_len]``)."""
        samples = [self.sample() for _ in range(size)]
        rows = np.stack([np.frombuffer(w, dtype=np.uint8) for w, _ in samples]).astype(np.int64)
        weights = np.stack([wt[1:] for _, wt in samples])
        return torch.from_numpy(rows), torch.from_numpy(weights)


def heldout_windows(corpus: Corpus, seq_len: int, max_bytes: int) -> torch.Tensor:
    """Non-overlapping ``seq_len + 1`` windows, evenly spread over the held-out text."""
    text = corpus.heldout_text
    n = seq_len + 1
    count = min(max_bytes // seq_len, len(text) // n)
    stride = len(text) // count
    rows = [np.frombuffer(text[i * stride : i * stride + n], dtype=np.uint8) for i in range(count)]
    return torch.from_numpy(np.stack(rows).astype(np.int64))


@torch.no_grad()
def bits_per_byte(model: HybridLM, windows: torch.Tensor, batch: int = 16) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i : i + batch]
        logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), w[:, 1:].reshape(-1), reduction="sum")
        total += float(loss)
        count += w[:, 1:].numel()
    model.train()
    return total / count / math.log(2)


COPY_PASSAGE_BYTES = 120
COPY_GREEDY_PREFIX = 20
COPY_GREEDY_BYTES = 40


def heldout_passages(corpus: Corpus, count: int = 24, length: int = COPY_PASSAGE_BYTES) -> list[bytes]:
    """``count`` held-out passages of ``length`` bytes, each starting at a line start, evenly spread."""
    text = corpus.heldout_text
    out: list[bytes] = []
    for i in range(count):
        start = text.find(b"\n", i * (len(text) // count)) + 1
        while start < len(text) and text[start : start + 1] in (b"\n", b" "):
            start += 1  # skip blank lines and indentation so the passage starts with content
        passage = text[start : start + length]
        if len(passage) == length:
            out.append(passage)
    return out


def copy_prompt(passage: bytes) -> bytes:
    return passage + b"\n\n" + passage


@torch.no_grad()
def copy_scores(model: HybridLM, passages: list[bytes]) -> dict[str, Any]:
    """Bits/byte on the first and on the second copy of ``passage + blank line + passage`` (each copy's
    first byte excluded), and greedy bytes right out of 40 after ``passage + blank line + passage[:20]``."""
    model.eval()
    first = second = 0.0
    count = 0
    right = 0
    for p in passages:
        seq = torch.tensor([list(copy_prompt(p))])
        logp = F.log_softmax(model(seq[:, :-1])[0].float(), dim=-1)
        nll = -logp.gather(1, seq[0, 1:, None])[:, 0]  # nll[i] predicts byte i + 1
        n, off = len(p), len(p) + 2
        first += float(nll[0 : n - 1].sum())
        second += float(nll[off : off + n - 1].sum())
        count += n - 1
        ctx = list(p + b"\n\n" + p[:COPY_GREEDY_PREFIX])
        for _ in range(COPY_GREEDY_BYTES):
            ctx.append(int(model(torch.tensor([ctx]))[0, -1].argmax()))
        got = ctx[-COPY_GREEDY_BYTES:]
        right += sum(a == b for a, b in zip(got, p[COPY_GREEDY_PREFIX : COPY_GREEDY_PREFIX + COPY_GREEDY_BYTES]))
    model.train()
    f, s = first / count / math.log(2), second / count / math.log(2)
    return {"passages": len(passages), "passage_bytes": len(passages[0]) if passages else 0,
            "first_bpb": round(f, 4), "second_bpb": round(s, 4), "ratio": round(s / f, 4),
            "greedy_bytes_right": round(right / max(len(passages), 1), 2), "greedy_bytes": COPY_GREEDY_BYTES}


def copying(args: argparse.Namespace) -> None:
    seed_everything(args.seed, args.threads)
    out = Path(args.out)
    cfg = json.loads((out / "trained.json").read_text())["config"]
    corpus = load_corpus(Path(sysconfig.get_paths()["stdlib"]))
    model = torch_from_npz(cfg, out / "trained.npz")
    passages = heldout_passages(corpus)
    print(json.dumps(copy_scores(model, passages)))
    for p in passages[:2]:
        ctx = list(p + b"\n\n" + p[:COPY_GREEDY_PREFIX])
        with torch.no_grad():
            for _ in range(COPY_GREEDY_BYTES):
                ctx.append(int(model(torch.tensor([ctx]))[0, -1].argmax()))
        print(f"passage {p[COPY_GREEDY_PREFIX:COPY_GREEDY_PREFIX + COPY_GREEDY_BYTES]!r}\n"
              f"greedy  {bytes(ctx[-COPY_GREEDY_BYTES:])!r}")


# --------------------------------------------------------------------------- export and checks


def reference_config(cfg: dict[str, Any]) -> Any:
    from specproof.engine.targets.reference import ReferenceConfig

    return ReferenceConfig(**{**cfg, "layers": tuple(cfg["layers"])})


def export_weights(model: HybridLM, path: Path) -> str:
    """Write the state dict as float32 if it fits in 8 MB, else float16; returns the dtype used."""
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    for dtype in ("float32", "float16"):
        np.savez_compressed(path, **{k: v.astype(dtype) for k, v in state.items()})
        if path.stat().st_size <= MAX_NPZ_BYTES:
            return dtype
    raise SystemExit(f"train_fixture: {path} is {path.stat().st_size} bytes even in float16 (limit {MAX_NPZ_BYTES})")


def torch_from_npz(cfg: dict[str, Any], path: Path) -> HybridLM:
    model = HybridLM(cfg)
    with np.load(path) as data:
        model.load_state_dict({k: torch.from_numpy(data[k].astype(np.float32)) for k in data.files})
    return model.eval()


@torch.no_grad()
def compare_with_reference(cfg: dict[str, Any], npz: Path, prompts: list[bytes], greedy_tokens: int) -> dict[str, Any]:
    """Torch (float32) vs ``ReferenceHybrid`` on the exported weights: logits and greedy continuations."""
    from specproof.engine import ReferenceHybrid, greedy_decode

    model = torch_from_npz(cfg, npz)
    with np.load(npz) as data:
        target = ReferenceHybrid(reference_config(cfg), weights={k: data[k] for k in data.files})
    max_diff = 0.0
    same_greedy = True
    for p in prompts:
        toks = list(p)
        target.reset()
        ref = target.forward(toks)
        ours = model(torch.tensor([toks]))[0].numpy()
        max_diff = max(max_diff, float(np.abs(ref - ours).max()))
        ref_gen = greedy_decode(target, toks, greedy_tokens).tokens
        ctx = list(toks)
        for _ in range(greedy_tokens):
            ctx.append(int(model(torch.tensor([ctx]))[0, -1].argmax()))
        same_greedy &= ctx[len(toks) :] == list(ref_gen)
    return {"prompts": len(prompts), "max_abs_logit_diff": max_diff, "same_greedy": same_greedy,
            "greedy_tokens": greedy_tokens}


PROBE_PROMPTS = (b"def add(a, b):\n    return", b'import os\n\n\ndef main():\n    """', b"The quick brown fox")


@torch.no_grad()
def probe(cfg: dict[str, Any], npz: Path) -> list[dict[str, Any]]:
    """Torch's last-position logits on a few fixed prompts, for a torch-free regression test of the loader."""
    model = torch_from_npz(cfg, npz)
    out = []
    for p in PROBE_PROMPTS:
        row = model(torch.tensor([list(p)]))[0, -1].numpy().astype(np.float64)
        out.append({"prompt": p.decode(), "argmax": int(row.argmax()), "logits": [round(float(x), 5) for x in row]})
    return out


# --------------------------------------------------------------------------- train


def lr_at(progress: float, step: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))))


def train(args: argparse.Namespace) -> None:
    t_start = time.monotonic()
    script_sha256 = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    seed_everything(args.seed, args.threads)
    root = Path(sysconfig.get_paths()["stdlib"])
    corpus = load_corpus(root)
    sampler = Sampler(corpus, args.seq_len, args.seed, args.grounded_fraction, args.copy_fraction, args.copy_weight)
    # Sequence-length warm-up (--seq-schedule): the first steps see shorter windows, more of them (the same
    # bytes per step). The copy (induction) transition came at step ~2200 with 256-byte windows but ~3800
    # with 512; the windows must still reach the bench prompts' length (~800 bytes) by the end.
    stages: list[tuple[int, Sampler]] = []  # (last step of the stage + 1, sampler), in order
    first_step = 0
    for i, (length, fraction) in enumerate(args.seq_schedule):
        first_step += int(fraction * args.steps)
        stages.append((first_step, Sampler(corpus, length, args.seed + 1 + i, args.grounded_fraction,
                                           args.copy_fraction, args.copy_weight)))
    held = heldout_windows(corpus, args.seq_len, args.eval_bytes)
    quick_held = held[:: max(1, held.shape[0] // 16)][:16]
    copy_passages = heldout_passages(corpus)
    print(
        f"data: {len(corpus.train_files)} train files ({len(corpus.train_text):,} bytes), "
        f"{len(corpus.heldout_files)} held-out ({len(corpus.heldout_text):,} bytes); "
        f"{len(sampler.functions)} functions, {len(sampler.docstrings)} docstrings; "
        f"setup {time.monotonic() - t_start:.1f}s",
        flush=True,
    )
    cfg = dict(MODEL_CONFIG)
    cfg["layers"] = list(args.layers)
    cfg["conv_kernel"] = args.conv_kernel
    model = HybridLM(cfg)
    model.init_weights()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95),
    )
    budget_s = args.budget_minutes * 60.0
    print(f"model: {n_params:,} params; {args.steps} steps x {args.batch_size} x {args.seq_len}; "
          f"budget {args.budget_minutes} min; threads {torch.get_num_threads()}", flush=True)
    t0 = time.monotonic()
    step = 0
    stopped_by = "steps"
    smooth = None
    for step in range(args.steps):
        elapsed = time.monotonic() - t0
        if elapsed >= budget_s:
            stopped_by = "budget"
            break
        # the schedule follows whichever bound is nearer, so a run cut by the budget still anneals
        progress = max(step / args.steps, elapsed / budget_s)
        for group in opt.param_groups:
            group["lr"] = lr_at(progress, step, args.lr, args.warmup)
        stage = next((smp for end, smp in stages if step < end), sampler)
        batch, weights = stage.batch(args.batch_size * (args.seq_len // (stage.n - 1)))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(batch[:, :-1])
        per_byte = F.cross_entropy(logits.float().reshape(-1, 256), batch[:, 1:].reshape(-1), reduction="none")
        flat_w = weights.reshape(-1)
        loss = (per_byte * flat_w).sum() / flat_w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = float(loss.detach())
        smooth = value if smooth is None else 0.98 * smooth + 0.02 * value
        if step % args.log_every == 0 or step == args.steps - 1:
            rate = (step + 1) / max(time.monotonic() - t0, 1e-9)
            line = (f"step {step} loss {value:.3f} smooth {smooth / math.log(2):.3f} bpb "
                    f"lr {opt.param_groups[0]['lr']:.2e} {rate:.2f} steps/s elapsed {time.monotonic() - t0:.0f}s")
            if step % (args.log_every * 10) == 0:
                line += f" held-out(quick) {bits_per_byte(model, quick_held):.3f} bpb"
                quick_copy = copy_scores(model, copy_passages[:6])
                line += f" copy(quick) {quick_copy['first_bpb']:.2f}->{quick_copy['second_bpb']:.2f} bpb"
            print(line, flush=True)
    else:
        step = args.steps
    train_s = time.monotonic() - t0
    steps_done = step
    print(f"trained {steps_done} steps in {train_s:.0f}s (stopped by {stopped_by}); evaluating", flush=True)
    t_eval = time.monotonic()
    heldout_bpb = bits_per_byte(model, held)
    print(f"held-out: {heldout_bpb:.4f} bits/byte on {held.shape[0]} windows of {args.seq_len} "
          f"({time.monotonic() - t_eval:.0f}s)", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    npz = out / "trained.npz"
    dtype = export_weights(model, npz)
    check_prompts = [bytes(w[:200].tolist()) for w in held[:4]]
    check = compare_with_reference(cfg, npz, check_prompts, greedy_tokens=24)
    print(f"torch vs ReferenceHybrid: {check}", flush=True)
    meta = {
        "name": "trained",
        "description": "byte-level LFM2-style hybrid (gated short conv + GQA attention) trained on CPython's "
                       "standard library by scripts/train_fixture.py",
        "config": cfg,
        "weights": {"file": npz.name, "dtype": dtype, "bytes": npz.stat().st_size,
                    "sha256": hashlib.sha256(npz.read_bytes()).hexdigest(), "parameters": n_params},
        "data": {
            "source": f"CPython {sys.version.split()[0]} standard library .py files "
                      f"(sysconfig stdlib; excluding directories {sorted(EXCLUDED_DIRS)}); PSF License text",
            "split": f"held out iff int(sha256(relative path).hexdigest(), 16) % {HELDOUT_MODULUS} == 0; "
                     "the files specproof bench reads (excluded_bench_files) are in neither part",
            "train_files": len(corpus.train_files), "train_bytes": len(corpus.train_text),
            "heldout_files": len(corpus.heldout_files), "heldout_bytes": len(corpus.heldout_text),
            "excluded_bench_files": corpus.bench_files,
            "copy_fraction": args.copy_fraction, "copy_weight": args.copy_weight,
            "copy_description": "windows packed with (string, separator, the same string); the string is random "
                                f"printable bytes ({COPY_RANDOM_FRACTION:.0%}, first copy unweighted) or a span "
                                "of training text; the second copy's loss weighted by copy_weight",
            "grounded_fraction": args.grounded_fraction,
            "grounded_kinds": dict(GROUNDED_KINDS),
            "grounded_description": "windows packed with examples, cut on the left; edit: a function then a "
                                    "header and the "
                                    "function again, an argument renamed or a comment added or unchanged; quote: a "
                                    "docstring then a quoted span of it; json: JSON lines records {module, name, "
                                    "line, args, doc} of consecutive functions; repeat: a passage, a gap, the "
                                    "passage again",
        },
        "training": {
            "seed": args.seed, "threads": args.threads, "steps_planned": args.steps, "steps": steps_done,
            "stopped_by": stopped_by, "batch_size": args.batch_size, "seq_len": args.seq_len,
            "seq_schedule": [{"seq_len": length, "steps": int(fraction * args.steps)}
                             for length, fraction in args.seq_schedule],
            "bytes_seen": steps_done * args.batch_size * args.seq_len, "lr": args.lr, "warmup": args.warmup,
            "weight_decay": args.weight_decay, "bf16_autocast": args.bf16, "qk_norm_init": QK_NORM_INIT,
            "budget_minutes": args.budget_minutes, "train_seconds": round(train_s, 1),
            "total_seconds": round(time.monotonic() - t_start, 1), "torch": torch.__version__,
            "script_sha256": script_sha256,
            "command": "python scripts/train_fixture.py " + " ".join(sys.argv[1:]),
        },
        "heldout": {"bits_per_byte": round(heldout_bpb, 4), "windows": int(held.shape[0]),
                    "window_bytes": args.seq_len, "files": len(corpus.heldout_files)},
        "torch_vs_reference": check,
        "probe": probe(cfg, npz),
        "copying": copy_scores(model, copy_passages),
    }
    (out / "trained.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {npz} ({npz.stat().st_size:,} bytes, {dtype}) and {out / 'trained.json'}; "
          f"total {time.monotonic() - t_start:.0f}s", flush=True)


def check(args: argparse.Namespace) -> None:
    seed_everything(args.seed, args.threads)
    out = Path(args.out)
    cfg = json.loads((out / "trained.json").read_text())["config"]
    corpus = load_corpus(Path(sysconfig.get_paths()["stdlib"]))
    held = heldout_windows(corpus, 512, 512 * 64)
    prompts = [bytes(w[: args.check_len].tolist()) for w in held[: args.check_prompts]]
    print(json.dumps(compare_with_reference(cfg, out / "trained.npz", prompts, args.greedy_tokens)))


# --------------------------------------------------------------------------- measure


def grounded_prompts(corpus: Corpus) -> Iterator[tuple[str, bytes]]:
    """Prompts built from held-out files only; the first candidates in file order, not picked by score."""
    root = Path(sysconfig.get_paths()["stdlib"])
    funcs: list[tuple[str, str, int, list[str], str | None, str]] = []
    docs: list[str] = []
    tmp = Corpus([], [], [], b"", b"", funcs, docs, {})
    texts: dict[str, str] = {}
    for rel in corpus.heldout_files:
        texts[rel] = (root / rel).read_text(encoding="utf-8", errors="replace")
        _extract(rel, texts[rel], tmp)
    edits = [f for f in funcs if 200 <= len(f[5]) <= 500][:: max(1, len(funcs) // 40)][:3]
    for *_, src in edits:
        yield "code-edit", (src.rstrip("\n") + "\n\n# Rewrite this function with the same behaviour:\n"
                            + src.splitlines()[0] + "\n").encode()
    quotes = [d for d in docs if 300 <= len(d) <= 700][:: 7][:3]
    for doc in quotes:
        yield "quote", (doc + '\n\nQuote the passage above:\n"' + doc.split()[0] + " ").encode()
    rows = funcs[:5]
    yield "json", ("Records (JSON lines):\n" + "\n".join(
        json.dumps({"module": m, "name": n, "line": ln, "args": a, "doc": d}) for m, n, ln, a, d, _ in rows
    ) + "\n").encode()
    for doc in [d for d in docs if len(d) >= 400][:: 11][:3]:
        yield "free-text", doc[:300].encode()


def measure(args: argparse.Namespace) -> None:
    seed_everything(args.seed, args.threads)
    sys.path.insert(0, str(REPO / "src"))
    from specproof.engine import NgramDrafter, SpecDecoder, greedy_decode
    from specproof.fixtures import load_trained_target

    corpus = load_corpus(Path(sysconfig.get_paths()["stdlib"]))
    target = load_trained_target("")
    by_kind: dict[str, list[float]] = {}
    samples: dict[str, str] = {}
    for kind, prompt in grounded_prompts(corpus):
        t0 = time.monotonic()
        gen = SpecDecoder(target, NgramDrafter(), k=4).generate(list(prompt), args.new_tokens)
        ref = greedy_decode(target, list(prompt), args.new_tokens)
        assert gen.tokens == ref.tokens, "speculative output differs from greedy"
        tpr = gen.stats.mean_tokens_per_round
        by_kind.setdefault(kind, []).append(tpr)
        text = bytes(gen.tokens).decode("utf-8", errors="replace")
        samples.setdefault(kind, prompt.decode()[-200:] + "⟨" + text + "⟩")
        print(f"{kind:10s} prompt {len(prompt):4d} B  tokens/round {tpr:.2f}  rounds {gen.stats.rounds}  "
              f"({time.monotonic() - t0:.1f}s)  {text[:70]!r}", flush=True)
    summary = {k: round(sum(v) / len(v), 3) for k, v in by_kind.items()}
    print("mean tokens per round (k=4, NgramDrafter()):", json.dumps(summary))
    for kind, s in samples.items():
        print(f"--- sample ({kind}) ---\n{s}\n")


def _seq_schedule(text: str) -> list[tuple[int, float]]:
    """``"256:0.35,512:0.25"`` -> ``[(256, 0.35), (512, 0.25)]``."""
    out: list[tuple[int, float]] = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        length, sep, fraction = item.partition(":")
        try:
            stage = (int(length), float(fraction))
        except ValueError:
            stage = (0, -1.0)
        if not sep or stage[0] < 16 or not 0.0 < stage[1] <= 1.0:
            raise argparse.ArgumentTypeError(f"bad stage {item!r}: want LEN:FRACTION, LEN >= 16, 0 < FRACTION <= 1")
        out.append(stage)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--seed", type=int, default=1234)
    common.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (part of reproducibility)")
    common.add_argument("--out", default=str(DATA_DIR), help="folder for trained.npz and trained.json")
    t = sub.add_parser("train", parents=[common])
    t.add_argument("--steps", type=int, default=1500)
    t.add_argument("--budget-minutes", type=float, default=22.0, help="hard wall-clock limit on the training loop")
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--seq-len", type=int, default=1024)
    t.add_argument("--seq-schedule", type=_seq_schedule, default=[],
                   help="warm-up stages LEN:FRACTION,... e.g. 256:0.35,512:0.25: the first 35%% of the steps on "
                        "256-byte windows, the next 25%% on 512, the rest on --seq-len (bytes per step kept)")
    t.add_argument("--conv-kernel", type=int, default=MODEL_CONFIG["conv_kernel"],
                   help="short-conv length (LFM2's conv_L_cache); 4 lets an induction head match 3 bytes")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--warmup", type=int, default=40)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--grounded-fraction", type=float, default=0.7,
                   help="of the windows not in the copy curriculum, the fraction that are grounded examples")
    t.add_argument("--copy-fraction", type=float, default=0.5, help="fraction of windows from the copy curriculum")
    t.add_argument("--copy-weight", type=float, default=2.0, help="loss weight on the second copy's bytes")
    t.add_argument("--layers", type=lambda v: v.split(","), default=MODEL_CONFIG["layers"],
                   help="comma-separated block kinds (conv, attn), e.g. conv,attn,conv,attn")
    t.add_argument("--eval-bytes", type=int, default=1024 * 192, help="held-out bytes for the final bits/byte")
    t.add_argument("--log-every", type=int, default=20)
    t.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True, help="bf16 autocast matmuls")
    t.set_defaults(func=train)
    c = sub.add_parser("check", parents=[common])
    c.add_argument("--check-prompts", type=int, default=8)
    c.add_argument("--check-len", type=int, default=300)
    c.add_argument("--greedy-tokens", type=int, default=32)
    c.set_defaults(func=check)
    cp = sub.add_parser("copying", parents=[common])
    cp.set_defaults(func=copying)
    m = sub.add_parser("measure", parents=[common])
    m.add_argument("--new-tokens", type=int, default=96)
    m.set_defaults(func=measure)
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "seq_len", "threads"):
        if getattr(args, name, 1) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("copy_fraction", "grounded_fraction"):
        if not 0.0 <= getattr(args, name, 0.0) <= 1.0:
            parser.error(f"--{name.replace('_', '-')} must be in [0, 1]")
    if getattr(args, "conv_kernel", 2) < 2:
        parser.error("--conv-kernel must be >= 2")
    schedule = getattr(args, "seq_schedule", [])
    if sum(f for _, f in schedule) > 1.0 or any(args.seq_len % length for length, _ in schedule):
        parser.error(f"--seq-schedule: fractions must sum to <= 1 and each length divide --seq-len={args.seq_len}")
    if getattr(args, "copy_weight", 1.0) <= 0:
        parser.error("--copy-weight must be > 0")
    if any(kind not in ("conv", "attn") for kind in getattr(args, "layers", ())):
        parser.error(f"--layers takes conv and attn blocks only, got {','.join(args.layers)}")
    if getattr(args, "seq_len", 0) > MODEL_CONFIG["max_context"] - 1:
        parser.error(f"--seq-len must be < max_context={MODEL_CONFIG['max_context']}")
    args.func(args)


if __name__ == "__main__":
    main()
