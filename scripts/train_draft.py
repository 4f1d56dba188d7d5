#!/usr/bin/env python3
"""Distil ``trained-small``: a small byte-level draft model for the ``trained`` fixture.

The student has the reference architecture (``HybridLM`` from ``scripts/train_fixture.py``,
imported unchanged: that script's sha256 is recorded in ``trained.json``), the same byte
vocabulary and much fewer parameters. It is trained on the same data mix as the teacher
(stdlib text, input-grounded examples, the copy curriculum; the same held-out split and the
bench files excluded) against a mix of the teacher's next-byte distribution (``trained``,
loaded from the committed npz) and the data's next byte, so it learns to predict what the
teacher would emit, which is what a draft model is for.

Writes ``trained-small.npz`` and ``trained-small.json`` (config, weights sha256, command,
seed, steps, time, held-out bits per byte, top-1 agreement with the teacher).

    python scripts/train_draft.py --budget-minutes 8.5 --steps 100000
"""

from __future__ import annotations

import argparse
import json
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

DRAFT_CONFIG: dict[str, Any] = {
    "vocab_size": 256,
    "d_model": 48,
    "layers": ["conv", "attn"],
    "n_heads": 2,
    "n_kv_heads": 1,
    "head_dim": 24,
    "ffn_dim": 96,
    "conv_kernel": 4,
    "rope_theta": 10000.0,
    "norm_eps": 1e-5,
    "max_context": 4096,
    "tie_embeddings": True,
}
MAX_NPZ_BYTES = 1024 * 1024


@torch.no_grad()
def agreement(student: Any, teacher: Any, windows: Any, batch: int = 16) -> float:
    """Fraction of held-out positions where the student's argmax equals the teacher's."""
    student.eval()
    same = total = 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i : i + batch, :-1]
        same += int((student(w).argmax(-1) == teacher(w).argmax(-1)).sum())
        total += w.numel()
    student.train()
    return same / total


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_options(
        p,
        seed=4321,
        threads=2,
        budget_minutes=8.5,
        budget_help="hard wall-clock limit on the training loop",
        seq_len=512,
        lr=4e-3,
        warmup=40,
    )
    p.add_argument("--eval-bytes", type=int, default=1024 * 192)
    args = p.parse_args(argv)

    t_start = time.monotonic()
    tf.seed_everything(args.seed, args.threads)
    teacher, teacher_meta = common.load_teacher()
    corpus = common.load_corpus()
    sampler = common.sampler(corpus, args)
    held = tf.heldout_windows(corpus, 1024, args.eval_bytes)
    quick_held = held[:: max(1, held.shape[0] // 8)][:8]
    cfg = dict(DRAFT_CONFIG)
    model = tf.HybridLM(cfg)
    model.init_weights()
    n_params = sum(x.numel() for x in model.parameters())
    teacher_params = sum(x.numel() for x in teacher.parameters())
    opt = common.adamw(model, lr=args.lr, weight_decay=0.1)
    print(
        f"student {n_params:,} params (teacher {teacher_params:,}); setup {time.monotonic() - t_start:.1f}s; "
        f"load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    loop = common.BudgetedSteps(opt, args)
    for step in loop:
        batch, _ = sampler.batch(args.batch_size)
        inputs, labels = batch[:, :-1], batch[:, 1:]
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            soft = F.softmax(teacher(inputs).float(), dim=-1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(inputs)
        logp = F.log_softmax(logits.float(), dim=-1)
        hard = F.one_hot(labels, 256).float()
        target = args.alpha * soft + (1.0 - args.alpha) * hard
        loss = -(target * logp).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0:
            line = f"step {step} loss {float(loss.detach()):.3f} elapsed {time.monotonic() - loop.t0:.0f}s"
            if step % (args.log_every * 10) == 0:
                line += f" held-out(quick) {tf.bits_per_byte(model, quick_held):.3f} bpb"
            print(line, flush=True)
    step, stopped_by = loop.steps, loop.stopped_by
    train_s = time.monotonic() - loop.t0
    load_after = os.getloadavg()
    print(f"trained {step} steps in {train_s:.0f}s ({stopped_by}); evaluating", flush=True)
    heldout_bpb = tf.bits_per_byte(model, held)
    agree = agreement(model, teacher, held)
    print(f"held-out {heldout_bpb:.4f} bits/byte; top-1 agreement with trained {agree:.4f}", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    npz = out / "trained-small.npz"
    weights = common.save_npz(model, npz, limit=MAX_NPZ_BYTES, script="train_draft")
    check = tf.compare_with_reference(cfg, npz, [bytes(w[:200].tolist()) for w in held[:4]], greedy_tokens=24)
    print(f"torch vs ReferenceHybrid: {check}", flush=True)
    meta = {
        "name": "trained-small",
        "description": "byte-level draft model for the trained fixture: LFM2-style conv + attention, distilled "
        "from trained by scripts/train_draft.py",
        "config": cfg,
        "weights": {
            **weights,
            "parameters": n_params,
            "teacher_parameters": teacher_params,
        },
        "data": {
            **common.data_fields(teacher_meta, args),
            "teacher": "trained (sha256 " + teacher_meta["weights"]["sha256"] + ")",
            "objective": f"cross-entropy against {args.alpha} * teacher softmax + {1 - args.alpha:.1f} * next byte",
        },
        "training": {
            "seed": args.seed,
            "threads": args.threads,
            "steps": step,
            "stopped_by": stopped_by,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "lr": args.lr,
            "budget_minutes": args.budget_minutes,
            "train_seconds": round(train_s, 1),
            "total_seconds": round(time.monotonic() - t_start, 1),
            "load_average_after_training": [round(x, 2) for x in load_after],
            **common.provenance("train_draft.py", argv),
        },
        "heldout": {
            "bits_per_byte": round(heldout_bpb, 4),
            "teacher_bits_per_byte": teacher_meta["heldout"]["bits_per_byte"],
            "top1_agreement_with_teacher": round(agree, 4),
            "windows": int(held.shape[0]),
            "window_bytes": 1024,
            "files": len(corpus.heldout_files),
        },
        "torch_vs_reference": check,
    }
    (out / "trained-small.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {npz} ({npz.stat().st_size:,} bytes); total {time.monotonic() - t_start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
