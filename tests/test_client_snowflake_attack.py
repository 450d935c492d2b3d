"""The snowflake client's runs under attack (issue 25: the C ClockRun and the
Python run of _clock_run): close() racing a new run, the wall clock stepped
back, a refused renewal, a fork, a worker ID replaced. Each failed at 505275e.

Most use a node faked in-process (as tests/test_client_snowflake.py's fake_node):
no network, deterministic; the C run where the client's clock is the real one
(clock_ns=time.time_ns), the Python run where a test passes its own clock.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable

import pytest
from idpool_client import snowflake
from idpool_client.errors import IdPoolClosed, IdPoolRequestError, IdPoolUnavailable
from idpool_client.snowflake import SnowflakeClient, SnowflakeStopped, lease_clock

WORKER_BITS, SEQUENCE_BITS = 10, 12
SHIFT = WORKER_BITS + SEQUENCE_BITS

PostHook = Callable[[str, object], object]


def fake_node(
    client: SnowflakeClient,
    epoch_ms: int,
    *,
    unit_ms: int = 1,
    ttl_ms: int = 60_000,
    margin_ms: int = 2_000,
    renew: PostHook | None = None,
) -> list[int]:
    """Answers the client's grants (worker 7, then 8, 9, ...: a real node never
    grants a lost worker ID again with a floor below what it used), renewals
    (``renew``, else {}) and releases in-process. Answers the workers granted."""
    granted: list[int] = []

    def post(kind: str, path: str, payload: object, what: str, sent: object = None) -> object:
        if "/renew" in path:
            return renew(path, payload) if renew else {}
        if "/release" in path:
            return {}
        granted.append(7 + len(granted))
        return {
            "worker": granted[-1],
            "generation": len(granted),
            "secret": "s",
            "floor_ms": 0,
            "ttl_ms": ttl_ms,
            "margin_ms": margin_ms,
            "layout": {
                "time_bits": 41,
                "worker_bits": WORKER_BITS,
                "sequence_bits": SEQUENCE_BITS,
                "unit_ms": unit_ms,
                "epoch_ms": epoch_ms,
            },
        }

    client.transport._post = post  # type: ignore[method-assign,assignment]
    return granted


def worker_of(value: int) -> int:
    return (value >> SEQUENCE_BITS) & ((1 << WORKER_BITS) - 1)


def unit_starting_now() -> int:
    """An epoch that makes a 1 s unit start now: the run of the first ID lasts ~1 s."""
    return time.time_ns() // 1_000_000 - 10_000


# --- Finding 1: close() racing the slow path leaves a live run behind ----------


@pytest.mark.parametrize("path", ["c", "python"])
def test_close_racing_a_new_run_leaves_no_run_that_next_id_draws_from_after_close(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() ends and clears the runs under the client's lock, but a thread in
    _slow_id makes its run under the tag's lock only: a run stored just after the
    clear outlives close(), and next_id() after close() returned keeps drawing
    from it (the worker ID already released) until the unit ends, instead of
    raising IdPoolClosed. The hook below only widens the window between
    take_unit and the store; nothing else is changed."""
    clock = time.time_ns if path == "c" else (lambda: time.time_ns())
    ids = SnowflakeClient("http://127.0.0.1:1", clock_ns=clock)
    fake_node(ids, unit_starting_now(), unit_ms=1000)  # a run lasts ~1 s
    real = snowflake._clock_run
    inside, go = threading.Event(), threading.Event()

    def slow_clock_run(*args: object) -> object:
        inside.set()
        go.wait(5)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(snowflake, "_clock_run", slow_clock_run)
    first: list[int] = []
    drawer = threading.Thread(target=lambda: first.append(ids.next_id("t")))
    drawer.start()
    assert inside.wait(5)  # the drawer holds the tag's lock, its unit taken
    closer = threading.Thread(target=ids.close)
    closer.start()
    deadline = time.monotonic() + 5
    while not (ids._closed and not ids._runs) and time.monotonic() < deadline:
        time.sleep(0.001)  # close() has ended and cleared every run it saw
    go.set()
    drawer.join(5)
    closer.join(5)
    monkeypatch.setattr(snowflake, "_clock_run", real)
    assert first and not closer.is_alive()
    # close() has returned: every call from now on must raise
    after: list[int] = []
    for _ in range(3):
        try:
            after.append(ids.next_id("t"))
        except (IdPoolClosed, SnowflakeStopped):
            pass
    assert after == [], f"next_id after close() returned {after} ({ids._runs})"


# --- Finding 2: a wall clock stepped back keeps a run alive for the whole step --


def test_a_large_wall_clock_step_back_stops_next_id_as_it_stops_the_generator() -> None:
    """A run ended only when the wall clock reached its unit's end: a step back of
    S kept it going for S (here an hour) while the generator, and the server's,
    refuse at once (clock_behind, "a large step back stops the tag on that
    process"). A run now also ends one unit of real time after it was made (the
    lease clock), so the step stops the client within a unit, as if it had come
    that much later."""
    off = [0]
    ids = SnowflakeClient("http://127.0.0.1:1", clock_ns=lambda: time.time_ns() - off[0])
    fake_node(ids, time.time_ns() // 1_000_000 - 1000)  # 1 ms units
    first = ids.next_id("t")  # its unit's rest is the run now
    off[0] = 3600 * 10**9  # NTP (or an operator) steps the clock back an hour
    with pytest.raises(SnowflakeStopped, match="behind"):
        ids._held["t"].gen.take()  # the generator: clock_behind
    time.sleep(0.005)  # five units of real time: the run is over whatever the wall says
    try:
        got: int | str = ids.next_id("t")
    except SnowflakeStopped as e:
        got = str(e)
    ids.close()
    assert isinstance(got, str), (
        f"next_id handed out {got} (unit {got >> SHIFT}, the unit of {first >> SHIFT}) "
        "an hour after the clock went back, where the generator stops"
    )
    assert "behind" in got


def test_a_run_never_outlasts_the_lease_deadline_when_the_wall_clock_steps_back() -> None:
    """A run's end is the lease deadline converted to the wall clock when the run
    was made; a step back after that moves it later in real time. With renewals
    failing (no node answers), the client must stop at its deadline (grant sent +
    TTL - margin = 0.3 s here, "at most one unit's run past it"), but hands out
    IDs of the old run for as long as the step (10 s here), past the deadline and
    past the server's expiry (0.4 s)."""
    off = [0]

    def unreachable(path: str, payload: object) -> object:
        raise IdPoolUnavailable("renewal", [("http://fake", "connection refused")])

    ids = SnowflakeClient("http://127.0.0.1:1", clock_ns=lambda: time.time_ns() - off[0])
    fake_node(ids, time.time_ns() // 1_000_000 - 1000, ttl_ms=400, margin_ms=100, renew=unreachable)
    sent = lease_clock()
    ids.next_id("t")
    off[0] = 10 * 10**9  # stepped back 10 s
    late: list[int] = []
    while lease_clock() < sent + 0.6:
        started = lease_clock()
        try:
            value = ids.next_id("t")
        except SnowflakeStopped:
            time.sleep(0.001)
            continue
        if started > sent + 0.3 + 0.05:  # past the deadline, and a unit's grace
            late.append(value)
        time.sleep(0.001)
    ids.close()
    assert late == [], f"{len(late)} IDs handed out after the lease deadline"


# --- Finding 3: a refused renewal does not end the current run ----------------


def test_a_refused_renewal_ends_the_current_run_at_once() -> None:
    """Says "... and at once when a renewal is refused (409 worker_lost)" (module
    docstring; design "Why no worker ID has two holders", 2). The renewal thread
    sets gen.lost but leaves the run: next_id goes on handing out the lost worker
    ID's IDs from the C run until the run's end (the unit's, or the deadline's:
    up to a second with 1 s units)."""
    refused = threading.Event()

    def refuse(path: str, payload: object) -> object:
        refused.set()
        raise IdPoolRequestError("http://fake", 409, "worker_lost", "lost")

    ids = SnowflakeClient("http://127.0.0.1:1")  # the C run
    fake_node(ids, unit_starting_now(), unit_ms=1000, ttl_ms=400, margin_ms=100, renew=refuse)
    first = ids.next_id("t")
    assert worker_of(first) == 7
    assert refused.wait(2)  # first renewal, a quarter TTL on
    time.sleep(0.01)
    assert ids._held["t"].gen.lost is not None
    lost_worker: list[int] = []
    t0 = time.monotonic()
    while time.monotonic() < t0 + 0.1:
        try:
            value = ids.next_id("t")
        except SnowflakeStopped:
            continue
        if worker_of(value) == 7:
            lost_worker.append(value)
        time.sleep(0.0005)
    ids.close()
    assert lost_worker == [], f"{len(lost_worker)} IDs of the lost worker 7 after the refusal"


# --- Finding 4: a forked child makes its parent's IDs --------------------------


def test_a_forked_child_never_makes_the_ids_its_parent_makes() -> None:
    """A process that used a SnowflakeClient and forks (multiprocessing's default
    start method on Linux, gunicorn --preload, celery prefork) gives the child a
    copy of the worker ID, its generator and its live run: both hand out the same
    IDs. Nothing (os.register_at_fork, a pid check at the slow path) makes the
    child take a worker ID of its own. Not new in 505275e (the generator was
    copied before too), but a run lives across the fork now."""
    ids = SnowflakeClient("http://127.0.0.1:1")
    fake_node(ids, unit_starting_now(), unit_ms=1000)
    ids.next_id("t")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            got = [ids.next_id("t") for _ in range(50)]
            os.write(w, json.dumps(got).encode())
        finally:
            os._exit(0)
    os.close(w)
    mine = [ids.next_id("t") for _ in range(50)]
    os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as f:
        theirs = json.loads(f.read())
    ids.close()
    assert len(theirs) == 50
    both = set(mine) & set(theirs)
    assert not both, f"{len(both)} IDs handed out by both the parent and its forked child"


# --- Finding 5: next_ids takes any count ---------------------------------------


@pytest.mark.parametrize("n", [0, -3])
def test_next_ids_refuses_a_count_below_one_as_the_segment_client_does(n: int) -> None:
    """IdPoolClient.next_ids raises ValueError for n < 1 (and a node's /ids
    answers 400); SnowflakeClient.next_ids takes a worker ID and answers []."""
    ids = SnowflakeClient("http://127.0.0.1:1")
    fake_node(ids, unit_starting_now())
    try:
        with pytest.raises(ValueError):
            ids.next_ids("t", n)
    finally:
        ids.close()


# --- Finding 7: a new worker ID after a loss can go back within one thread -----


def test_ids_rise_within_a_thread_across_a_lost_worker_id_and_its_replacement() -> None:
    """After a refused renewal the client takes a new worker ID, whose generator
    starts from that worker ID's own floor, not from the unit the lost one last
    used. A node grants the lowest free worker ID: when it is below the lost one
    and the grant lands in the same unit (1 s units here; the refused renewal's
    run goes on to its end, finding 3), the thread's next ID (U, 3, 0) is below
    its previous (U, 9, s): "IDs strictly increasing within one thread" broken."""
    workers = iter([9, 3, 2, 1])

    def refuse(path: str, payload: object) -> object:
        raise IdPoolRequestError("http://fake", 409, "worker_lost", "lost")

    ids = SnowflakeClient("http://127.0.0.1:1")
    fake_node(ids, unit_starting_now(), unit_ms=1000, ttl_ms=400, margin_ms=100, renew=refuse)
    granted = ids.transport._post

    def post(kind: str, path: str, payload: object, what: str, sent: object = None) -> object:
        answer = granted(kind, path, payload, what, sent)  # type: ignore[arg-type]
        if "/renew" in path or "/release" in path:
            return answer
        assert isinstance(answer, dict)
        return {**answer, "worker": next(workers)}  # the lowest free one: lower now

    ids.transport._post = post  # type: ignore[method-assign,assignment]
    previous, fell = 0, []
    t0 = time.monotonic()
    while time.monotonic() < t0 + 0.5:  # within the first 1 s unit
        try:
            value = ids.next_id("t")
        except SnowflakeStopped:
            continue
        if value <= previous:
            fell.append((previous, value))
        previous = value
        time.sleep(0.0005)
    ids.close()
    assert fell == [], f"IDs went back within one thread: {fell[:3]}"
