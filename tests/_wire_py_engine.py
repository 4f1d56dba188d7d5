"""A specproof-engine/1 engine in Python for the conformance meta-tests: ``python _wire_py_engine.py MODE``.

It decodes with specproof's ``SpecDecoder`` on the zoo's small reference model, one round
per ``DecodeSession.generate(..., max_rounds=1)`` call, and speaks the protocol around it
(docs/protocol.md): ``propose``/``draft`` when the request says ``"drafts": "suite"``, a
``round`` record per round, ``state`` before every round and after the last one when
asked, ``final``. A draft it cannot take (longer than k, out of range) is refused with an
``error`` answer, as ``SpecDecoder`` refuses it.

MODE says how it treats what the suite sends (each a scenario of issue 20):

- ``ok``: correct; capabilities ``greedy``, ``suite_drafts``, ``state``;
- ``ignores-drafts``: advertises ``suite_drafts`` but never sends ``propose``: it drafts for itself;
- ``swaps-drafts``: asks with ``propose``, then verifies a draft of its own instead;
- ``no-suite-drafts``: correct, but does not advertise ``suite_drafts`` (drafts for itself);
- ``digest-perturbed``: correct but not bit-equal: advertises ``state_digest`` and reports its
  state with every element moved by +-atol/4 (a float implementation unlike numpy's), as digests;
- ``digest-stale-conv``: advertises ``state_digest`` and reports a conv state whose newest tap
  was never written (zeros), as digests;
- ``features``: correct; also advertises ``features`` and, when the request names
  ``feature_layers``, sends with every ``propose`` the rows of the accepted positions the
  client does not hold yet (the target's ``forward_with_features``, kept by ``SpecDecoder``);
- ``features-from-rejected``: as ``features``, but the newest row it sends is the last row of
  the last forward (the verify's): after a partial accept, a rejected draft position's;
- ``features-stale``: as ``features``, but sends the prompt's rows only, never the accepted ones;
- ``features-bad-from``, ``features-short-data``: protocol errors in ``propose.features``: a
  ``from`` past the rows the client holds; data one row shorter than ``rows`` says.
- ``sessions-v0``: correct, and advertises ``sessions`` as an engine written before
  ``stats.prefix_reused`` existed: it keeps no cache (each request is prefilled afresh, which a
  session allows) and its ``final`` carries no ``stats`` (docs/protocol.md, Compatibility);
- ``sessions-overclaim``: as ``sessions-v0``, but reports ``stats`` with ``prefix_reused``: the
  whole prompt but the pending token, which it never cached (more than it can hold);
- ``sessions-zero``: as ``sessions-v0``, but reports ``prefix_reused`` 0 on every request, a user
  turn continuing its last context included (a declared cache that is never used).
- ``sampling``: as ``ok``, and advertises ``sampling`` and ``seeded`` with ``sampling_schemes``
  ``["rejection", "match"]``: a ``generate`` with ``sampling`` samples with ``SpecDecoder`` (the scheme
  the request names), the suite's drafts verified against their ``q`` rows (one-hot when the draft
  message carries none). Each round is one ``SpecDecoder.generate(max_rounds=1)`` call, which seeds a
  fresh generator per call: round ``r`` is given the seed drawn from ``default_rng([seed, r])``, so the
  rounds' random streams are independent and one request seed still fixes the whole output.

- ``sampling-argmax``: as ``sampling``, but verifies by argmax whatever the request asks (greedy at
  ``temperature > 0``: the shape of SGLang's silent argmax verification);
- ``sampling-fixed-seed``: as ``sampling``, but seeds every request's generator with 0, whatever its
  seed (one broadcast stream: generations with different seeds are identical).

Every mode samples when a request asks (the test engine's ``SpecDecoder`` can); only ``sampling``
declares it, so a client never asks the others.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Sequence

import numpy as np

from specproof.conformance.zoo import small_reference
from specproof.contract.sampling import SampledDraft, SamplingParams
from specproof.engine import NgramDrafter, SpecDecoder, greedy_decode
from specproof.wire import decode_q_rows, encode_digest

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
MODES = (
    "ok",
    "ignores-drafts",
    "swaps-drafts",
    "no-suite-drafts",
    "digest-perturbed",
    "digest-stale-conv",
    "features",
    "features-from-rejected",
    "features-stale",
    "features-bad-from",
    "features-short-data",
    "sessions-v0",
    "sessions-overclaim",
    "sessions-zero",
    "sampling",
    "sampling-argmax",
    "sampling-fixed-seed",
)
ATOL = 1e-5
K = 4
MODEL = "specproof.conformance.zoo:small_reference"


class Abort(Exception):
    """The suite sent a reset in place of a draft: abandon the request."""


def send(message: object) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def read() -> dict[str, object]:
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)  # type: ignore[no-any-return]


class Reported:
    """What a digest-mode engine reported in this request: the KV length and the arrays (their bytes)."""

    def __init__(self) -> None:
        self.rows = -1
        self.arrays: dict[str, np.ndarray] = {}


def reported_state(target: object, rng: np.random.Generator, held: Reported) -> dict[str, np.ndarray]:
    """The state this mode reports: the target's, perturbed or broken as MODE says (KV rows reported once stay)."""
    arrays = {n: np.ascontiguousarray(np.asarray(a, dtype="<f4")) for n, a in target.state_arrays().items()}  # type: ignore[attr-defined]
    if MODE == "digest-perturbed":
        for name, a in arrays.items():
            moved = (a + (ATOL / 4) * rng.choice([-1.0, 1.0], size=a.shape)).astype("<f4")
            old = held.arrays.get(name)
            if name in ("key_cache", "value_cache") and old is not None and held.rows > 0:
                moved[:, :, : held.rows] = old[:, :, : held.rows]  # append-only: earlier rows as reported
            arrays[name] = moved
    elif MODE == "digest-stale-conv" and arrays["conv_state"].size:
        arrays["conv_state"][..., -1] = 0.0
    return arrays


def state_message(
    rid: int, target: object, digest: dict[str, int] | None = None, held: Reported | None = None
) -> dict[str, object]:
    processed = int(target.processed)  # type: ignore[attr-defined]
    if digest is None or held is None:
        arrays: dict[str, object] = {}
        for name, array in target.state_arrays().items():  # type: ignore[attr-defined]
            a = np.ascontiguousarray(np.asarray(array, dtype="<f4"))
            arrays[name] = {"dtype": "float32", "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode()}
        return {"type": "state", "id": rid, "processed": processed, "arrays": arrays}
    values = reported_state(target, np.random.default_rng(processed), held)
    seed, n = digest["seed"], digest["projections"]
    arrays = {}
    for name, a in values.items():
        append = name in ("key_cache", "value_cache") and held.rows >= 0
        slice_axes = 2 if name == "conv_state" else 1
        arrays[name] = encode_digest(
            a, seed=seed, n=n, slice_axes=slice_axes, axis=2 if append else None, start=held.rows if append else 0
        )
    held.rows, held.arrays = processed, values
    return {"type": "state", "id": rid, "processed": processed, "arrays": arrays}


#: the features of the last forward_with_features call (mode features-from-rejected)
LAST_FORWARD: dict[int, np.ndarray] = {}


def record_forwards(target: object) -> None:
    """Keep the features of every ``forward_with_features`` call of ``target`` in ``LAST_FORWARD``."""
    inner = target.forward_with_features  # type: ignore[attr-defined]

    def recording(tokens: Sequence[int], layers: Sequence[int], *, checkpoints: bool = False) -> object:
        logits, feats, cks = inner(tokens, layers, checkpoints=checkpoints)
        LAST_FORWARD.clear()
        LAST_FORWARD.update({layer: np.array(a) for layer, a in feats.items()})
        return logits, feats, cks

    target.forward_with_features = recording  # type: ignore[attr-defined]


class Drafts:
    """The drafter SpecDecoder calls: the suite's drafts over the wire, or the engine's own n-gram drafts."""

    def __init__(self, rid: int, suite: bool, layers: list[int] | None = None) -> None:
        self.rid, self.suite = rid, suite
        self.round = 0
        self.own = NgramDrafter()
        if layers:
            #: SpecDecoder hands a drafter declaring these the accepted positions' features
            self.feature_layers = tuple(layers)
        self.layers = layers or []
        self.sent = 0  # feature rows the client holds

    def reset(self) -> None:
        self.own.reset()

    def features(self, rows: dict[int, np.ndarray]) -> dict[str, object] | None:
        """The rows the client does not hold yet, as a propose's ``features`` (None: nothing to send)."""
        n = len(rows[self.layers[0]])
        if MODE == "features-stale" and self.round:
            return None  # the first propose's rows (the prompt's) only
        start = min(self.sent, n)
        block = np.stack([np.asarray(rows[layer][start:n], dtype="<f4") for layer in self.layers])
        if MODE == "features-from-rejected" and n > start and LAST_FORWARD:
            for i, layer in enumerate(self.layers):
                block[i, -1] = LAST_FORWARD[layer][-1]  # the verify's last row: maybe a rejected position's
        self.sent = n
        if MODE == "features-short-data":
            block = block[:, 1:]
        data = base64.b64encode(np.ascontiguousarray(block).tobytes()).decode()
        return {"from": start + (MODE == "features-bad-from"), "rows": n - start, "data": data}

    def propose(self, context: Sequence[int], k: int, features: dict[int, np.ndarray] | None = None) -> list[int]:
        return self._ask(context, k, features)[0]

    def propose_sampled(
        self,
        context: Sequence[int],
        k: int,
        *,
        sampling: SamplingParams,
        rng: np.random.Generator,
        features: dict[int, np.ndarray] | None = None,
    ) -> SampledDraft:
        """A sampled request's draft: the suite's with its ``q`` rows (one-hot when it sent none), or the
        engine's own n-gram draft (deterministic: one-hot)."""
        tokens, rows = self._ask(context, k, features)
        return SampledDraft(tokens, decode_q_rows(rows, tokens, VOCAB[0]))

    def _ask(self, context: Sequence[int], k: int, features: dict[int, np.ndarray] | None) -> tuple[list[int], object]:
        """The round's draft and the ``q`` rows the suite sent with it (None: none)."""
        if not self.suite or MODE == "ignores-drafts":
            return [int(t) for t in self.own.propose(context, k)], None
        message: dict[str, object] = {
            "type": "propose",
            "id": self.rid,
            "round": self.round,
            "context_length": len(context),
            "k": k,
        }
        if features is not None and self.layers:
            sent = self.features(features)
            if sent is not None:
                message["features"] = sent
        send(message)
        answer = read()
        if answer["type"] != "draft":
            raise Abort(str(answer.get("type")))
        if MODE == "swaps-drafts":
            return [int(t) for t in self.own.propose(context, k)], None
        return list(answer["tokens"]), answer.get("q")  # type: ignore[call-overload]


def generate(req: dict[str, object], target: object, caps: list[str]) -> None:
    rid = int(req["id"])  # type: ignore[call-overload]
    n, eos = int(req["max_new_tokens"]), req.get("eos_token_id")  # type: ignore[call-overload]
    suite = req.get("drafts") == "suite" and "suite_drafts" in caps
    layers = req.get("feature_layers") if suite and "features" in caps else None
    drafts = Drafts(rid, suite, layers)  # type: ignore[arg-type]
    send_state = bool(req.get("state")) and "state" in caps
    digest: dict[str, int] | None = req.get("state_digest") if "state_digest" in caps else None  # type: ignore[assignment]
    held = Reported()
    sampling = SamplingParams.from_json(req["sampling"]) if req.get("sampling") is not None else None  # type: ignore[arg-type]
    if MODE == "sampling-argmax":
        sampling = None
    elif MODE == "sampling-fixed-seed" and sampling is not None:
        sampling = sampling.with_seed(0)
    scheme = str(req.get("scheme") or "rejection")
    decoder = SpecDecoder(target, drafts, k=K, rollback="checkpoint", scheme=scheme)  # type: ignore[arg-type]
    session = decoder.start(req["prompt"])  # type: ignore[arg-type]
    out: list[int] = []
    stop = "max_new_tokens"
    rounds = 0
    counts = Counts()
    while len(out) < n:
        if target.processed >= target.max_context:  # type: ignore[attr-defined]
            stop = "context_full"  # no room for the pending token: no round, so no state before one
            break
        if send_state:
            send(state_message(rid, target, digest, held))
        drafts.round = rounds
        gen = session.generate(
            n - len(out),
            eos_token_id=eos,  # type: ignore[arg-type]
            max_rounds=1,
            sampling=round_sampling(sampling, rounds),
        )
        if not gen.steps:
            stop = gen.stop_reason
            break
        step = gen.steps[0]
        send(
            {
                "type": "round",
                "id": rid,
                "round": rounds,
                "base": step.base,
                "draft": list(step.draft),
                "argmax": list(step.argmax),
                "accepted": list(step.accepted),
                "processed": step.processed,
            }
        )
        rounds += 1
        counts.add(gen.stats)
        out.extend(gen.tokens)
        if gen.stop_reason == "eos":
            stop = "eos"
            break
    if send_state:
        send(state_message(rid, target, digest, held))
    final: dict[str, object] = {"type": "final", "id": rid, "tokens": out, "stop_reason": stop}
    final["processed"] = int(target.processed)  # type: ignore[attr-defined]
    if MODE in ("sessions-overclaim", "sessions-zero"):
        prompt = list(req["prompt"])  # type: ignore[call-overload]
        reused = len(prompt) - 1 if MODE == "sessions-overclaim" else 0
        final["stats"] = {**counts.wire(len(out)), "prefix_reused": reused}
    send(final)


def round_sampling(sampling: SamplingParams | None, round_index: int) -> SamplingParams | None:
    """The parameters of one round's ``SpecDecoder`` call: the request's, with round ``round_index``'s own
    seed drawn from ``default_rng([seed, round_index])`` (no seed: fresh entropy every round)."""
    if sampling is None or sampling.seed is None:
        return sampling
    derived = int(np.random.default_rng([sampling.seed, round_index]).integers(2**63))
    return sampling.with_seed(derived)


#: the vocabulary size (set by main: decode_q_rows needs it)
VOCAB = [0]


class Counts:
    """A generation's ``final.stats`` summed over its one-round ``SpecDecoder`` calls."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys(("rounds", "verify_forwards", "replay_forwards", "drafted", "accepted"), 0)
        self.attempts: list[int] = []
        self.accepts: list[int] = []

    def add(self, stats: object) -> None:
        if stats is None:
            return
        for name in self.totals:
            self.totals[name] += int(getattr(stats, name))
        for mine, theirs in ((self.attempts, stats.position_attempts), (self.accepts, stats.position_accepts)):  # type: ignore[attr-defined]
            mine.extend([0] * (len(theirs) - len(mine)))
            for p, n in enumerate(theirs):
                mine[p] += int(n)

    def wire(self, emitted: int) -> dict[str, object]:
        return {
            **self.totals,
            "emitted": emitted,
            "prefill_forwards": 1,
            "position_attempts": self.attempts,
            "position_accepts": self.accepts,
        }


def main() -> None:
    if MODE not in MODES:
        print(f"unknown mode {MODE!r}; one of {MODES}", file=sys.stderr)
        sys.exit(2)
    target = small_reference()
    VOCAB[0] = int(target.vocab_size)
    caps = ["greedy", "suite_drafts", "state"]
    if MODE == "no-suite-drafts":
        caps.remove("suite_drafts")
    if MODE in ("ignores-drafts", "swaps-drafts"):
        caps.remove("state")
    if MODE.startswith("digest-"):
        caps.append("state_digest")
    if MODE.startswith("sessions-"):
        caps.append("sessions")
    features: dict[str, object] = {}
    if MODE.startswith("sampling"):
        caps += ["sampling", "seeded"]
        features["sampling_schemes"] = ["rejection", "match"]
    if MODE.startswith("features"):
        caps.append("features")
        features = {"d_model": int(target.d_model), "feature_layers": list(target.feature_layers)}
        record_forwards(target)
    send(
        {
            "type": "hello",
            "protocol": "specproof-engine/1",
            "engine": {"name": f"py-{MODE}", "version": "0"},
            "vocab_size": target.vocab_size,
            "max_context": target.max_context,
            "k": K,
            "rollback": "checkpoint",
            "capabilities": caps,
            "model": MODEL,
            "atol": ATOL,
            **features,
        }
    )
    while True:
        req = read()
        rid = req["id"]
        if req["type"] in ("reset", "shutdown"):
            send({"type": "ok", "id": rid})
            if req["type"] == "shutdown":
                return
            continue
        if req["type"] == "greedy":
            tokens = greedy_decode(small_reference(), req["prompt"], req["max_new_tokens"]).tokens  # type: ignore[arg-type]
            send({"type": "final", "id": rid, "tokens": list(tokens), "stop_reason": "max_new_tokens"})
            continue
        try:
            generate(req, target, caps)
        except Exception as exc:  # a refused draft, a reset in place of a draft: the request fails, the engine lives
            send({"type": "error", "id": rid, "message": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    main()
