"""Export a reference target's weights to safetensors, for engines in other languages.

The file holds every tensor by its Hugging Face ``Lfm2ForCausalLM`` name (float32, as
``ReferenceHybrid.weights``) and three metadata strings: ``format`` =
``specproof-weights/1``, ``config`` (the ``ReferenceConfig`` fields as JSON) and ``model``
(the specproof target spec the weights came from, e.g. ``trained``, which an engine names
in its handshake so the suite can load the same model as its oracle).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np

from specproof.engine import InvalidSettingError, ReferenceHybrid, Target

__all__ = ["WEIGHTS_FORMAT", "export_weights"]

WEIGHTS_FORMAT = "specproof-weights/1"


def export_weights(
    path: str | os.PathLike[str], *, target: str = "trained", load_target: Callable[[str], Target]
) -> Path:
    """Write the weights of target spec ``target`` (a ``ReferenceHybrid``) to ``path``; returns the path.

    ``load_target`` resolves the spec (``specproof.plugins.load_target``, which knows the fixtures).
    """
    try:
        from safetensors.numpy import save_file
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise InvalidSettingError("export-weights needs the safetensors package: pip install safetensors") from exc
    model = load_target(target)
    if not isinstance(model, ReferenceHybrid):
        raise InvalidSettingError(
            f"export-weights: target {target!r} is a {type(model).__name__}, not a ReferenceHybrid; "
            "only reference-family targets have exportable weights"
        )
    config = attrs.asdict(model.config)
    config["layers"] = list(model.config.layers)
    weights = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in model.weights.items()}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"format": WEIGHTS_FORMAT, "config": json.dumps(config, sort_keys=True), "model": target}
    tmp = out.with_name(out.name + ".tmp")
    save_file(weights, str(tmp), metadata=metadata)
    os.replace(tmp, out)
    return out
