"""The client as a user gets it: `python -m build` of client/ gives a wheel and an
sdist for idpool-client, and the wheel, installed into a fresh virtualenv, serves
IDs of a guarded tag from a real node (issue 23)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from idpool.pool.ledger import Ledger
from idpool.pool.settings import Settings
from idpool.pool.tokens import hash_token
from ops.toolkit import NodeProcess, env_with

pytestmark = pytest.mark.slow
CLIENT = Path(__file__).resolve().parent.parent / "client"

USE = """
import asyncio, json, sys
import idpool_client
from idpool_client import AsyncIdPoolClient, IdPoolAuthError, IdPoolClient, snowflake

url, tag, token = sys.argv[1:4]
try:
    IdPoolClient([url], return_at_exit=False).next_id(tag)
except IdPoolAuthError as e:
    refused = e.tag
with IdPoolClient([url], tokens={tag: token}, max_count=100) as client:
    ids = [client.next_id(tag) for _ in range(150)] + list(client.next_ids(tag, 30))
    ids += [next(client.ids(tag)) for _ in range(20)]

async def main():
    async with AsyncIdPoolClient([url], token=token, max_count=100) as aio:
        return [await aio.next_id(tag) for _ in range(120)]

ids += asyncio.run(main())
print(json.dumps({"version": idpool_client.__version__, "file": idpool_client.__file__,
                  "refused": refused, "ids": ids, "returned": client.report.returned,
                  "c_run": snowflake.ClockRun is not None}))
"""


def test_the_built_wheel_installs_into_a_fresh_venv_and_serves_a_guarded_tag(
    settings: Settings, tag: str, tmp_path: Path
) -> None:
    source = tmp_path / "src"  # a copy: a build writes build/ and egg-info beside the code
    built = shutil.ignore_patterns("*.egg-info", "build", "dist", "*.so")
    shutil.copytree(CLIENT, source, ignore=built)
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    version = _version()
    # the snowflake run in C (optional in the build, so a platform wheel here)
    (wheel,) = dist.glob(f"idpool_client-{version}-cp3*-*.whl")
    sdist = dist / f"idpool_client-{version}.tar.gz"
    with zipfile.ZipFile(wheel) as w:
        names = set(w.namelist())
        metadata = w.read(f"idpool_client-{version}.dist-info/METADATA").decode()
    assert "idpool_client/py.typed" in names and "idpool_client/_clockrun.pyi" in names
    assert any(n.startswith("idpool_client/_clockrun.") and n.endswith(".so") for n in names)
    assert f"idpool_client-{version}.dist-info/licenses/LICENSE" in names
    assert "Name: idpool-client" in metadata and f"Version: {version}" in metadata
    assert "## Tokens" in metadata and "What a crash costs" in metadata  # the README
    with tarfile.open(sdist) as s:
        packed = {n.split("/", 1)[1] for n in s.getnames() if "/" in n}
    assert {"README.md", "LICENSE", "pyproject.toml", "idpool_client/py.typed"} <= packed
    assert "idpool_client/_clockrun.c" in packed

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "--quiet", "--no-index", str(wheel)]
    subprocess.run(install, check=True, timeout=120)

    token = "package-test-token"
    asyncio.run(_guarded_tag(settings, tag, token))
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
    )
    node = NodeProcess(env, tmp_path / "node").start()
    try:
        ran = subprocess.run(
            [str(python), "-c", USE, node.base_url, tag, token],
            cwd=tmp_path,  # not the checkout: the installed package is the one imported
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        assert node.stop()
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out["version"] == version and out["file"].startswith(str(venv))
    assert out["refused"] == tag and out["c_run"]
    ids = out["ids"]
    assert len(ids) == 320 and len(set(ids)) == 320 and out["returned"] > 0


def _version() -> str:
    init = (CLIENT / "idpool_client" / "__init__.py").read_text()
    line = next(x for x in init.splitlines() if x.startswith("__version__"))
    return line.split('"')[1]


async def _guarded_tag(settings: Settings, tag: str, token: str) -> None:
    ledger = await Ledger.connect(settings)
    try:
        await ledger.add_tag(tag, step=1000, start=1)
        await ledger.add_token(tag, "t1", hash_token(token))
    finally:
        await ledger.close()
