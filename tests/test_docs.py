"""The reference pages the README points to: complete, and every link in them lands.

The README is short (issue 29) and leaves the reference to docs/: every setting must
be in docs/settings.md, every route and error code in docs/api.md, and every relative
link (file and #anchor) of the README and the pages must resolve, so that moving
text between pages cannot silently drop a setting or break a link.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from starlette.routing import Route

from idpool.pool.settings import ENV_ALIASES, ENV_PREFIX, Settings
from idpool.service.errors import ERRORS
from idpool.service.routes import starlette_routes

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    "README.md",
    "ARCHITECTURE.md",
    "docs/api.md",
    "docs/settings.md",
    "docs/kinds.md",
    "docs/cli.md",
    "docs/testing.md",
    "docs/design.md",
    "client/README.md",
    "ops/README.md",
    "BENCHMARKS.md",
]
# the design's topics (issue 30): one page per topic, linked from docs/design.md
PAGES += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs/design").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _text(page: str) -> str:
    return (ROOT / page).read_text()


def _anchors(page: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_code = False
    for line in _text(page).splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_setting_is_in_the_settings_page() -> None:
    page = _text("docs/settings.md")
    names = [ENV_PREFIX + f.name.upper() for f in fields(Settings)]
    names += [alias for aliases in ENV_ALIASES.values() for alias in aliases]
    missing = [name for name in names if f"`{name}`" not in page]
    assert not missing, f"docs/settings.md does not document {missing}"


def test_every_route_and_error_is_in_the_api_page() -> None:
    page = re.sub(r"\{[^}/]*\}", "{}", _text("docs/api.md"))
    missing = []
    for route in starlette_routes():
        assert isinstance(route, Route)
        path = re.sub(r"\{[^}]*\}", "{}", route.path)
        for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
            if f"{method} {path}" not in page:
                missing.append(f"{method} {route.path}")
    missing += [row.code for row in ERRORS if f"`{row.code}`" not in page]
    assert not missing, f"docs/api.md does not document {missing}"


def test_every_relative_link_lands() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(_text(page)):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file, _, anchor = target.partition("#")
            linked = (ROOT / page).parent / file if file else ROOT / page
            if not linked.exists():
                broken.append(f"{page}: {target} (no such file)")
            elif anchor and linked.suffix == ".md":
                if anchor not in _anchors(str(linked.resolve().relative_to(ROOT))):
                    broken.append(f"{page}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_reads_in_ten_minutes() -> None:
    """Issue 29: the README took hours; it starts with the two commands, and is short."""
    lines = _text("README.md").splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines: move reference to docs/"
    long = [n for n, line in enumerate(lines, 1) if len(line) > 200]
    assert not long, f"README.md lines over 200 characters: {long}"
    first_block = "\n".join(lines[: lines.index("```", 3) + 1])
    assert "make serve" in first_block and "make test" in first_block
