"""docs/layout.md names every module: the map a newcomer reads stays the code's."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ["bpe", "transformer", "transformer/backends", "pipeline", "cli", "common"]
LAYOUT = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")


def modules() -> list[str]:
    found = [p for folder in FOLDERS for p in sorted((REPO / folder).glob("*.py")) if p.name != "__init__.py"]
    return [str(p.relative_to(REPO)) for p in found + sorted((REPO / "cli" / "page").glob("*.js"))]


def named(module: str) -> bool:
    name = Path(module).name if module.endswith(".js") else Path(module).stem
    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", LAYOUT) is not None


def test_layout_names_every_module():
    assert len(modules()) > 100
    assert [m for m in modules() if not named(m)] == []


def test_a_module_it_does_not_name_is_found():
    assert not named("pipeline/no_such_module.py") and not named("cli/page/nothing.js")
    assert named("bpe/merge.py") and named("cli/page/lens.js")
