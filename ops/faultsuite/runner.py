"""Run the scenarios and print the report.

Each scenario gets a fresh Redis, a tag of its own in the run's private MariaDB,
three nodes and a standalone preloader; clients draw IDs while faults are
injected; then everything stops gracefully and every ID of the tag is accounted
for. The exit code is 1 when any scenario failed (any duplicate, above all).
"""

from __future__ import annotations

import argparse
import random
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from ops.toolkit import GaleraCluster, MariaPair, MariaServer

from .accounting import Accounting, account, parse_ranges
from .cluster import STEP, Cluster
from .faults import SCENARIOS, Scenario
from .order import OrderLog, OrderReport
from .recorder import Clients, IdBitmap, Tally
from .snowflake import SnowflakeIds, account_snowflake

# Short form: each scenario warms up, takes one fault (three in "mixed"), recovers.
CI_WARMUP = 1.5
CI_HOLD = 3.0
CI_RECOVER = 2.0
CI_MIXED_FAULTS = 3
SETUP_SECONDS = 5.0  # rough cost of starting and stopping one scenario's processes
# --strict: scenarios whose fault must meet a claim made after it (a rewound or
# promoted ledger), so their strict states hold a few seconds, not the default 30
STRICT_SOON = ("mysql-rewind", "redis-blip-mysql-rewind", "mysql-replica")
# --strict: seconds in a row requests may fail while Redis is away (the short
# form holds a fault 3 s; a hung Redis costs a call its 2 s timeout on top)
STRICT_FAILURE_BUDGET = 15.0


@dataclass
class Outcome:
    scenario: Scenario
    seconds: float
    events: list[tuple[float, str]]
    tally: Tally
    accounting: Accounting
    problems: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    order: OrderReport | None = None  # strict tags: the real-time order check


def faults_to_inject(
    long_form: bool, seconds: float, rng: random.Random, mixed: bool
) -> Iterator[tuple[float, float]]:
    """(pause before the fault, hold) pairs: a fixed few in the short form; in the
    long form, drawn from ``rng`` until the scenario's ``seconds`` are used up
    (faults that restart a process take a while, so their number varies)."""
    if not long_form:
        for i in range(CI_MIXED_FAULTS if mixed else 1):
            yield (CI_WARMUP if i == 0 else 1.0, CI_HOLD)
        return
    deadline = time.monotonic() + seconds - CI_RECOVER
    first = True
    while True:
        gap, hold = rng.uniform(2.0, 8.0), rng.uniform(1.0, 10.0)
        if first:
            gap, first = CI_WARMUP, False
        elif time.monotonic() + gap + hold + 2.0 > deadline:
            return
        yield gap, hold


def _cluster_for(
    scenario: Scenario,
    ledger: MariaServer | MariaPair | GaleraCluster,
    tag: str,
    directory: Path,
    args: argparse.Namespace,
) -> Cluster:
    env = dict(scenario.env)
    if args.strict and scenario.name in STRICT_SOON:
        # a strict state holds IDPOOL_RESERVE_SECONDS of supply: claims come that often
        env["IDPOOL_RESERVE_SECONDS"] = "4"
    return Cluster(
        directory / scenario.name,
        ledger,
        tag,
        scenario.redis_mode,
        args.nodes,
        sentinel=scenario.topology == "sentinel",
        redis_cluster=scenario.topology == "cluster",
        database="faults_" + scenario.name.replace("-", "_"),
        env_overrides=env,
        idle_tags=args.idle_tags,
        strict=args.strict,
        kind=scenario.kind,
        step=scenario.step or STEP,
    )


def _inject_faults(
    scenario: Scenario, cluster: Cluster, rng: random.Random, timed: bool, seconds: float
) -> None:
    """The scenario's faults at random moments; stops at the first that fails."""
    for pause, hold in faults_to_inject(timed, seconds, rng, scenario.name == "mixed"):
        time.sleep(pause)
        fault = rng.choice(scenario.faults)
        cluster.note(f"fault {fault.__name__} (hold {hold:.1f}s)")
        try:
            fault(cluster, rng, hold)
        except Exception as e:  # e.g. a node that would not restart: report it
            cluster.problems.append(f"{fault.__name__} failed: {type(e).__name__}: {e}")
            cluster.ensure_stores_up()
            return


def run_scenario(
    scenario: Scenario,
    maria: MariaServer,
    directory: Path,
    rng: random.Random,
    args: argparse.Namespace,
    seconds: float,
) -> Outcome:
    tag = f"{scenario.name}-{rng.randrange(10**6):06d}"
    started = time.monotonic()
    ledger: MariaServer | MariaPair | GaleraCluster = maria
    if scenario.topology == "mysql-replica":
        ledger = MariaPair(directory / scenario.name / "mariadb")
    elif scenario.topology == "galera":
        ledger = GaleraCluster(3)  # a temp dir of its own, owned by mysql (the rsync SST)
    cluster = _cluster_for(scenario, ledger, tag, directory, args)
    order = OrderLog() if args.strict else None
    try:
        if isinstance(ledger, MariaPair | GaleraCluster):
            ledger.start()
        cluster.start()
        start_id, _ = cluster.ledger_row()
        snowflakes = SnowflakeIds() if scenario.kind == "snowflake" else None
        bitmap = IdBitmap(start_id)
        clients = Clients(
            cluster.ports,
            tag,
            bitmap if snowflakes is None else snowflakes,
            threads=args.clients,
            rate=args.rate,
            seed=rng.randrange(2**31),
            origin=cluster.started_at,
            order=order,
        )
        clients.start()
        try:
            _inject_faults(scenario, cluster, rng, args.duration is not None, seconds)
            time.sleep(CI_RECOVER)
        finally:
            clients.stop()
            cluster.note("clients stopped")
        problems = cluster.problems + cluster.stop()
        if snowflakes is not None:
            result = account_snowflake(snowflakes, cluster.runs(), tag)
            bad, examples = snowflakes.order_violations(clients.tally.max_request_latency)
            if bad:
                problems.append(f"{bad} batches not above IDs received a second before: {examples}")
        else:
            start_id, max_id = cluster.ledger_row()
            pool, clean = read_pool(cluster)
            pool += read_strict_state(cluster)
            result = account(bitmap, start_id, max_id, pool, clean, cluster.runs(), tag)
    finally:
        cluster.close()
        if isinstance(ledger, MariaPair | GaleraCluster):
            ledger.stop()
    outcome = Outcome(
        scenario,
        time.monotonic() - started,
        cluster.events,
        clients.tally,
        result,
        problems,
        order=None if order is None else order.check(),
    )
    outcome.failures = judge(outcome, strict=args.strict)
    return outcome


def read_pool(cluster: Cluster) -> tuple[list[tuple[int, int]], bool]:
    """The tag's list, and whether the server holding it cleaned it in its current
    incarnation (only then do its ranges count)."""
    client = cluster.redis_client()
    run_id = client.info("server")["run_id"]
    replid = client.info("replication")["master_replid"]
    marker = client.get(f"idpool:{{{cluster.tag}}}:clean")
    clean = (marker.decode() if isinstance(marker, bytes) else marker) == f"{run_id}:{replid}"
    texts = client.lrange(f"idpool:{{{cluster.tag}}}:pool", 0, -1)
    ranges = [r for t in texts for r in parse_ranges(t.decode() if isinstance(t, bytes) else t)]
    return ranges, clean


def read_strict_state(cluster: Cluster) -> list[tuple[int, int]]:
    """A strict tag's ready IDs ``[next, limit)``, when its state is of the Redis
    incarnation running now (a state of an older one is never served)."""
    client = cluster.redis_client()
    run_id = client.info("server")["run_id"]
    replid = client.info("replication")["master_replid"]
    raw: dict[bytes, bytes] = client.hgetall(f"idpool:{{{cluster.tag}}}:strict")  # type: ignore[assignment]
    state = {k.decode(): v.decode() for k, v in raw.items()}
    if state.get("inc") != f"{run_id}:{replid}" or "next" not in state:
        return []
    start, end = int(state["next"]), int(state["limit"])
    return [(start, end)] if start < end else []


def strict_allowances(scenario: Scenario) -> Scenario:
    """A strict tag needs Redis for every request: while Redis is away its
    requests get 503 naming Redis (a node cannot be strict from memory), so the
    scenarios that take Redis away may fail requests for the fault's length.
    They fail the moment Redis goes, before another store does: the first 503
    names Redis (and the other stores the node's probe already found down)."""
    if not any(f.__name__.startswith(("redis", "both")) for f in scenario.faults):
        return scenario
    return replace(
        scenario,
        tolerated=scenario.tolerated | {"503 unavailable"},
        failure_budget=max(scenario.failure_budget, STRICT_FAILURE_BUDGET),
        names_down=tuple(store for store in scenario.names_down if store == "redis"),
    )


def judge(outcome: Outcome, strict: bool = False) -> list[str]:
    acc, tally, scenario = outcome.accounting, outcome.tally, outcome.scenario
    if strict:
        scenario = strict_allowances(scenario)
    failures = []
    if outcome.order is not None and not outcome.order.ok:
        failures.append(outcome.order.summary())
        failures += [f"  {example}" for example in outcome.order.examples[:5]]
    if acc.duplicates:
        failures.append(
            f"{acc.duplicates} duplicate IDs handed out, e.g. {acc.duplicate_examples[:5]}"
        )
    if acc.pool_overlaps_issued:
        failures.append(f"{acc.pool_overlaps_issued} IDs handed out are still in the Redis list")
    if acc.beyond_ledger:
        failures.append(f"{acc.beyond_ledger} IDs handed out at or above the ledger's max_id")
    windows = tally.failure_windows()
    longest = max((b - a for a, b in windows), default=0.0)
    if tally.failed_requests and not scenario.names_down:
        if not scenario.failure_budget or longest > scenario.failure_budget:
            failures.append(
                f"{tally.failed_requests} requests failed on every node they tried "
                f"(longest stretch {longest:.1f} s; allowed {scenario.failure_budget:g} s)"
            )
    for status, message in tally.messages.items():
        missing = [store for store in scenario.names_down if store not in message]
        if status.startswith("503 unavailable") and missing:
            failures.append(f"503 message does not name {missing}: {message!r}")
        named = "redis" in message or "mysql" in message
        if strict and status.startswith("503 unavailable") and not named:
            failures.append(f"503 message names no store: {message!r}")
    if tally.failed_attempts and tally.requests_since_failure < 100:
        failures.append(
            f"only {tally.requests_since_failure} requests served after the last failure: "
            "not recovered"
        )
    bad = {k: n for k, n in tally.failed_attempts.items() if k not in scenario.tolerated}
    if bad:
        failures.append(f"failed attempts not expected in this scenario: {dict(bad)}")
    for event in scenario.expect_events:
        if not acc.log_events[event]:
            failures.append(f"no event={event} logged: the fault did not do what it should")
    if tally.requests == 0:
        failures.append("no request succeeded")
    failures += outcome.problems
    return failures


def render(outcome: Outcome, hold_note: str) -> str:
    acc, tally, sc = outcome.accounting, outcome.tally, outcome.scenario
    lines = [
        f"== {sc.name}: {sc.what.replace('HOLD', hold_note)}",
        f"   verdict: {'FAIL' if outcome.failures else 'ok'}"
        + "".join(f"\n     - {f}" for f in outcome.failures),
        "   timeline (s from cluster start):",
        *(f"     {t:7.2f}  {what}" for t, what in outcome.events),
        f"   ledger: start_id={acc.start_id} max_id={acc.max_id}: {acc.claimed:,} IDs claimed"
        + (f" (step {sc.step})" if sc.step else "")
        if sc.kind == "segment"
        else "   snowflake tag: no ranges; every ID checked for duplicates and time order "
        "(one received over a second after another is larger)",
        f"   handed out: {acc.issued:,} IDs in {tally.requests:,} requests; "
        f"duplicates: {acc.total_duplicates}",
        *([f"   strict tag: {outcome.order.summary()}"] if outcome.order is not None else []),
        f"   in the Redis list (or strict state) at the end: {acc.in_pool:,} IDs"
        + ("" if acc.pool_clean else " (incarnation not cleaned yet: counted as waste)"),
    ]
    wasted = sum(acc.wasted.values()) + sum(b - a for a, b in acc.unattributed)
    share = wasted / acc.claimed * 100 if acc.claimed else 0.0
    lines.append(f"   wasted: {wasted:,} IDs ({share:.2f}% of claimed)")
    for reason, ids in sorted(acc.wasted.items(), key=lambda kv: -kv[1]):
        lines.append(f"     {ids:>12,}  {reason}")
    if acc.unattributed:
        runs = acc.unattributed
        examples = ", ".join(f"{a}-{b - 1}" for a, b in runs[:4])
        lines.append(
            f"     {sum(b - a for a, b in runs):>12,}  not attributed to any log line "
            f"({len(runs)} runs, e.g. {examples})"
        )
    failed = ", ".join(f"{k}: {n}" for k, n in sorted(tally.failed_attempts.items())) or "none"
    lines += [
        f"   failed attempts (retried on another node): {failed}; "
        f"requests failed on every node: {tally.failed_requests}; "
        f"served after the last failure: {tally.requests_since_failure:,}"
        + "".join(
            f"\n   requests failed from t={a:.1f} to t={b:.1f} s"
            for a, b in tally.failure_windows()
        ),
        *(f"   first {k} message: {m[:160]!r}" for k, m in sorted(tally.messages.items())),
        f"   longest stall: {tally.max_latency:.3f} s (one attempt, at "
        f"t={tally.max_latency_at:.1f}); longest request with retries: "
        f"{tally.max_request_latency:.3f} s",
        f"   attempt latency: p50 <= {tally.quantile(0.5) * 1000:g} ms, "
        f"p99 <= {tally.quantile(0.99) * 1000:g} ms, p99.9 <= {tally.quantile(0.999) * 1000:g} ms",
        "   log events: " + ", ".join(f"{e}={acc.log_events[e]}" for e in _EVENTS[sc.kind]),
        f"   took {outcome.seconds:.1f} s",
    ]
    return "\n".join(lines)


# The log events a scenario's report counts, by the kind of its tag.
_EVENTS = {
    "segment": (
        "range_abandoned",
        "stale_ledger",
        "pool_pop_failed",
        "request_failed",
        "preload_failed",
        "preload_skipped",
        "store_down",
    ),
    "snowflake": (
        "worker_granted",
        "worker_renew_failed",
        "worker_lease_lost",
        "worker_released",
        "clock_behind",
        "request_failed",
        "store_down",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ops/faults",
        description="Fault-injection suite: real idpool nodes, Redis and MariaDB on loopback.",
    )
    parser.add_argument(
        "--duration",
        type=float,
        help="long form: total seconds, split across the scenarios, faults at random "
        "(default: the short CI form, one fault per scenario)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of every random choice")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[s.name for s in SCENARIOS],
        help="run only this scenario (repeatable)",
    )
    parser.add_argument("--nodes", type=int, default=3, help="idpool serve nodes (default 3)")
    parser.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    parser.add_argument(
        "--rate", type=float, default=200.0, help="requests per second, all clients (default 200)"
    )
    parser.add_argument(
        "--idle-tags",
        type=int,
        default=0,
        help="also configure this many tags nobody asks for (default 0; issue 11: 1000)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="make each scenario's tag strict (issue 21) and check the real-time order "
        "of every answer (ops/faultsuite/order.py)",
    )
    parser.add_argument("--workdir", type=Path, help="keep logs and data here (default: temp)")
    parser.add_argument("--output", type=Path, help="also write the report to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "ops/faults " + shlex.join(sys.argv[1:] if argv is None else argv)
    outcomes = run(args, command)
    return 1 if any(o.failures for o in outcomes) else 0


def run(
    args: argparse.Namespace, command: str, say: Callable[[str], None] = print
) -> list[Outcome]:
    """Run the chosen scenarios; print each report as it is done (and write them
    to ``args.output``). Logs are kept when asked for or when a scenario failed."""
    scenarios = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    rng = random.Random(args.seed)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="idpool-faults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    header = "\n".join(
        [
            f"$ {command}",
            f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {len(scenarios)} scenarios, "
            f"{args.nodes} nodes + 1 standalone preloader each, {args.clients} client threads "
            f"at <= {args.rate:g} requests/s (30% /id, 70% /ids?count=1..100), "
            f"step {STEP} (unless a scenario says), "
            f"seed {args.seed}; {args.idle_tags} idle tags beside; "
            + ("strict tags, real-time order checked; " if args.strict else "")
            + f"logs in {workdir}"
            + ("" if args.workdir else " (removed at the end if every scenario passed)"),
        ]
    )
    parts = [header]
    say(header)
    per_scenario = 0.0
    hold_note = f"{CI_HOLD:g}"
    if args.duration is not None:
        per_scenario = max(20.0, args.duration / len(scenarios) - SETUP_SECONDS)
        hold_note = "1-10 (random)"
    maria = MariaServer(workdir / "mariadb").start()
    outcomes: list[Outcome] = []
    try:
        for scenario in scenarios:
            outcome = run_scenario(scenario, maria, workdir, rng, args, per_scenario)
            outcomes.append(outcome)
            parts.append(render(outcome, hold_note))
            say(parts[-1])
    finally:
        if maria.proc is None:
            maria.start()  # a scenario failed with MariaDB down: start it to stop it cleanly
        maria.resume()
        maria.stop()
    parts.append(summarize(outcomes))
    say(parts[-1])
    if args.output:
        args.output.write_text("\n".join(parts) + "\n")
    if not any(o.failures for o in outcomes) and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return outcomes


def summarize(outcomes: list[Outcome]) -> str:
    lines = [
        "== summary",
        f"   {'scenario':<23} {'handed out':>12} {'dup':>4} {'order':>5} {'wasted':>10} "
        f"{'failed att.':>11} {'failed req.':>11} {'max stall':>9}  verdict",
    ]
    for o in outcomes:
        a, t = o.accounting, o.tally
        wasted = sum(a.wasted.values()) + sum(b - x for x, b in a.unattributed)
        order = "-" if o.order is None else str(o.order.violations + o.order.unordered_batches)
        lines.append(
            f"   {o.scenario.name:<23} {a.issued:>12,} {a.total_duplicates:>4} {order:>5} "
            f"{wasted:>10,} "
            f"{sum(t.failed_attempts.values()):>11} {t.failed_requests:>11} "
            f"{t.max_latency:>8.3f}s  {'FAIL' if o.failures else 'ok'}"
        )
    total_dups = sum(o.accounting.total_duplicates for o in outcomes)
    failed = [o.scenario.name for o in outcomes if o.failures]
    lines.append(
        f"   duplicates in all scenarios: {total_dups}; "
        + (f"FAILED: {', '.join(failed)}" if failed else "every scenario ok")
    )
    return "\n".join(lines)
