"""A worker the campaign itself stops is reported as stopped by the campaign, not as if the
out-of-memory killer had struck (issue 27): after ``--for`` a worker still in a check is sent
SIGTERM, then SIGKILL; the report says "terminated by the campaign after N s (SIGKILL)". The
out-of-memory hint stays for a SIGKILL the campaign did not send.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from typing import Any

import pytest

from specproof.conformance._campaign import (
    CampaignOptions,
    CampaignState,
    WorkerState,
    _Channel,
    _stop_workers,
    describe_exit,
)

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")


def _busy(conn: Any, ignore_term: bool) -> None:  # a worker still in a check: it never answers
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn.send(("seed", 0, 7))
    while True:
        time.sleep(0.05)


def _stopped_worker(*, ignore_term: bool) -> WorkerState:
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_busy, args=(child, ignore_term), daemon=True)
    process.start()
    child.close()
    state = CampaignState(options=CampaignOptions(plan={}, db=None, hypothesis_dir="/nonexistent", workers=1))
    state.workers = [WorkerState(index=0)]
    try:
        _stop_workers([_Channel(process, parent)], state, time.perf_counter(), 0.0, None)
    finally:
        if process.is_alive():
            process.kill()
        process.join(5)
    return state.workers[0]


def test_a_worker_the_campaign_kills_is_reported_as_killed_by_the_campaign() -> None:
    worker = _stopped_worker(ignore_term=True)  # SIGTERM ignored: the campaign sends SIGKILL
    assert worker.exitcode == -signal.SIGKILL and worker.seed == 7
    assert worker.lost is not None
    assert "terminated by the campaign after" in worker.lost and "(SIGKILL)" in worker.lost, worker.lost
    assert "out-of-memory" not in worker.lost, worker.lost


def test_a_worker_that_ends_on_the_campaigns_sigterm_says_so() -> None:
    worker = _stopped_worker(ignore_term=False)
    assert worker.exitcode == -signal.SIGTERM
    assert worker.lost is not None and "terminated by the campaign after" in worker.lost, worker.lost
    assert "(SIGTERM)" in worker.lost and "out-of-memory" not in worker.lost


def test_a_sigkill_the_campaign_did_not_send_keeps_the_out_of_memory_hint() -> None:
    assert "out-of-memory killer" in describe_exit(-signal.SIGKILL)
    assert "out-of-memory killer" in describe_exit(-signal.SIGKILL, sent=[signal.SIGTERM])
    assert describe_exit(-signal.SIGKILL, sent=[signal.SIGTERM, signal.SIGKILL], after=21.4) == (
        "terminated by the campaign after 21 s (SIGKILL)"
    )
    assert describe_exit(-signal.SIGTERM) == "killed by SIGTERM"
    assert describe_exit(3, sent=[signal.SIGTERM]) == "exited with status 3"
