"""constraints.txt (the Dockerfile's pins): every runtime dependency of idpool,
at the version the tests run against."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from importlib.metadata import requires, version
from pathlib import Path

import yaml

from ops.processes import free_port, wait_ready

ROOT = Path(__file__).resolve().parent.parent


def pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    found = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    return {_norm(name): v for name, v in found.items()}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_runtime_dependency_is_pinned_at_the_tested_version() -> None:
    pinned = pins()
    runtime = [r for r in requires("idpool") or [] if "extra ==" not in r]
    for requirement in runtime:
        name = _norm(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])
        if name == "idpool-client":  # this repo's client/, installed from there
            continue
        assert name in pinned, f"{name} is a dependency but not in constraints.txt"
    for name, pinned_version in pinned.items():
        tested = version(name)
        assert tested == pinned_version, f"{name}: tested {tested}, pinned {pinned_version}"


def test_the_image_installs_with_the_pins_and_runs_as_no_root() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-cache-dir -c constraints.txt ." in dockerfile
    assert re.search(r"^USER idpool$", dockerfile, re.M)
    assert dockerfile.index("USER idpool") < dockerfile.index("ENTRYPOINT")
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "image: mariadb:" in compose and "mysql:8" not in compose


def test_the_image_installs_the_client_in_the_same_pip_command_as_the_server() -> None:
    """idpool needs idpool-client, which is on no index: pip finds it only when
    ./client is named in the same command (or installed before)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    (command,) = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert command.split()[-2:] == ["./client", "."], command
    assert "COPY client ./client" in dockerfile
    dockerignore = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in dockerignore and "client/idpool_client/*.so" in dockerignore


def test_the_built_server_wheel_installs_into_a_fresh_venv_and_serves(tmp_path: Path) -> None:
    """Issue 29: the wheel named three packages and left out idpool.service.cli
    (and every other subpackage), so the installed `idpool` command died with
    ModuleNotFoundError, and so did the Docker image, which installs that wheel."""
    source = tmp_path / "src"  # a clean copy: no build/, egg-info or .venv beside the code
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "*.egg-info", "build", "dist", "*.so", "__pycache__", "*.db", "*.db-*"
    )
    shutil.copytree(ROOT, source, symlinks=True, ignore=ignore)  # idpool/pool stays a link
    dist = tmp_path / "dist"
    for tree in (source / "client", source):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "build",
                "--no-isolation",
                "--wheel",
                "--outdir",
                str(dist),
                str(tree),
            ],
            check=True,
            capture_output=True,
            timeout=180,
        )
    (server,) = dist.glob("idpool-*.whl")
    (client,) = dist.glob("idpool_client-*.whl")
    with zipfile.ZipFile(server) as w:
        names = set(w.namelist())
        metadata = w.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for folder in ("pool", "service"):  # every module and data file, found or not
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                shipped = f"idpool/{path.relative_to(ROOT).as_posix()}"
                assert shipped in names, f"{shipped} is not in the wheel"
    assert re.search(r"^Requires-Dist: idpool-client>=", metadata, re.M), metadata

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # The runtime dependencies (redis, starlette, ...) from the test run's own
    # site-packages, appended after the venv's own: no download. A plain path line,
    # so that folder's .pth files (the editable installs of this checkout) are not run.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            str(server),
            str(client),
        ],
        check=True,
        timeout=120,
    )
    check = subprocess.run(  # the installed copies are the ones imported, and pip agrees
        [
            str(python),
            "-c",
            "import idpool.service.cli, idpool_client.formats as f; "
            "print(idpool.service.cli.__file__, f.__file__)",
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert all(path.startswith(str(venv)) for path in check), check
    subprocess.run([str(python), "-m", "pip", "check"], check=True, capture_output=True)

    run = tmp_path / "run"  # serve --embedded keeps ./idpool.db here
    run.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDPOOL_")}
    idpool = str(venv / "bin" / "idpool")
    added = subprocess.run(
        [idpool, "tag", "add", "orders", "--embedded"],
        cwd=run,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr
    port = free_port()
    with open(tmp_path / "node.log", "wb") as log:
        node = subprocess.Popen(
            [idpool, "serve", "--embedded", "--host", "127.0.0.1", "--port", str(port)],
            cwd=run,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, 30, lambda: None if node.poll() is None else "the node exited")
        with urllib.request.urlopen(f"{base}/id/orders", timeout=5) as answer:
            issued = int(answer.read())  # text/plain: the ID alone
    finally:
        node.terminate()
        code = node.wait(30)
    assert issued >= 1
    assert code in (0, -signal.SIGTERM), (tmp_path / "node.log").read_text()


def test_compose_names_each_node_publishes_on_loopback_and_takes_the_password() -> None:
    """Issue 29: both nodes showed as 0.0.0.0:8000, the nodes and the proxy were
    published on every interface (MySQL and Redis on 127.0.0.1), and the root
    password was written in the file."""
    text = (ROOT / "docker-compose.yml").read_text()
    services = yaml.safe_load(text)["services"]
    nodes = {name: s for name, s in services.items() if s.get("command", [""])[0] == "serve"}
    advertised = [s["environment"]["IDPOOL_ADVERTISE"] for s in nodes.values()]
    assert len(nodes) == 2 and len(set(advertised)) == 2, advertised
    for name, service in nodes.items():  # each node's own port is the one it advertises
        (published,) = service["ports"]
        assert published.rsplit(":", 1)[0] == service["environment"]["IDPOOL_ADVERTISE"], name
        assert "IDPOOL_MYSQL_URL" in service["environment"]  # the shared ones kept
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    password = "${IDPOOL_DB_PASSWORD:-idpool}"
    assert services["mysql"]["environment"]["MARIADB_ROOT_PASSWORD"] == password
    assert f"root:{password}@mysql" in services["preloader"]["environment"]["IDPOOL_MYSQL_URL"]
