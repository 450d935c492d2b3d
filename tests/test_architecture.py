"""ARCHITECTURE.md's map names every module, and only modules that exist.

The convention: in its "## Map" section a heading ``### `folder/` `` names a
package folder (from the repository root), and each bullet under it starts with
one module's file name in that folder (``- `ledger.py`: ...`` under
``### `pool/` ``). Every ``.py`` file of the mapped trees has exactly one bullet;
a bullet for a file that is gone fails too. Paths with a folder written anywhere
else in the page (`pool/settings.py` in a recipe) must exist as well. A kind's
module (``service/kinds/<kind>.py`` with a ``SPEC``) may instead be mapped by its
section ``## <Kind>`` in docs/kinds.md, which every kind must have: adding a kind
is one module, its tests and its doc section (ARCHITECTURE.md, "A new kind of ID").
"""

from __future__ import annotations

import re
from pathlib import Path

from idpool.service.kinds import SPECS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "ARCHITECTURE.md"
KINDS_PAGE = ROOT / "docs" / "kinds.md"
TREES = ["idpool", "pool", "service", "client/idpool_client", "ops"]
MAX_LINES = 300
FOLDER = re.compile(r"^### `([\w/]+/)`$")
BULLET = re.compile(r"^- `([^`]+)`")


def _map_section() -> list[str]:
    lines = PAGE.read_text().splitlines()
    start = lines.index("## Map")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return lines[start + 1 : end]


def mapped() -> list[str]:
    """Every module the map names, as a path from the root, once per bullet."""
    folder, found = "", []
    for line in _map_section():
        if line.startswith("#"):
            heading = FOLDER.match(line)
            assert heading, f"ARCHITECTURE.md map: {line!r} is not a heading ### `folder/`"
            folder = heading.group(1)
        elif bullet := BULLET.match(line):
            name = bullet.group(1)
            assert folder, f"ARCHITECTURE.md map: {line!r} comes before any folder heading"
            assert "/" not in name and name.endswith(".py"), (
                f"ARCHITECTURE.md map: {line!r} must start with a module's file name in {folder}"
            )
            found.append(folder + name)
    return found


def on_disk() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for tree in TREES
        for path in (ROOT / tree).rglob("*.py")
        if "__pycache__" not in path.parts
    }


def kind_modules() -> dict[str, str]:
    """Each kind's module (a path from the root) -> the heading of its section."""
    return {
        "service/kinds/" + type(spec).__module__.rsplit(".", 1)[1] + ".py": (
            "## " + spec.name.capitalize()
        )
        for spec in SPECS.values()
    }


def test_every_kind_has_its_section_in_docs_kinds() -> None:
    headings = set(KINDS_PAGE.read_text().splitlines())
    lacking = sorted(h for h in kind_modules().values() if h not in headings)
    assert not lacking, f"docs/kinds.md has no section for these kinds: {lacking}"


def test_the_map_names_every_module_once_and_no_other() -> None:
    names = mapped()
    doubled = sorted({n for n in names if names.count(n) > 1})
    missing = sorted(on_disk() - set(names) - set(kind_modules()))
    gone = sorted(set(names) - on_disk())
    assert not doubled, f"ARCHITECTURE.md maps these twice: {doubled}"
    assert not missing, f"ARCHITECTURE.md's map does not name {missing}"
    assert not gone, f"ARCHITECTURE.md's map names modules that do not exist: {gone}"


def test_every_path_the_page_names_exists() -> None:
    spans = re.findall(r"`([\w./<>-]+/[\w.<>-]+\.(?:py|md|c|yml|cfg))`", PAGE.read_text())
    # `idpool_client/...` is written from client/, as the package is imported
    roots = (ROOT, ROOT / "client")
    gone = sorted({s for s in spans if "<" not in s and not any((r / s).exists() for r in roots)})
    assert not gone, f"ARCHITECTURE.md names files that do not exist: {gone}"


def test_the_page_stays_short() -> None:
    lines = len(PAGE.read_text().splitlines())
    assert lines <= MAX_LINES, f"ARCHITECTURE.md has {lines} lines; keep it at most {MAX_LINES}"
