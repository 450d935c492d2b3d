from __future__ import annotations

from pathlib import Path

import pytest

from idpool.pool.errors import ConfigError
from idpool.pool.settings import Settings


def test_defaults_work_on_this_machine() -> None:
    s = Settings.from_env({})
    params = s.mysql_params()
    assert (params.host, params.port, params.user, params.database) == (
        "127.0.0.1",
        3306,
        "root",
        "idpool",
    )
    assert s.redis_url == "redis://127.0.0.1:6379/0"


def test_environment_overrides_with_prefix() -> None:
    s = Settings.from_env(
        {"IDPOOL_POOL_DEPTH": "7", "IDPOOL_PRELOAD": "off", "IDPOOL_PREFETCH_AT": "0.25"}
    )
    assert (s.pool_depth, s.preload, s.prefetch_at) == (7, False, 0.25)


def test_prefetch_at_one_turns_the_prefetch_off() -> None:
    assert Settings.from_env({"IDPOOL_PREFETCH_AT": "1"}).prefetch_at == 1.0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("IDPOOL_POOL_DEPTH", "many"),
        ("IDPOOL_PRELOAD", "maybe"),
        ("IDPOOL_PREFETCH_AT", "1.5"),
        ("IDPOOL_MAX_COUNT", "0"),
        ("IDPOOL_MYSQL_URL", "postgres://x/y"),
        ("IDPOOL_MYSQL_URL", "mysql://host/bad-name;drop"),
        ("IDPOOL_REDIS_URL", "http://localhost"),
        ("IDPOOL_REDIS_PREFIX", "a:b"),
        ("IDPOOL_MYSQL_URL", "sqlite://host/idpool.db"),
        ("IDPOOL_MYSQL_URL", "sqlite:///"),
        ("IDPOOL_MYSQL_URL", "sqlite:"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: value})


def test_only_a_sqlite_url_selects_the_embedded_mode() -> None:
    assert not Settings.from_env({}).embedded
    absolute = Settings.from_env({"IDPOOL_MYSQL_URL": "sqlite:///var/lib/idpool/ids.db"})
    assert absolute.embedded and absolute.sqlite_path() == Path("/var/lib/idpool/ids.db")
    relative = Settings.from_env({"IDPOOL_MYSQL_URL": "sqlite:ids%20here.db"})
    assert relative.sqlite_path() == Path("ids here.db")


def test_passwords_and_tokens_stay_out_of_repr() -> None:
    s = Settings.from_env(
        {
            "IDPOOL_MYSQL_URL": "mysql://app:s3cret-m@db:3306/idpool",
            "IDPOOL_REDIS_URL": "redis://:s3cret-r@cache:6379/0",
            "IDPOOL_ADMIN_TOKEN": "s3cret-t",
        }
    )
    text = repr(s) + repr(s.mysql_params())
    assert "s3cret" not in text
    assert s.mysql_params().password == "s3cret-m"


def test_a_cluster_url_names_seeds_credentials_and_tls() -> None:
    s = Settings.from_env({"IDPOOL_REDIS_URL": "redis+cluster://u:s3cret@10.0.0.1:7000,[::1],h2"})
    params = s.cluster_params()
    assert params is not None and s.sentinel_params() is None
    assert params.nodes == (("10.0.0.1", 7000), ("::1", 6379), ("h2", 6379))
    assert (params.username, params.password, params.tls) == ("u", "s3cret", False)
    assert "s3cret" not in repr(params) and "s3cret" not in repr(s)
    tls = Settings(redis_url="rediss+cluster://h:7000/0").validated().cluster_params()
    assert tls is not None and tls.tls
    assert Settings().cluster_params() is None


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://",
        "redis+cluster://h:7000/1",
        "redis+cluster://h:port",
        "redis+cluster://h:7000?read_from_replicas=1",
        "redis+cluster://h:70000",
    ],
)
def test_malformed_cluster_urls_are_refused_naming_the_variable(url: str) -> None:
    with pytest.raises(ConfigError, match="IDPOOL_REDIS_URL"):
        Settings(redis_url=url).validated()


def test_better_and_old_names_are_read_when_the_setting_is_unset() -> None:
    s = Settings.from_env({"IDPOOL_LEDGER_URL": "sqlite:///tmp/x.db", "IDPOOL_LEASE_SECONDS": "4"})
    assert s.embedded and s.mysql_url == "sqlite:///tmp/x.db" and s.leader_seconds == 4.0
    both = Settings.from_env(
        {"IDPOOL_MYSQL_URL": "mysql://root@db/idpool", "IDPOOL_LEDGER_URL": "sqlite:///x.db"}
    )
    assert both.mysql_url == "mysql://root@db/idpool"  # its own name wins
    assert Settings.from_env({"IDPOOL_LEADER_SECONDS": "3"}).leader_seconds == 3.0
    with pytest.raises(ConfigError, match="IDPOOL_LEASE_SECONDS"):
        Settings.from_env({"IDPOOL_LEASE_SECONDS": "soon"})


@pytest.mark.parametrize(
    ("name", "url"),
    [
        # A password holding an unencoded / ? or # ends the host part early; urllib
        # then reads a piece of it as the port (a traceback quoting it, before).
        ("IDPOOL_REDIS_URL", "redis://:Zq9/s3cret@127.0.0.1:6379/0"),
        ("IDPOOL_REDIS_URL", "redis://:Zq9#s3cret@127.0.0.1:6379/0"),
        ("IDPOOL_REDIS_URL", "redis+sentinel://:Zq9/s3cret@127.0.0.1:26379/mymaster"),
        ("IDPOOL_REDIS_URL", "redis+sentinel://127.0.0.1/m?sentinel_password=Zq9&s3cret=1"),
        ("IDPOOL_REDIS_URL", "redis+cluster://:Zq9/s3cret@127.0.0.1:7000"),
        ("IDPOOL_REDIS_URL", "redis+cluster://:Zq9#s3cret@127.0.0.1:7000"),
        ("IDPOOL_REDIS_URL", "redis+cluster://u:Zq9s3cret@h1:7000,h2:port"),
        ("IDPOOL_MYSQL_URL", "mysql://root:Zq9?s3cret@127.0.0.1:3306/idpool"),
        ("IDPOOL_MYSQL_URL", "mysql://root:Zq9#s3cret@127.0.0.1/idpool"),
    ],
)
def test_a_bad_store_url_never_shows_its_password(name: str, url: str) -> None:
    with pytest.raises(ConfigError, match=name) as refused:
        Settings.from_env({name: url})
    assert "Zq9" not in str(refused.value) and "s3cret" not in str(refused.value)


def test_the_ledger_is_named_without_its_password() -> None:
    mysql = Settings(mysql_url="mysql://app:hunter2@db1:3307/orders_ledger")
    assert mysql.ledger_shown() == "MySQL database 'orders_ledger' at db1:3307"
    assert "hunter2" not in mysql.ledger_shown()
    sqlite = Settings(mysql_url="sqlite:///var/lib/idpool/idpool.db")
    assert sqlite.ledger_shown() == "SQLite file /var/lib/idpool/idpool.db"
