"""The export's keyword options, validated in one place: state layout, GDN form, planted bugs (tests only)."""

from __future__ import annotations

from typing import Final

import attrs

from specproof.contract.errors import InvalidSettingError

__all__ = ["GDN_FORMS", "LAYOUTS", "PLANTED_BUGS", "POSITIONS", "ExportOptions"]

#: where the recurrent states live: ``all-mlstate`` every state is a Core ML state (MLState);
#: ``kv-mlstate`` only the KV cache is, conv and recurrent state are input/output tensors
#: (``conv_state`` in, ``conv_state_out`` out), the layout that runs on the Neural Engine today.
#: ``unified-kv`` as ``kv-mlstate`` with keys and values in one state ``kv_cache`` ``[2, ...]`` (one KV MLState
#: per function, what CoreML-LLM records working on the Neural Engine where two states failed).
LAYOUTS: Final = ("all-mlstate", "kv-mlstate", "unified-kv")
#: how a Gated DeltaNet block runs its delta rule over the chunk: ``unrolled`` max_query masked steps,
#: ``loop`` a MIL while_loop of q steps.
GDN_FORMS: Final = ("unrolled", "loop")
#: how the program is told where the chunk starts: ``scalar`` ``position`` int32 ``[1]`` (= processed);
#: ``seed`` ``position_ids`` int32 ``[1, processed + q]`` (every position of the context so far, the seed's host
#: loop), of which the program reads the last q entries (docs/coreml.md, "Position layouts").
POSITIONS: Final = ("scalar", "seed")
#: TEST-ONLY export bugs, planted so that certification through the evaluator can be shown to reject them:
#: ``state-not-written`` the recurrent state (rec_state, else conv_state) is never written back;
#: ``gdn-last-token`` a GDN chunk updates its state with the chunk's last token only;
#: ``router-ties`` the router breaks expert ties toward the higher index in multi-token forwards;
#: ``positions-first-q`` (``positions="seed"`` only) the program reads the FIRST q entries of ``position_ids``;
#: ``tree-conv-flattened`` (``--tree``) a node's conv window from the nodes before it in the flattened order, not
#: its ancestors; ``tree-as-chain`` (``--tree``) the tree verified as a chain (each node the previous one's child);
#: ``expert-bias-ignored`` the sigmoid router selects on the bare scores (no ``expert_bias``);
#: ``shared-gate-ignored`` the shared expert's output is added unscaled by its gate;
#: ``attn-gate-ignored`` the attention output gate is left out. The last three agree with themselves:
#: only a comparison with the source (``bundle check --against``, ``certify --oracle``) sees them.
PLANTED_BUGS: Final = (
    "state-not-written",
    "gdn-last-token",
    "router-ties",
    "positions-first-q",
    "tree-conv-flattened",
    "tree-as-chain",
    "expert-bias-ignored",
    "shared-gate-ignored",
    "attn-gate-ignored",
)


@attrs.frozen(kw_only=True)
class ExportOptions:
    """How a program is written: ``layout`` (``LAYOUTS``), ``gdn`` (``GDN_FORMS``), ``positions`` (``POSITIONS``),
    ``last_token_only``, and ``planted`` (``PLANTED_BUGS`` or ``None``; test-only: it writes a WRONG program on
    purpose)."""

    layout: str = "all-mlstate"
    gdn: str = "unrolled"
    last_token_only: bool = False
    planted: str | None = None
    positions: str = "scalar"

    def __attrs_post_init__(self) -> None:
        for what, value, choices in (
            ("layout", self.layout, LAYOUTS),
            ("gdn", self.gdn, GDN_FORMS),
            ("planted", self.planted, (None, *PLANTED_BUGS)),
            ("positions", self.positions, POSITIONS),
        ):
            if value not in choices:
                known = ", ".join(c for c in choices if c is not None)
                raise InvalidSettingError(f"bundle export: {what}={value!r}; one of {known}")
        if self.planted == "positions-first-q" and self.positions != "seed":
            raise InvalidSettingError("bundle export: planted='positions-first-q' needs positions='seed'")
