"""The flagship export families: small reference targets shaped like the two hybrid MoE models.

- ``lfm2-moe``: LFM2-MoE's shape: conv + attention blocks (``conv+attn+conv+attn``), a
  mixture-of-experts feed-forward in every block routed as LFM2-MoE routes (``router=sigmoid``:
  sigmoid scores, a per-expert ``expert_bias`` added for the selection only, the chosen scores
  renormalised); states key_cache, value_cache, conv_state (LFM2 has no delta-rule state, so
  ``rec_state`` does not exist: Core ML states cannot be zero-sized).
- ``qwen3.6-moe``: Qwen3.5/3.6-MoE's shape: three Gated DeltaNet blocks to one attention
  block (``gdn+gdn+gdn+attn``), mixture-of-experts feed-forwards (softmax router) with
  Qwen3-Next's gated shared expert (``shared_expert=true``) and gated attention
  (``attn_output_gate=true``); all four states.

Both are small (d_model 32, a byte vocabulary of 256, 4 experts top-2, max_context 128) so that the
evaluator certifies them in minutes. In every MoE layer experts 0 and 1 share their router
row (and, under the sigmoid router, their expert bias), so router ties happen at every token and the
bundle must break them as the reference does (to the lower index of equal selection scores).
"""

from __future__ import annotations

from typing import Final

from specproof.contract.errors import InvalidSettingError
from specproof.engine.targets.reference import ReferenceConfig, ReferenceHybrid

__all__ = ["FAMILIES", "family_spec", "family_target", "load_family_spec"]

_SMALL: Final = (
    "vocab_size=256,d_model=32,n_heads=4,n_kv_heads=2,head_dim=8,ffn_dim=64,conv_kernel=3,"
    "gdn_heads=2,gdn_key_dim=8,gdn_value_dim=8,n_experts=4,experts_per_token=2,expert_ffn_dim=32,max_context=128"
)
#: family -> the reference spec of its target (before the router rows are tied)
FAMILIES: Final[dict[str, str]] = {
    "lfm2-moe": f"reference:layers=conv+attn+conv+attn,{_SMALL},router=sigmoid",
    "qwen3.6-moe": f"reference:layers=gdn+gdn+gdn+attn,{_SMALL},shared_expert=true,attn_output_gate=true",
}
TIED_EXPERTS: Final = (0, 1)


def family_spec(name: str) -> str:
    """The reference spec of family ``name``; ``InvalidSettingError`` naming the known ones."""
    if name not in FAMILIES:
        raise InvalidSettingError(f"bundle export: --family {name!r}; one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_target(name: str, *, max_context: int | None = None) -> ReferenceHybrid:
    """The family's reference target with experts 0 and 1 sharing their router row (and expert bias) in every
    MoE layer."""
    from specproof.engine.targets.reference_spec import load

    spec = family_spec(name)
    base = load(spec.partition(":")[2])
    cfg: ReferenceConfig = base.config
    if max_context is not None:
        import attrs

        cfg = attrs.evolve(cfg, max_context=max_context)
    weights = base.weights
    a, b = TIED_EXPERTS
    for i in range(len(cfg.layers)):
        for name in ("gate.weight", "expert_bias"):
            key = f"model.layers.{i}.feed_forward.{name}"
            if key in weights:
                tied = weights[key].copy()
                tied[b] = tied[a]
                weights[key] = tied
    return ReferenceHybrid(cfg, weights=weights)


def load_family_spec(args: str) -> ReferenceHybrid:
    """The ``family:NAME[,max_context=N]`` target spec: the exported family's source model (what a
    ``bundle export --family NAME`` bundle records as its ``specproof.target``)."""
    name, _, rest = args.partition(",")
    max_context = None
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if key != "max_context" or not eq or not value.isdigit():
            raise InvalidSettingError(f"family:{args}: option {item!r}; only max_context=N is known")
        max_context = int(value)
    if max_context is not None and max_context < 2:
        raise InvalidSettingError(f"family:{args}: max_context={max_context} must be >= 2")
    return family_target(name, max_context=max_context)
