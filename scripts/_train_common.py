"""What ``train_draft.py`` and ``train_heads.py`` share: options, data, teacher, optimizer, loop, records.

Both distil from the ``trained`` fixture (the teacher, read from the committed npz) on its data
mix and held-out split. ``train_fixture.py`` is not touched: its sha256 is recorded in every
fixture record as the code that defines the model and the data. This module's sha256 is
recorded beside the calling script's (``provenance``), since both now run code from here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import train_fixture as tf

torch = tf.torch


def add_options(
    p: argparse.ArgumentParser,
    *,
    seed: int,
    threads: int,
    budget_minutes: float,
    budget_help: str,
    seq_len: int,
    lr: float,
    warmup: int,
) -> None:
    """The options both scripts take; the defaults that differ are the caller's."""
    p.add_argument("--seed", type=int, default=seed)
    p.add_argument("--threads", type=int, default=threads)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--budget-minutes", type=float, default=budget_minutes, help=budget_help)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=seq_len)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--alpha", type=float, default=0.8, help="weight of the teacher's distribution in the target")
    p.add_argument("--grounded-fraction", type=float, default=0.7)
    p.add_argument("--copy-fraction", type=float, default=0.3)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--out", default=str(tf.DATA_DIR))


def load_teacher() -> tuple[Any, dict[str, Any]]:
    """The ``trained`` fixture as a frozen torch model, and its record."""
    meta = json.loads((tf.DATA_DIR / "trained.json").read_text())
    model = tf.torch_from_npz(meta["config"], tf.DATA_DIR / "trained.npz")
    for p in model.parameters():
        p.requires_grad_(False)
    return model, meta


def load_corpus() -> Any:
    """The teacher's corpus: this interpreter's standard library, split as ``train_fixture`` splits it."""
    return tf.load_corpus(Path(sysconfig.get_paths()["stdlib"]))


def sampler(corpus: Any, args: argparse.Namespace) -> Any:
    """Training windows in the teacher's data mix (``--grounded-fraction``, ``--copy-fraction``)."""
    return tf.Sampler(corpus, args.seq_len, args.seed, args.grounded_fraction, args.copy_fraction, 1.0)


def adamw(module: Any, *, lr: float, weight_decay: float) -> Any:
    """AdamW with weight decay on the matrices only (not on norms and biases)."""
    decay = [x for x in module.parameters() if x.ndim >= 2]
    no_decay = [x for x in module.parameters() if x.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )


class BudgetedSteps:
    """``for step in BudgetedSteps(opt, args)``: up to ``--steps`` steps within ``--budget-minutes``.

    Sets each step's learning rate (warm-up, then cosine over whichever of steps or time runs
    out first). Afterwards ``steps`` is the number of steps taken, ``stopped_by`` says which
    limit ended the loop and ``t0`` is when it started.
    """

    def __init__(self, opt: Any, args: argparse.Namespace) -> None:
        self.opt = opt
        self.args = args
        self.budget_s = args.budget_minutes * 60.0
        self.steps = 0
        self.stopped_by = "steps"
        self.t0 = time.monotonic()

    def __iter__(self) -> Iterator[int]:
        args = self.args
        self.t0 = time.monotonic()
        for step in range(args.steps):
            elapsed = time.monotonic() - self.t0
            if elapsed >= self.budget_s:
                self.steps, self.stopped_by = step, "budget"
                return
            progress = max(step / args.steps, elapsed / self.budget_s)
            for group in self.opt.param_groups:
                group["lr"] = tf.lr_at(progress, step, args.lr, args.warmup)
            yield step
        self.steps = args.steps


def save_npz(module: Any, path: Path, *, limit: int, script: str) -> dict[str, Any]:
    """Write ``module``'s weights as float32 npz (refused over ``limit`` bytes); the record's weights fields."""
    state = {k: v.detach().float().numpy() for k, v in module.state_dict().items()}
    tf.np.savez_compressed(path, **state)
    if path.stat().st_size > limit:
        raise SystemExit(f"{script}: {path} is {path.stat().st_size} bytes (limit {limit})")
    return {
        "file": path.name,
        "dtype": "float32",
        "bytes": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def data_fields(teacher_meta: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The record's data fields both scripts share: the teacher's source and split, and the mix."""
    return {
        "source": teacher_meta["data"]["source"],
        "split": teacher_meta["data"]["split"],
        "grounded_fraction": args.grounded_fraction,
        "copy_fraction": args.copy_fraction,
    }


def provenance(script: str, argv: list[str] | None) -> dict[str, str]:
    """The training record's code fields: torch, the sha256 of the code that ran, the command."""
    here = Path(__file__).resolve().parent
    return {
        "torch": torch.__version__,
        "script_sha256": hashlib.sha256((here / script).read_bytes()).hexdigest(),
        "train_common_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "train_fixture_sha256": hashlib.sha256(Path(tf.__file__).read_bytes()).hexdigest(),
        "command": f"python scripts/{script} " + " ".join(sys.argv[1:] if argv is None else argv),
    }
