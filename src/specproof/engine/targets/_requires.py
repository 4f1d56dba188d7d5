"""Importing the optional framework dependencies (torch + transformers, mlx + mlx-lm) with a clear error.

Shared by the framework targets (``hf``, ``mlx``) and the converters (``convert``), which
therefore do not import each other both ways (docs/contract.md, "Targets").
"""

from __future__ import annotations

from typing import Any

from specproof.contract.errors import MissingDependencyError

__all__ = ["require_hf", "require_mlx"]

_THREADS_SET = False


def _set_threads(torch: Any) -> None:
    """One torch thread unless ``SPECPROOF_TORCH_THREADS`` says otherwise (set once per process).

    Tiny models gain nothing from intra-op threads, and on a machine where another job holds
    a core torch's default (one thread per core) makes every forward wait for the busy core:
    measured 2x slower certification on a busy 2-core machine. One thread keeps certify's time
    independent of what else the machine runs.
    """
    global _THREADS_SET
    if _THREADS_SET:
        return
    import os

    wanted = os.environ.get("SPECPROOF_TORCH_THREADS", "1")
    if wanted.isdigit() and int(wanted) > 0:
        torch.set_num_threads(int(wanted))
    _THREADS_SET = True


def require_hf() -> tuple[Any, Any]:
    """``(torch, transformers)``, or ``MissingDependencyError`` saying which extra to install."""
    try:
        import torch
        import transformers
        import transformers.cache_utils as cache_utils
    except ImportError as exc:
        raise MissingDependencyError(
            f"the Hugging Face targets need torch and transformers ({exc}); install specproof[hf]"
        ) from exc
    _set_threads(torch)
    if not hasattr(cache_utils, "LinearAttentionCacheLayerMixin"):
        raise MissingDependencyError(
            f"HFTarget needs the transformers 5 cache API (LinearAttentionLayer); transformers "
            f"{transformers.__version__} is installed: pip install -U 'transformers>=5'"
        )
    return torch, transformers


def require_mlx() -> tuple[Any, Any, Any]:
    """``(mlx.core, mlx.nn, mlx_lm)``, or ``MissingDependencyError`` saying which extra to install."""
    try:
        import mlx.core as mx
        import mlx.nn as nn
        import mlx_lm
        import mlx_lm.models.cache
        import mlx_lm.models.lfm2
        import mlx_lm.utils
    except ImportError as exc:
        raise MissingDependencyError(f"the MLX targets need mlx and mlx-lm ({exc}); install specproof[mlx]") from exc
    return mx, nn, mlx_lm
