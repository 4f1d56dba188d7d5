"""The trained fixture's weights load into mlx-lm's and transformers' LFM2 through the converters
and give the reference target's logits and greedy tokens."""

import numpy as np
import pytest

from specproof.engine import greedy_decode
from specproof.plugins import load_target

pytestmark = pytest.mark.slow  # seconds per test: outside `tox -e quick`, always in `tox`

PROMPT = list(b"def read(self, path):\n    with open(path) as f:\n")


@pytest.mark.parametrize("family, extra", [("mlx", "mlx"), ("hf", "transformers")])
def test_trained_weights_match_the_reference(family, extra):
    pytest.importorskip(extra, reason=f"needs specproof[{family}] ({extra} not installed)")
    if family == "hf":
        torch = pytest.importorskip("torch", reason="needs specproof[hf] (torch not installed)")
        torch.set_num_threads(1)
    reference = load_target("trained:max_context=512")
    other = load_target(f"{family}:lfm2-trained,max_context=512")
    a = reference.forward(PROMPT)
    b = other.forward(PROMPT)
    np.testing.assert_allclose(b, a, rtol=0, atol=5e-4)
    assert greedy_decode(other, PROMPT, 24).tokens == greedy_decode(reference, PROMPT, 24).tokens
