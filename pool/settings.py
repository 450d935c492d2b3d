"""One settings object, read from ``IDPOOL_*`` environment variables.

Every field has a default that works against the MariaDB and Redis on a
developer machine (127.0.0.1, root without a password).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from .errors import ConfigError

ENV_PREFIX = "IDPOOL_"
HTTP_SERVERS = ("granian", "uvicorn")  # IDPOOL_HTTP: what `idpool serve` runs


# Other variables a setting is read from when its own is unset: a better name
# (the ledger may be SQLite), or the old one (a "lease" is now a client's range).
ENV_ALIASES = {
    "mysql_url": ("IDPOOL_LEDGER_URL",),
    "leader_seconds": ("IDPOOL_LEASE_SECONDS",),
}


@dataclass(frozen=True)
class MysqlParams:
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str


@dataclass(frozen=True)
class SentinelParams:
    """A ``redis+sentinel://`` URL: where the Sentinels are, and what to ask them for."""

    sentinels: tuple[tuple[str, int], ...]
    service: str  # the master's name in the Sentinels' configuration (`sentinel monitor NAME`)
    db: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # of the data nodes
    sentinel_password: str | None = field(default=None, repr=False)  # of the Sentinels


@dataclass(frozen=True)
class ClusterParams:
    """A ``redis+cluster://`` URL: seed nodes of a Redis Cluster, and its credentials."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False  # rediss+cluster://


CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
CLUSTER_PORT = 6379
_CLUSTER_FORM = (
    "IDPOOL_REDIS_URL: a Redis Cluster URL looks like "
    "redis+cluster://[:password@]host1:6379,host2:6379 (rediss+cluster:// for TLS)"
)

SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379
_SENTINEL_FORM = (
    "IDPOOL_REDIS_URL: a Sentinel URL looks like "
    "redis+sentinel://[:password@]host1:26379,host2:26379/mymaster[/db]"
    "[?sentinel_password=...]"
)


@dataclass(frozen=True)
class Settings:
    # IDPOOL_MYSQL_URL (or IDPOOL_LEDGER_URL): the ledger; mysql://user:password@host:port/
    # database, or sqlite:///path/file.db for the embedded mode (one node; ledger and pool in that
    # file, Redis not used). Never chosen unless named here or by `serve --embedded`.
    mysql_url: str = field(default="mysql://root@127.0.0.1:3306/idpool", repr=False)
    # IDPOOL_REDIS_URL: the shared pool; redis://[:password@]host:port/db, or behind
    # Sentinel: redis+sentinel://[:password@]host1:26379,host2:26379/mymaster/db
    # (password: the data nodes'; ?sentinel_password=...: the Sentinels', if they have one),
    # or a Redis Cluster: redis+cluster://[:password@]host1:6379,host2:6379 (seed nodes;
    # rediss+cluster:// for TLS)
    redis_url: str = field(default="redis://127.0.0.1:6379/0", repr=False)
    # IDPOOL_REDIS_MARK_REPLICAS: replicas that must acknowledge (WAIT) a raised
    # high-water mark before the range it covers is served, online or not (a replica
    # cut off from its primary may still be promoted); 0 does not wait. Set it to 1
    # under Sentinel or on a Redis Cluster (each mark waits for its own shard's
    # replicas) so a failover to a lagging replica cannot lose a mark. While a primary
    # has fewer replicas, no range is claimed: run one replica more than this.
    redis_mark_replicas: int = 0
    # IDPOOL_REDIS_PREFIX: first part of every Redis key (see pool/keys.py)
    redis_prefix: str = "idpool"
    # IDPOOL_CREATE_DATABASE: `serve` and `preload` create the database and table if missing
    create_database: bool = True
    # IDPOOL_DEFAULT_STEP: range size for tags added without --step
    default_step: int = 1000
    # IDPOOL_PREFETCH_AT: fraction of the current range used before the next is fetched;
    # 1 turns the prefetch off (a single buffer, refilled when empty: requests then wait)
    prefetch_at: float = 0.1
    # IDPOOL_RESERVE_SECONDS: each node keeps at least this many seconds of its own
    # consumption per tag in memory. A new range needs Redis (for the high-water
    # mark), so this is how long a node rides out Redis being down or failing over.
    reserve_seconds: float = 30.0
    # IDPOOL_MAX_COUNT: largest count accepted by GET /ids/{tag}
    max_count: int = 10_000
    # IDPOOL_PRELOAD: run the preloader job inside each service process
    preload: bool = True
    # IDPOOL_POOL_DEPTH: fewest ranges the preloader keeps in each tag's Redis list
    pool_depth: int = 4
    # IDPOOL_POOL_SECONDS: supply to keep in the list, in seconds of recent consumption
    # (Leaf's advice: enough to ride out a 10-minute database outage)
    pool_seconds: float = 600.0
    # IDPOOL_MAX_POOL_DEPTH: most ranges kept in one tag's list, whatever the rate
    max_pool_depth: int = 10_000
    # IDPOOL_STEP_SECONDS: how long one range should last at a node; the preloader
    # doubles a tag's step when ranges last less, halves it when they last over twice
    # as long (within the tag's min_step and max_step). 0 turns the dynamic step off.
    step_seconds: float = 900.0
    # IDPOOL_RATE_WINDOW: seconds of history behind the consumption rate
    rate_window: float = 60.0
    # IDPOOL_PRELOAD_INTERVAL: seconds between preloader ticks
    preload_interval: float = 1.0
    # IDPOOL_LEADER_SECONDS (or its old name IDPOOL_LEASE_SECONDS): how long the active
    # preloader's leadership lasts unless renewed (each tick renews it); a standby
    # takes over this long after the leader died
    leader_seconds: float = 10.0
    # IDPOOL_SWEEP_SECONDS: how often the active preloader reads every list's depth
    # (one pipelined round) and fills those under IDPOOL_POOL_DEPTH; between sweeps
    # it visits only the tags that moved
    sweep_seconds: float = 60.0
    # IDPOOL_REPORT_SECONDS: how often a node reports the IDs it handed out per tag
    # (the consumption the pool is sized by)
    report_seconds: float = 2.0
    # IDPOOL_STORE_TIMEOUT: seconds a single MySQL or Redis call may take
    store_timeout: float = 2.0
    # IDPOOL_UNKNOWN_TAG_TTL: a request for a tag the node does not know makes it reload
    # the ledger's tag list, at most once per this many seconds (however many names)
    unknown_tag_ttl: float = 1.0
    # IDPOOL_TAG_RELOAD_SECONDS: how often a node reads again the rows of the tags it
    # serves and every token; a tag disabled by an operator stops being served at
    # every node that serves it within this (the whole list is read once a minute)
    tag_reload_seconds: float = 5.0
    # IDPOOL_IDLE_SECONDS: a tag not requested at a node for this long has its buffer
    # returned to the pool and dropped there (0 keeps buffers until shutdown)
    idle_seconds: float = 300.0
    # IDPOOL_ADVERTISE: host:port this node shows in the cluster view (`idpool serve`
    # sets it to its --host:--port when unset)
    advertise: str = ""
    # IDPOOL_ADMIN_TOKEN: bearer token for the admin API; empty turns the admin API off
    admin_token: str = field(default="", repr=False)
    # IDPOOL_CLIENT_LEASE_SECONDS: how long a range leased to a client library
    # (POST /lease/{tag}) may be returned; its record in Redis expires after this
    client_lease_seconds: int = 86_400
    # IDPOOL_CLIENT_MAX_COUNT: most IDs one lease call hands out (the client's wish is
    # clamped to it). The client doubles its wish while a lease lasts under its
    # target_seconds (60): the default is a minute of a client taking 16k IDs/s; a
    # busier one leases more often (one call per 1M IDs, fetched ahead). Also what a
    # caller with no token can take from an open tag in one call, and what a client
    # killed with -9 wastes (twice this per tag): raise it only for such clients.
    client_max_count: int = 1_000_000
    # IDPOOL_WORKER_LEASE_SECONDS: a snowflake worker ID's lease (renewed every
    # quarter of it); also the quarantine after a new Redis incarnation. Its holder
    # stops issuing IDPOOL_WORKER_MARGIN_SECONDS before the lease can expire, by its
    # own monotonic clock (the margin covers clock rate drift and wall-clock skew
    # between machines; docs/design/snowflake.md, "Clocks")
    worker_lease_seconds: float = 10.0
    worker_margin_seconds: float = 2.0
    # IDPOOL_WORKER_CLIENT_SHARE: the most of a snowflake tag's worker IDs that
    # clients (POST /worker, SnowflakeClient) hold at once; the rest stay for
    # nodes, which serve /id (one caller took 1,023 of 1,024 before). At least one.
    worker_client_share: float = 0.5
    # IDPOOL_WORKER_HOLDER_MAX: the most worker IDs of one tag one holder name
    # holds at once (a SnowflakeClient holds one per tag per process); 0: no cap
    worker_holder_max: int = 4
    # IDPOOL_MAX_BODY_BYTES: largest request body a node reads (admin calls, lease
    # returns: a few hundred bytes); a larger one is refused with 413 unread
    max_body_bytes: int = 65_536
    # IDPOOL_BODY_SECONDS: how long a request body may take to arrive, whole; a
    # slower one is refused with 408 (a client trickling bodies over many
    # connections would otherwise hold memory for as long as it likes)
    body_seconds: float = 10.0
    # IDPOOL_HTTP: the HTTP server `idpool serve` runs, granian or uvicorn (README,
    # "HTTP server"); --http overrides it
    http: str = "granian"
    # The HTTP bounds (a flood of slow or huge headers must not take a node's memory
    # or keep requests out; README, "HTTP server", says what each server bounds).
    # IDPOOL_MAX_HEADER_BYTES: a request head (request line and headers) over this is
    # refused 431 (granian's least is 8192); IDPOOL_MAX_HEADERS: more header lines than
    # this are refused 431 (granian's parser refuses over 100 itself);
    # IDPOOL_HEADER_SECONDS: a connection whose request head has not arrived whole in
    # this time is closed; IDPOOL_MAX_CONNECTIONS: connections served at once per worker
    # (granian leaves more waiting in the listen queue; uvicorn answers them 503),
    # kept below the open-file limit; IDPOOL_KEEP_ALIVE_SECONDS: an idle kept-alive
    # connection is closed after this (granian: the smaller of it and the header time)
    max_header_bytes: int = 8_192
    max_headers: int = 100
    header_seconds: float = 5.0
    max_connections: int = 1_024
    keep_alive_seconds: float = 5.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = ENV_PREFIX + f.name.upper()
            raw = env.get(name)
            for alias in ENV_ALIASES.get(f.name, ()):
                if raw is None or raw == "":
                    name, raw = alias, env.get(alias)
            if raw is None or raw == "":
                continue
            values[f.name] = _parse(name, raw, type(getattr(cls(), f.name)))
        return cls(**values).validated()

    def validated(self) -> Settings:
        checks = [
            (self.default_step >= 1, "IDPOOL_DEFAULT_STEP must be at least 1"),
            (0.0 <= self.prefetch_at <= 1.0, "IDPOOL_PREFETCH_AT must be in [0, 1]"),
            (self.max_count >= 1, "IDPOOL_MAX_COUNT must be at least 1"),
            (self.pool_depth >= 0, "IDPOOL_POOL_DEPTH must be 0 or more"),
            (self.pool_seconds >= 0, "IDPOOL_POOL_SECONDS must be 0 or more"),
            (
                self.max_pool_depth >= self.pool_depth,
                "IDPOOL_MAX_POOL_DEPTH must be >= IDPOOL_POOL_DEPTH",
            ),
            (self.step_seconds >= 0, "IDPOOL_STEP_SECONDS must be 0 or more"),
            (self.rate_window > 0, "IDPOOL_RATE_WINDOW must be positive"),
            (self.preload_interval > 0, "IDPOOL_PRELOAD_INTERVAL must be positive"),
            (self.leader_seconds > 0, "IDPOOL_LEADER_SECONDS must be positive"),
            (self.sweep_seconds > 0, "IDPOOL_SWEEP_SECONDS must be positive"),
            (self.redis_mark_replicas >= 0, "IDPOOL_REDIS_MARK_REPLICAS must be 0 or more"),
            (self.report_seconds > 0, "IDPOOL_REPORT_SECONDS must be positive"),
            (self.store_timeout > 0, "IDPOOL_STORE_TIMEOUT must be positive"),
            (self.unknown_tag_ttl >= 0, "IDPOOL_UNKNOWN_TAG_TTL must be 0 or more"),
            (self.idle_seconds >= 0, "IDPOOL_IDLE_SECONDS must be 0 or more"),
            (self.tag_reload_seconds > 0, "IDPOOL_TAG_RELOAD_SECONDS must be positive"),
            (self.reserve_seconds >= 0, "IDPOOL_RESERVE_SECONDS must be 0 or more"),
            (self.redis_prefix.isidentifier(), "IDPOOL_REDIS_PREFIX must be a plain word"),
            (self.client_lease_seconds >= 1, "IDPOOL_CLIENT_LEASE_SECONDS must be at least 1"),
            (self.client_max_count >= 1, "IDPOOL_CLIENT_MAX_COUNT must be at least 1"),
            (
                0 < 2 * self.worker_margin_seconds < self.worker_lease_seconds,
                "IDPOOL_WORKER_MARGIN_SECONDS must be positive and under half of "
                "IDPOOL_WORKER_LEASE_SECONDS",
            ),
            (
                0 < self.worker_client_share <= 1,
                "IDPOOL_WORKER_CLIENT_SHARE must be above 0 and at most 1",
            ),
            (self.worker_holder_max >= 0, "IDPOOL_WORKER_HOLDER_MAX must be 0 or more"),
            (self.max_body_bytes >= 1, "IDPOOL_MAX_BODY_BYTES must be at least 1"),
            (self.body_seconds > 0, "IDPOOL_BODY_SECONDS must be above 0"),
            (self.http in HTTP_SERVERS, f"IDPOOL_HTTP must be one of {', '.join(HTTP_SERVERS)}"),
            (self.max_header_bytes >= 8_192, "IDPOOL_MAX_HEADER_BYTES must be at least 8192"),
            (1 <= self.max_headers <= 100, "IDPOOL_MAX_HEADERS must be from 1 to 100"),
            (self.header_seconds > 0, "IDPOOL_HEADER_SECONDS must be above 0"),
            (self.max_connections >= 1, "IDPOOL_MAX_CONNECTIONS must be at least 1"),
            (self.keep_alive_seconds > 0, "IDPOOL_KEEP_ALIVE_SECONDS must be above 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        if self.sqlite_path() is None:
            self.mysql_params()  # raises ConfigError on a bad URL
        scheme = _split_redis_url(self.redis_url).scheme
        if scheme == SENTINEL_SCHEME:
            self.sentinel_params()  # raises ConfigError on a bad URL
        elif scheme in CLUSTER_SCHEMES:
            self.cluster_params()  # raises ConfigError on a bad URL
        elif scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                "IDPOOL_REDIS_URL must start with redis://, rediss://, unix://, "
                "redis+sentinel:// or redis+cluster://"
            )
        else:
            _port("IDPOOL_REDIS_URL", _split_redis_url(self.redis_url))  # redis-py reads it too
        return self

    def with_changes(self, **changes: Any) -> Settings:
        return replace(self, **changes).validated()

    @property
    def embedded(self) -> bool:
        """The ledger is a SQLite file and the pool lives in the same file."""
        return self.sqlite_path() is not None

    def sqlite_path(self) -> Path | None:
        """The embedded ledger's file for a ``sqlite:`` URL, else None.

        ``sqlite:///var/idpool.db`` is ``/var/idpool.db``; ``sqlite:idpool.db`` is
        relative to the working directory.
        """
        url = urlsplit(self.mysql_url)
        if url.scheme != "sqlite":
            return None
        if url.netloc or not url.path or url.query or url.path.endswith("/"):
            raise ConfigError(
                "IDPOOL_MYSQL_URL: a SQLite ledger looks like sqlite:///path/to/idpool.db"
            )
        return Path(unquote(url.path))

    def ledger_shown(self) -> str:
        """The ledger as a message names it, never with its password: "MySQL
        database 'idpool' at db1:3306" or "SQLite file /var/idpool.db"."""
        try:
            path = self.sqlite_path()
            if path is not None:
                return f"SQLite file {path}"
            p = self.mysql_params()
        except ConfigError:
            return "the ledger IDPOOL_MYSQL_URL names"
        return f"MySQL database {p.database!r} at {p.host}:{p.port}"

    def mysql_params(self) -> MysqlParams:
        url = urlsplit(self.mysql_url)
        database = url.path.lstrip("/")
        if url.scheme not in ("mysql", "mariadb") or not url.hostname or not database:
            raise ConfigError(
                "IDPOOL_MYSQL_URL must look like mysql://user:password@host:3306/database "
                "(or sqlite:///path/to/idpool.db for the embedded mode)"
            )
        if not database.replace("_", "").isalnum():
            raise ConfigError("IDPOOL_MYSQL_URL: database name must be letters, digits and _")
        return MysqlParams(
            host=url.hostname,
            port=_port("IDPOOL_MYSQL_URL", url) or 3306,
            user=unquote(url.username or "root"),
            password=unquote(url.password or ""),
            database=database,
        )

    def sentinel_params(self) -> SentinelParams | None:
        """The Sentinels and master name of a ``redis+sentinel://`` URL, else None."""
        if _split_redis_url(self.redis_url).scheme != SENTINEL_SCHEME:
            return None
        return parse_sentinel_url(self.redis_url)

    def cluster_params(self) -> ClusterParams | None:
        """The seed nodes of a ``redis+cluster://`` URL, else None."""
        if _split_redis_url(self.redis_url).scheme not in CLUSTER_SCHEMES:
            return None
        return parse_cluster_url(self.redis_url)


def parse_cluster_url(text: str) -> ClusterParams:
    """``redis+cluster://[[user]:password@]host[:port],host[:port][/0]``.

    Raises ConfigError naming IDPOOL_REDIS_URL. Ports default to 6379; a cluster
    has only database 0, and the URL takes no query parameters.
    """
    url = _split_redis_url(text)
    if url.scheme not in CLUSTER_SCHEMES or url.fragment or url.query:
        raise ConfigError(_CLUSTER_FORM)
    userinfo, _, hostlist = url.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, _, secret = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(secret) or None
    if url.path.strip("/") not in ("", "0"):
        raise ConfigError(_CLUSTER_FORM + ": a Redis Cluster has only database 0")
    if not hostlist:
        raise ConfigError(_CLUSTER_FORM + ": name at least one seed node")
    nodes = tuple(
        _host_port(part, _shown(part, text), CLUSTER_PORT, _CLUSTER_FORM)
        for part in hostlist.split(",")
    )
    return ClusterParams(nodes, username, password, url.scheme == "rediss+cluster")


def parse_sentinel_url(text: str) -> SentinelParams:
    """``redis+sentinel://[[user]:password@]host[:port],host[:port]/service[/db][?query]``.

    Raises ConfigError naming IDPOOL_REDIS_URL. Ports default to 26379; the only
    query parameter is ``sentinel_password`` (the Sentinels' own ``requirepass``).
    """
    url = _split_redis_url(text)
    if url.scheme != SENTINEL_SCHEME or url.fragment:
        raise ConfigError(_SENTINEL_FORM)
    userinfo, _, hostlist = url.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, _, secret = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(secret) or None
    sentinels = tuple(_host_port(part, _shown(part, text)) for part in hostlist.split(","))
    parts = url.path.strip("/").split("/") if url.path.strip("/") else []
    if not sentinels or not 1 <= len(parts) <= 2 or not parts[0]:
        raise ConfigError(_SENTINEL_FORM + ": name the master after the hosts (/mymaster)")
    service = unquote(parts[0])
    db_text = parts[1] if len(parts) == 2 else "0"
    if not db_text.isdigit():
        raise ConfigError(
            f"IDPOOL_REDIS_URL: database number {_shown(db_text, text)} is not a number"
        )
    sentinel_password = None
    for item in url.query.split("&") if url.query else []:
        key, eq, value = item.partition("=")
        if key != "sentinel_password" or not eq:
            raise ConfigError(
                f"IDPOOL_REDIS_URL: unknown query parameter {_shown(key, text)} "
                "(a Sentinel URL takes only ?sentinel_password=...)"
            )
        sentinel_password = unquote(value) or None
    return SentinelParams(sentinels, service, int(db_text), username, password, sentinel_password)


def _split_redis_url(text: str) -> SplitResult:
    try:
        return urlsplit(text)
    except ValueError as e:  # e.g. an unclosed [ of an IPv6 address
        raise ConfigError(f"IDPOOL_REDIS_URL is not a URL: {e}") from None


# A password holding an unencoded / ? # or & ends the URL's host part (or a query
# value) early: every piece of such a URL may then be a piece of the password.
_ENCODE_HINT = "percent-encode / ? # @ & in a password (%2F %3F %23 %40 %26)"


def _shown(part: str, url: str) -> str:
    """``part`` of a store URL, quoted for an error message; hidden when the URL
    holds a password (an error must never show a piece of one)."""
    if "@" in url or "password" in url.lower():
        return f"(not shown: the URL holds a password; {_ENCODE_HINT})"
    return repr(part)


def _port(name: str, url: SplitResult) -> int | None:
    """The URL's port; urllib's own error would quote what it read as one, which
    is a piece of the password when the password holds an unencoded / ? or #."""
    try:
        return url.port
    except ValueError:
        raise ConfigError(f"{name}: the port is not a number 1-65535; {_ENCODE_HINT}") from None


def _host_port(
    text: str, shown: str, default: int = SENTINEL_PORT, form: str = _SENTINEL_FORM
) -> tuple[str, int]:
    what = "Sentinel address" if form == _SENTINEL_FORM else "seed node address"
    host, port_text = text, ""
    if text.startswith("["):  # [::1]:26379
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ConfigError(form + f": bad {what} {shown}")
        port_text = rest[1:]
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
    if not host or (port_text and not port_text.isdigit()):
        raise ConfigError(form + f": bad {what} {shown}")
    port = int(port_text) if port_text else default
    if not 0 < port < 65536:
        raise ConfigError(form + f": bad port in {shown}")
    return host, port


def _parse(name: str, raw: str, kind: type) -> Any:
    try:
        if kind is bool:
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        return raw
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a valid {kind.__name__}") from None
