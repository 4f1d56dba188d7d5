#!/usr/bin/env python3
"""Train the feature heads of the ``trained`` fixture: an EAGLE-3-style head and an MTP-style head.

Both heads draft from the target's hidden states (docs/contract.md, "Feature drafters"):
head position ``t`` reads the target's features at ``t`` (the residual stream after the
blocks named in ``feature_layers``) and the embedding of the token at ``t + 1``, and
predicts the token at ``t + 2``. One attention block with its own KV cache and rotary
positions, then the target's own tied LM head (its embedding matrix, not copied into the
head's weights).

- ``eagle``: features of three depths (low, mid, high) fused by a linear layer;
- ``mtp``:   the last block's output only, no fusion (DeepSeek-V3 / Qwen3-Next MTP shape).

Drafting more than one token feeds the head's own output hidden state back in place of the
target's feature of a drafted position (whose feature the target has not computed yet).
Training unrolls that chain (EAGLE-3's "training-time test"): pass ``p`` at position ``t``
attends to the real-feature keys up to ``t - p + 1`` and to the chain's own keys after it,
exactly the cache the drafter holds at its ``p``-th draft.

Data: the same mix and held-out split as ``trained`` and ``trained-small``
(``scripts/train_fixture.py``, imported unchanged); the objective is cross-entropy against the
target's next-byte distribution (the teacher's logits at ``t + 1``) mixed with the next byte.

Writes ``eagle-trained.npz`` / ``mtp-trained.npz`` and ``feature-heads.json`` (config,
sha256, parameters, data, steps, time, held-out top-1 agreement by chain position and
acceptance by position, command).

    python scripts/train_heads.py --threads 1 --budget-minutes 6.3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _train_common as common
import train_fixture as tf

torch = tf.torch
F = tf.F
nn = tf.nn
np = tf.np

HEAD_BASE: dict[str, Any] = {
    "d_model": 96,
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 24,
    "ffn_dim": 192,
    "rope_theta": 10000.0,
    "norm_eps": 1e-5,
    "max_context": 4096,
    "vocab_size": 256,
}
HEAD_CONFIGS: dict[str, dict[str, Any]] = {
    # the trained fixture has 4 blocks (conv, attn, conv, attn); feature layer i = output of block i
    "eagle": {**HEAD_BASE, "kind": "eagle", "feature_layers": [0, 1, 3]},
    "mtp": {**HEAD_BASE, "kind": "mtp", "feature_layers": [3]},
}
MAX_NPZ_BYTES = 1024 * 1024


class Head(nn.Module):
    """The torch twin of ``specproof.engine.drafters._heads.FeatureHead`` (same names, same function)."""

    def __init__(self, cfg: dict[str, Any], embed: Any) -> None:
        super().__init__()
        d = cfg["d_model"]
        self.cfg = cfg
        n_feat = len(cfg["feature_layers"])
        self.fc = nn.Linear(n_feat * d, d, bias=False) if cfg["kind"] == "eagle" else None
        self.hidden_norm = tf.RMSNorm(d, cfg["norm_eps"])
        self.embed_norm = tf.RMSNorm(d, cfg["norm_eps"])
        self.in_proj = nn.Linear(2 * d, d, bias=False)
        self.block = tf.Block("attn", {**cfg, "conv_kernel": 0})
        self.norm = tf.RMSNorm(d, cfg["norm_eps"])
        self.register_buffer("embed", embed, persistent=False)  # the target's tied LM head, frozen
        cos, sin = tf.rope_tables(cfg["max_context"], cfg["head_dim"], cfg["rope_theta"])
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self) -> None:
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight"):
                nn.init.constant_(p, tf.QK_NORM_INIT)
            elif name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(("out_proj.weight", "w2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2))
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, next_tokens: Any, feats: Any, passes: int) -> list[Any]:
        """Logits of each chain pass; ``next_tokens[b, t]`` is the token at ``t + 1``, ``feats[b, t]`` the
        concatenated features at ``t``. Pass ``p`` (1-based) is valid at ``t >= p - 1``."""
        bsz, t, _ = feats.shape
        att = self.block.self_attn
        nh, nkv, hd = att.n_heads, att.n_kv, att.hd
        group = nh // nkv
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        e = self.embed_norm(F.embedding(next_tokens, self.embed))
        s = self.fc(feats) if self.fc is not None else feats
        pos = torch.arange(t)
        keys: list[Any] = []
        values: list[Any] = []
        out = []
        for p in range(1, passes + 1):
            h = self.in_proj(torch.cat([e, self.hidden_norm(s)], dim=-1))
            x = self.block.operator_norm(h)
            q = att.q_layernorm(att.q_proj(x).view(bsz, t, nh, hd)).transpose(1, 2)
            k = att.k_layernorm(att.k_proj(x).view(bsz, t, nkv, hd)).transpose(1, 2)
            v = att.v_proj(x).view(bsz, t, nkv, hd).transpose(1, 2)
            q = q * cos + tf.rotate_half(q) * sin
            k = k * cos + tf.rotate_half(k) * sin
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            keys.append(k)
            values.append(v)
            scale = 1.0 / math.sqrt(hd)
            # real-feature keys (pass 1) at j <= t - p + 1
            scores = [torch.matmul(q, keys[0].transpose(-1, -2)) * scale]
            mask = pos[None, :] <= (pos[:, None] - p + 1)
            scores[0] = scores[0].masked_fill(~mask, float("-inf"))
            vals = []
            # chain keys of pass r (2..p) at position t - p + r: shift them right by p - r
            for r in range(2, p + 1):
                shift = p - r
                kr = F.pad(keys[r - 1], (0, 0, shift, 0))[:, :, :t]
                vr = F.pad(values[r - 1], (0, 0, shift, 0))[:, :, :t]
                scores.append((q * kr).sum(-1, keepdim=True) * scale)
                vals.append(vr)
            allsc = torch.cat(scores, dim=-1)
            # positions t < p - 1 have no valid key at all: keep them finite (their loss is masked)
            allsc = torch.where(torch.isinf(allsc).all(-1, keepdim=True), torch.zeros_like(allsc), allsc)
            w = torch.softmax(allsc.float(), dim=-1).to(q.dtype)
            o = torch.matmul(w[..., :t], values[0])
            for i, vr in enumerate(vals):
                o = o + w[..., t + i : t + i + 1] * vr
            h = h + att.out_proj(o.transpose(1, 2).reshape(bsz, t, nh * hd))
            h = h + self.block.feed_forward(self.block.ffn_norm(h))
            out.append(self.norm(h) @ self.embed.T)
            s = F.pad(h, (0, 0, 1, 0))[:, :t]  # the chain: position t's substitute feature is o_{t-1}
        return out


@torch.no_grad()
def teacher_features(teacher: Any, tokens: Any, layers: list[int]) -> tuple[Any, Any]:
    """The teacher's logits and the concatenation of its blocks' outputs at ``layers`` (float32)."""
    t = tokens.shape[1]
    cos, sin = teacher.rope_cos[:t], teacher.rope_sin[:t]
    h = teacher.model.embed_tokens(tokens)
    hidden = []
    for layer in teacher.model.layers:
        h = layer(h, cos, sin)
        hidden.append(h)
    logits = teacher.model.embedding_norm(h) @ teacher.model.embed_tokens.weight.T
    return logits, torch.cat([hidden[i] for i in layers], dim=-1)


@torch.no_grad()
def evaluate(head: Head, teacher: Any, windows: Any, passes: int, batch: int = 8) -> dict[str, Any]:
    """Held-out top-1 agreement with the teacher's argmax for each chain pass (teacher-forced on the
    text), and acceptance by position: the fraction of positions where drafts 1..p would all be accepted
    (each equals the teacher's argmax and, for p > 1, the text's token there is also the teacher's)."""
    head.eval()
    layers = head.cfg["feature_layers"]
    agree = [0] * passes
    count = [0] * passes
    reach = [0] * passes
    starts = 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i : i + batch]
        logits, feats = teacher_features(teacher, w, layers)
        tgt = logits.argmax(-1)  # tgt[:, j]: the teacher's next token after position j
        outs = head(w[:, 1:], feats[:, :-1], passes)
        t = w.shape[1] - 1
        ok = []
        for p, lg in enumerate(outs, start=1):
            pred = lg.argmax(-1)  # pass p at position t predicts the token at t + 2
            good = pred[:, p - 1 :] == tgt[:, p : t + 1]
            agree[p - 1] += int(good.sum())
            count[p - 1] += good.numel()
            ok.append(good)
        # a round starting after position s (context ends at s + 1, the bonus token): draft p sits at
        # head position s + p - 1, judged against tgt[s + p]; it needs the text's token at s + p to be
        # the teacher's (the previous draft, accepted) for p > 1
        text_ok = w[:, 1:] == tgt[:, :-1]  # text_ok[:, j]: token at j + 1 is the teacher's choice
        n = t - passes
        alive = torch.ones(w.shape[0], n, dtype=torch.bool)
        for p in range(1, passes + 1):
            step_ok = ok[p - 1][:, :n]
            if p > 1:
                step_ok = step_ok & text_ok[:, p - 1 : p - 1 + n]
            alive = alive & step_ok
            reach[p - 1] += int(alive.sum())
        starts += alive.numel()
    head.train()
    return {
        "top1_by_pass": [round(a / c, 4) for a, c in zip(agree, count, strict=True)],
        "acceptance_by_position": [round(r / starts, 4) for r in reach],
        "expected_accepted": round(sum(reach) / starts, 4),
    }


def train_head(name: str, args: argparse.Namespace, teacher: Any, corpus: Any, held: Any) -> dict[str, Any]:
    cfg = dict(HEAD_CONFIGS[name])
    tf.seed_everything(args.seed, args.threads)
    sampler = common.sampler(corpus, args)
    head = Head(cfg, teacher.model.embed_tokens.weight.detach().clone())
    head.init_weights()
    n_params = sum(x.numel() for x in head.parameters())
    opt = common.adamw(head, lr=args.lr, weight_decay=0.05)
    weights = [args.pass_decay**i for i in range(args.passes)]
    print(f"[{name}] {n_params:,} params; load {os.getloadavg()[0]:.2f}", flush=True)
    loop = common.BudgetedSteps(opt, args)
    for step in loop:
        batch, _ = sampler.batch(args.batch_size)
        logits, feats = teacher_features(teacher, batch, cfg["feature_layers"])
        soft = F.softmax(logits[:, 1:], dim=-1)  # the teacher's distribution of the token at t + 2
        hard = F.one_hot(batch[:, 2:], 256).float()
        target = args.alpha * soft[:, :-1] + (1.0 - args.alpha) * hard
        target = torch.cat([target, soft[:, -1:]], dim=1)  # the last position has no text token: teacher only
        # float32: bf16 autocast made a step ~4x slower on this CPU (no native bf16 matmul)
        outs = head(batch[:, 1:], feats[:, :-1], args.passes)
        loss = torch.zeros(())
        for p, (wgt, lg) in enumerate(zip(weights, outs, strict=True), start=1):
            logp = F.log_softmax(lg.float()[:, p - 1 :], dim=-1)
            loss = loss + wgt * -(target[:, p - 1 :] * logp).sum(-1).mean()
        loss = loss / sum(weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0:
            print(f"[{name}] step {step} loss {float(loss.detach()):.3f} elapsed {time.monotonic() - loop.t0:.0f}s",
                  flush=True)
    step, stopped_by = loop.steps, loop.stopped_by
    train_s = time.monotonic() - loop.t0
    load_after = os.getloadavg()
    print(f"[{name}] trained {step} steps in {train_s:.0f}s ({stopped_by}); evaluating", flush=True)
    scores = evaluate(head, teacher, held, args.eval_passes)
    print(f"[{name}] held-out {scores}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    weights = common.save_npz(head, out / f"{name}-trained.npz", limit=MAX_NPZ_BYTES, script="train_heads")
    return {
        "config": cfg,
        "weights": {
            **weights,
            "parameters": n_params,
            "note": "the LM head is the target's tied embedding matrix, read from trained.npz, not stored here",
        },
        "training": {
            "steps": step,
            "stopped_by": stopped_by,
            "train_seconds": round(train_s, 1),
            "load_average_after_training": [round(x, 2) for x in load_after],
        },
        "heldout": {**scores, "windows": int(held.shape[0]), "window_bytes": int(held.shape[1] - 1)},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", default="eagle,mtp")
    common.add_options(
        p,
        seed=5678,
        threads=1,
        budget_minutes=6.3,
        budget_help="wall-clock limit on EACH head's training loop",
        seq_len=256,
        lr=3e-3,
        warmup=30,
    )
    p.add_argument("--passes", type=int, default=3, help="chain passes unrolled in training (training-time test)")
    p.add_argument("--pass-decay", type=float, default=0.8)
    p.add_argument("--eval-passes", type=int, default=4)
    p.add_argument("--eval-windows", type=int, default=48)
    args = p.parse_args(argv)

    t_start = time.monotonic()
    tf.seed_everything(args.seed, args.threads)
    teacher, meta_t = common.load_teacher()
    corpus = common.load_corpus()
    held_all = tf.heldout_windows(corpus, 512, 1024 * 1024)
    held = held_all[:: max(1, held_all.shape[0] // args.eval_windows)][: args.eval_windows]
    print(f"setup {time.monotonic() - t_start:.1f}s; load {os.getloadavg()[0]:.2f}", flush=True)
    heads = {}
    for name in args.heads.split(","):
        heads[name] = train_head(name, args, teacher, corpus, held)
    record = {
        "name": "feature-heads",
        "description": "EAGLE-3-style and MTP-style draft heads for the trained fixture, trained on its hidden "
        "states by scripts/train_heads.py",
        "target": "trained (sha256 " + meta_t["weights"]["sha256"] + ")",
        "heads": heads,
        "data": {
            **common.data_fields(meta_t, args),
            "objective": f"cross-entropy against {args.alpha} * target softmax + {1 - args.alpha:.1f} * next byte, "
            f"{args.passes} chain passes weighted {args.pass_decay}^(p-1)",
        },
        "training": {
            "seed": args.seed,
            "threads": args.threads,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "passes": args.passes,
            "lr": args.lr,
            "budget_minutes_per_head": args.budget_minutes,
            "total_seconds": round(time.monotonic() - t_start, 1),
            **common.provenance("train_heads.py", argv),
            "environment": {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS") if k in os.environ},
        },
    }
    out = Path(args.out)
    (out / "feature-heads.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out / 'feature-heads.json'}; total {time.monotonic() - t_start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
