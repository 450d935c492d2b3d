"""The fault-injection suite's short form (ops/faults), as a test.

Every scenario runs real processes: a private mariadbd and redis-server, three
`idpool serve` nodes and a standalone `idpool preload`, and client threads that
record every ID. It fails on any duplicate, on any request that got no ID on
any node, and on any failed attempt a scenario does not allow: none at all when
a store is down or restarts (the other store carries the load), only "node gone"
errors and 503 draining, retried on another node, when a node is killed or
stopped. "mixed" and "both-down" are left to `ops/faults` itself (time; both
stores down is also tested in test_app.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.faultsuite.faults import NODE_GONE, SCENARIOS
from ops.faultsuite.runner import build_parser, run

pytestmark = pytest.mark.slow

NOT_HERE = ("mixed", "both-down")
STORE_FAULTS = {s.name for s in SCENARIOS} - {"node-kill9", "node-sigterm", *NOT_HERE}


def test_no_duplicate_and_no_failed_request_under_faults(tmp_path: Path) -> None:
    names = [s.name for s in SCENARIOS if s.name not in NOT_HERE]
    argv = ["--workdir", str(tmp_path), "--seed", "3"]
    for name in names:
        argv += ["--scenario", name]
    reports: list[str] = []
    outcomes = run(build_parser().parse_args(argv), "ops/faults " + " ".join(argv), reports.append)
    report = "\n".join(reports)
    assert [o.scenario.name for o in outcomes] == names, report
    for o in outcomes:
        name, acc, tally = o.scenario.name, o.accounting, o.tally
        assert acc.duplicates == 0, f"{name}: duplicates {acc.duplicate_examples}\n{report}"
        assert acc.pool_overlaps_issued == 0, f"{name}: handed-out IDs still pooled\n{report}"
        assert acc.issued >= 10_000, f"{name}: too little traffic to mean anything\n{report}"
        assert tally.failed_requests == 0, f"{name}: a request failed on every node\n{report}"
        if name in STORE_FAULTS:
            assert not tally.failed_attempts, f"{name}: {tally.failed_attempts}\n{report}"
        else:
            allowed = NODE_GONE | {"503 draining"}
            assert set(tally.failed_attempts) <= allowed, f"{name}\n{report}"
        assert o.failures == [], f"{name}: {o.failures}\n{report}"
