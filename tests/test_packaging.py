"""constraints.txt (the Dockerfile's pins): every runtime dependency of idpool,
at the version the tests run against."""

from __future__ import annotations

import re
from importlib.metadata import requires, version
from pathlib import Path

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
