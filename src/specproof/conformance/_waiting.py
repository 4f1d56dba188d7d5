"""A line of progress while a check waits on an engine: a hung engine is told, never silent.

``waiting(what)`` prints ``waiting for WHAT: N s so far (...)`` every ``NOTICE_EVERY`` seconds
while the call inside it has not returned. Under ``specproof certify`` the checks run inside
pytest, which captures what they print; the plugin installs a sink that prints outside the
capture (``set_sink``). How long an engine may take is the wire layer's one bound
(``$SPECPROOF_WIRE_TIMEOUT``); a search stops asking an engine that ran past it (``timed_out``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator

__all__ = ["NOTICE_EVERY", "set_sink", "timed_out", "waiting"]

NOTICE_EVERY = 10.0  # seconds between the lines of progress while a call waits (at most)


def _engine_timeout() -> float:
    """The one bound on a wire engine's answer: ``$SPECPROOF_WIRE_TIMEOUT``, as ``engine_from_spec``
    reads it (a value it refuses never gets this far), else its default."""
    import os

    from specproof.wire import DEFAULT_TIMEOUT  # (the default the wire layer applies)

    try:
        return float(os.environ.get("SPECPROOF_WIRE_TIMEOUT") or DEFAULT_TIMEOUT)
    except ValueError:
        return DEFAULT_TIMEOUT


_sink: Callable[[str], None] | None = None


def set_sink(sink: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """Where the lines go (None: stderr); the sink it replaces."""
    global _sink
    previous, _sink = _sink, sink
    return previous


def _say(text: str) -> None:
    sink = _sink
    if sink is not None:
        sink(text)
    else:
        print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def waiting(what: str) -> Iterator[None]:
    """While the body runs, a line every ``NOTICE_EVERY`` seconds (a third of the engine timeout,
    where that is shorter) saying what it waits for, for how long, and the bound."""
    done = threading.Event()
    timeout = _engine_timeout()
    every = min(NOTICE_EVERY, timeout / 3)
    bound = (
        f"an exec:/tcp: engine that does not answer within $SPECPROOF_WIRE_TIMEOUT = {timeout:g} s fails, "
        "and is not asked again in this search"
    )

    def tell() -> None:
        waited = 0.0
        while not done.wait(every):
            waited += every
            _say(f"waiting for {what}: {waited:.0f} s so far ({bound})")

    thread = threading.Thread(target=tell, name="specproof-waiting", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=1.0)


def timed_out(error: str | None) -> bool:
    """Whether a generation's error is an engine that did not answer in time (wire/_channel.py's
    words): asked again it would only be restarted and wait as long again."""
    return error is not None and "timed out after" in error
