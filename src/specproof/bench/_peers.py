"""Peers: the same model decoded by another engine (transformers, mlx-lm) and by specproof's, when
their extras are installed: warm, alternating pairs, the median tokens/s ratio with its spread and the
load (docs/bench.md, peers)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from specproof.bench._config import BenchConfig, first_k
from specproof.bench._counting import CountingTarget, default_decoder
from specproof.bench._protocol import BenchRun
from specproof.bench._workloads import build_workloads, encode_text
from specproof.contract import Drafter, Target
from specproof.engine import NgramDrafter
from specproof.engine.drafters import ModelDrafter
from specproof.plugins import load_target

__all__ = ["PEER_TARGET", "Peers"]


@attrs.frozen
class Peers:
    """The result's ``peers``: one row per peer engine (ok, skip with the extra to install, or error)."""

    def steps(self, config: BenchConfig) -> int:
        return 3 if config.peers else 0

    def measure(self, run: BenchRun) -> Mapping[str, Any]:
        peers: list[dict[str, Any]] = []
        for fn in (_peer_hf, _peer_hf_assisted, _peer_mlx) if run.config.peers else ():
            peers.append(_run_peer(fn, run.config, run.drafter_factory))
            run.tick(f"peer {peers[-1].get('peer')}")
        return {"peers": tuple(peers)}


# The peers decode the trained fixture converted to each framework: a model that accepts drafts (on
# the random lfm2-tiny every draft is rejected, so a comparison there never exercises a round).
PEER_TARGET: Final = "lfm2-trained"


def _peer_hf(config: BenchConfig, drafter_factory: Callable[[], Drafter]) -> dict[str, Any]:
    row: dict[str, Any] = {"peer": "transformers prompt lookup", "target": f"hf:{PEER_TARGET}"}
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        return {**row, "status": "skip", "reason": "install specproof[hf]"}
    for mod in ("specproof.engine.targets.hf", "specproof.engine.adapters.hf_prompt_lookup"):
        if importlib.util.find_spec(mod) is None:
            return {**row, "status": "skip", "reason": f"module not available: {mod}"}
    adapter = importlib.import_module("specproof.engine.adapters.hf_prompt_lookup")
    k = first_k(config)
    # the trained fixture converted to transformers: only specproof.plugins.load_target builds it (the hf
    # family's own load_spec refuses `lfm2-trained`); the peer drives that model, so both engines decode
    # the same weights
    target = load_target(f"hf:{PEER_TARGET}")
    peer = adapter.HFPromptLookupEngine(target, prompt_lookup_num_tokens=k)
    return {
        **row,
        **_compare_engines(config, target, peer.generate, drafter_factory, peer_model=getattr(peer, "model", None)),
    }


def _peer_hf_assisted(config: BenchConfig, drafter_factory: Callable[[], Drafter]) -> dict[str, Any]:
    """transformers' assisted generation (``assistant_model=`` trained-small, k draft tokens a round, constant
    schedule) against specproof's engine with ``ModelDrafter`` over the same assistant model."""
    row: dict[str, Any] = {"peer": "transformers assisted generation", "target": f"hf:{PEER_TARGET}"}
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        return {**row, "status": "skip", "reason": "install specproof[hf]"}
    import torch

    from specproof.engine.targets.convert import reference_to_hf_lfm2
    from specproof.engine.targets.hf import ByteTokenizer, HFTarget
    from specproof.fixtures import load_trained_small_target

    target = load_target(f"hf:{PEER_TARGET}")
    model = target.model  # type: ignore[attr-defined]
    small = reference_to_hf_lfm2(load_trained_small_target(f"max_context={target.max_context}"))
    for m in (small,):
        m.generation_config.bos_token_id = None
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
    k = first_k(config)
    small.generation_config.num_assistant_tokens = k
    small.generation_config.num_assistant_tokens_schedule = "constant"
    small.generation_config.assistant_confidence_threshold = 0.0
    assistant = HFTarget(small, tokenizer=ByteTokenizer(256), max_context=target.max_context, name="hf:trained-small")

    def assisted(prompt: Sequence[int], max_new_tokens: int, **_: object) -> list[int]:
        ids = torch.tensor([list(prompt)], dtype=torch.long)
        with torch.no_grad():
            out = model.generate(
                ids,
                assistant_model=small,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                pad_token_id=0,
                attention_mask=torch.ones_like(ids),
            )
        return [int(t) for t in out[0, len(prompt) :].tolist()]

    def ours() -> Drafter:
        return ModelDrafter(assistant, name="ModelDrafter(hf:trained-small)")  # type: ignore[arg-type]

    return {**row, **_compare_engines(config, target, assisted, ours, peer_model=model)}


def _replay_lookup() -> Drafter:
    """Prompt lookup for a replay-rollback target: a match of at least 2 tokens (``ngram:2,3``)."""
    return NgramDrafter(min_n=2, max_n=3)


def _peer_mlx(config: BenchConfig, drafter_factory: Callable[[], Drafter]) -> dict[str, Any]:
    row: dict[str, Any] = {"peer": "mlx-lm greedy", "target": f"mlx:{PEER_TARGET}"}
    if importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx_lm") is None:
        return {**row, "status": "skip", "reason": "install specproof[mlx]"}
    if importlib.util.find_spec("specproof.engine.targets.mlx") is None:
        return {**row, "status": "skip", "reason": "module not available: specproof.engine.targets.mlx"}
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    target = load_target(f"mlx:{PEER_TARGET}")
    model = target.model  # type: ignore[attr-defined]

    def mlx_greedy(prompt: Sequence[int], max_new_tokens: int, **_: object) -> Any:
        out: list[int] = []
        # generate_step without a sampler takes the argmax: mlx-lm's own greedy decoding
        for tok, _logprobs in generate_step(mx.array(list(prompt)), model, max_tokens=max_new_tokens):
            out.append(int(tok))
            if len(out) >= max_new_tokens:
                break
        return out

    return {**row, **_compare_engines(config, target, mlx_greedy, drafter_factory), **_mlx_speculative(target)}


def _mlx_speculative(target: Target) -> dict[str, Any]:
    """Whether mlx-lm's own speculative decoding (a draft model) runs on this hybrid; if not, its message."""
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step

    from specproof.engine.targets.convert import reference_to_mlx_lfm2
    from specproof.fixtures import load_trained_small_target

    draft = reference_to_mlx_lfm2(load_trained_small_target())
    try:
        for _ in speculative_generate_step(mx.array([104, 105, 32]), target.model, draft, max_tokens=4):  # type: ignore[attr-defined]
            pass
    except Exception as exc:  # mlx-lm refuses caches it cannot trim (the conv state of a hybrid)
        return {"mlx_speculative": f"refused: {type(exc).__name__}: {exc}"}
    return {"mlx_speculative": "runs"}


def _torch_threads(n: int | None) -> int | None:
    """Set torch's intra-op threads to ``n`` (when torch is loaded) and return the previous count."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    before = int(torch.get_num_threads())
    if n is not None:
        torch.set_num_threads(n)
    return before


def _compare_engines(
    config: BenchConfig,
    target: Target,
    peer_generate: Callable[..., Any],
    drafter_factory: Callable[[], Drafter],
    *,
    peer_model: Any = None,
) -> dict[str, Any]:
    """Tokens/s of specproof's engine over the peer's on one model: a sound comparison.

    One warm-up run of each engine (untimed: first-call allocation, lazy imports, kernel
    selection), then ``peer_repeats`` pairs, alternating which engine goes first, each
    decoding ``peer_tokens`` tokens from the same prompt, torch on one thread. The figure is
    the median of the per-pair ratios; min, max and spread ((max - min) / median) are
    reported with the load average before and after, so a noisy run shows as one. The warm-up
    runs also count model forwards (``_count_ours``, ``_count_peer``): the machine-independent part.
    """
    wl = build_workloads(("code-edit",), prompt_chars=config.prompt_chars)[0]
    n = min(config.peer_tokens, target.max_context // 4)
    # tiny peer models have short contexts: keep the prompt's end (the request) and room for n tokens
    prompt = encode_text(target, wl.text)[-(target.max_context - n - 1) :]
    k = first_k(config)
    rollback = "checkpoint" if callable(getattr(target, "forward_with_checkpoints", None)) else "replay"
    if rollback == "replay" and drafter_factory is NgramDrafter:
        # a rejected draft costs a replay forward on a target without checkpoints (mlx: targets, and hf: models
        # with a delta-rule state): prompt lookup drafts only on a match of >= 2 tokens
        drafter_factory = _replay_lookup
    threads_before = _torch_threads(1)
    try:
        decoder = default_decoder(target, drafter_factory(), k=k, rollback=rollback)

        def ours() -> tuple[float, tuple[int, ...]]:
            t0 = time.perf_counter()
            toks = decoder.generate(prompt, n).tokens
            return time.perf_counter() - t0, tuple(toks)

        def theirs() -> tuple[float, tuple[int, ...]]:
            t0 = time.perf_counter()
            got = peer_generate(prompt, n)
            return time.perf_counter() - t0, tuple(int(t) for t in getattr(got, "tokens", got))

        # warm-up (untimed), counting forwards: ours at a counting wrapper, the peer's at its model
        drafter = drafter_factory()
        counted, ours_forwards = _count_ours(target, drafter, prompt, n, k=k, rollback=rollback)
        peer_forwards = _count_peer(theirs, peer_model)
        ours()
        load_before = os.getloadavg()[0]
        ratios, ours_t, peer_t, ours_tokens, peer_tokens = _alternate(ours, theirs, config.peer_repeats)
        load_after = os.getloadavg()[0]
        threads = _torch_threads(None)
    finally:
        if threads_before is not None:
            _torch_threads(threads_before)
    median = statistics.median(ratios)
    return {
        "status": "ok",
        "workload": wl.name,
        "k": k,
        "rollback": rollback,
        "tokens": n,
        "pairs": len(ratios),
        "warmup": 1,
        "torch_threads": threads,
        "drafter": getattr(drafter, "name", type(drafter).__name__),
        "specproof_forwards": ours_forwards,
        "specproof_tokens_per_round": counted.stats.mean_tokens_per_round if counted.stats else None,
        "peer_forwards": peer_forwards,
        "tokens_per_second_ratio": median,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_spread": (max(ratios) - min(ratios)) / median if median else 0.0,
        "ratios": ratios,
        "specproof_tokens_per_second": len(ours_tokens) / statistics.median(ours_t),
        "peer_tokens_per_second": len(peer_tokens) / statistics.median(peer_t),
        "load_before": load_before,
        "load_after": load_after,
        "outputs_equal": ours_tokens == peer_tokens,
    }


Timed = Callable[[], tuple[float, tuple[int, ...]]]


def _count_ours(target: Target, drafter: Drafter, prompt: Sequence[int], n: int, *, k: int, rollback: str) -> Any:
    """specproof's generation at a counting wrapper: the generation and its decode forwards."""
    counting = CountingTarget(target)
    counted = default_decoder(counting, drafter, k=k, rollback=rollback).generate(prompt, n)  # type: ignore[arg-type]
    return counted, len(counting.decode_log(len(prompt)))


def _count_peer(theirs: Timed, peer_model: Any) -> int | None:
    """The peer's warm-up run, its model forwards counted with a forward hook (None: not a torch module)."""
    peer_calls: list[int] = []
    hook = None
    if callable(getattr(peer_model, "register_forward_hook", None)):
        hook = peer_model.register_forward_hook(lambda *_args: peer_calls.append(1))
    try:
        theirs()
    finally:
        if hook is not None:
            hook.remove()
    return len(peer_calls) - 1 if peer_calls else None  # less its prefill


def _alternate(ours: Timed, theirs: Timed, repeats: int) -> tuple[Any, ...]:
    """``repeats`` timed pairs, alternating which engine goes first: per-pair tokens/s ratios, both sides'
    seconds, and the last tokens of each."""
    ratios: list[float] = []
    ours_t: list[float] = []
    peer_t: list[float] = []
    ours_tokens: tuple[int, ...] = ()
    peer_tokens: tuple[int, ...] = ()
    for i in range(repeats):
        if i % 2 == 0:
            tp, peer_tokens = theirs()
            to, ours_tokens = ours()
        else:
            to, ours_tokens = ours()
            tp, peer_tokens = theirs()
        peer_t.append(tp)
        ours_t.append(to)
        ratios.append((len(ours_tokens) / to) / (len(peer_tokens) / tp) if peer_tokens and to > 0 else 0.0)
    return ratios, ours_t, peer_t, ours_tokens, peer_tokens


_PEER_NAMES: Final = {
    "_peer_hf": ("transformers prompt lookup", f"hf:{PEER_TARGET}", "hf"),
    "_peer_hf_assisted": ("transformers assisted generation", f"hf:{PEER_TARGET}", "hf"),
    "_peer_mlx": ("mlx-lm greedy", f"mlx:{PEER_TARGET}", "mlx"),
}


def _run_peer(fn: Callable[..., dict[str, Any]], config: BenchConfig, drafter_factory: Callable[[], Drafter]) -> dict:
    peer, target, extra = _PEER_NAMES.get(fn.__name__, (fn.__name__, "?", "?"))
    try:
        return fn(config, drafter_factory)
    except ImportError as exc:
        return {"peer": peer, "target": target, "status": "skip", "reason": f"install specproof[{extra}] ({exc})"}
    except Exception as exc:  # an installed peer that fails: its row says why, and the CLI fails the bench
        return {"peer": peer, "target": target, "status": "error", "reason": f"{type(exc).__name__}: {exc}"}
