"""The import layering of tokenkit's packages, read from the source with `ast` (nothing is imported).

Every import statement of every module counts: those at module level, inside functions and under
`if TYPE_CHECKING:`. Checked:
(a) bpe/'s modules stand in layers: no cycle among them, counting every import (a function-level
    or TYPE_CHECKING import only hides a cycle), and no function-level import of a bpe module;
(b) the packages keep apart: bpe/ and transformer/ import neither each other nor pipeline/ or
    cli/, common/ imports none of them, pipeline/ never imports cli/;
(c) the whole tokenkit graph of module-level imports has no cycle.

`from tokenkit.bpe import io` reaches the module tokenkit.bpe.io, `from tokenkit.bpe import
Tokenizer` the package tokenkit.bpe (its __init__, which imports its modules).

What it deliberately does not do: judge imports of other libraries, which names a module takes
from another (only which module it reaches), or count the parent packages Python runs before a
module (every module would import its own package's __init__ then).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

# Where each package's modules live (pyproject.toml's package-dir): folder -> package name.
PACKAGES = {
    "tokenkit": "tokenkit",
    "bpe": "tokenkit.bpe",
    "transformer": "tokenkit.transformer",
    "transformer/backends": "tokenkit.transformer.backends",
    "pipeline": "tokenkit.pipeline",
    "common": "tokenkit.common",
    "cli": "tokenkit.cli",
}

# (b): which parts a part may never import. The root package `tokenkit` imports bpe, common,
# pipeline and transformer, so importing it is importing them all.
FORBIDDEN = {
    "bpe": {"transformer", "pipeline", "cli", "tokenkit"},
    "transformer": {"bpe", "pipeline", "cli", "tokenkit"},
    "common": {"bpe", "transformer", "pipeline", "cli", "tokenkit"},
    "pipeline": {"cli"},
}


@dataclass(frozen=True)
class Import:
    """One import of a tokenkit module by another, where it is written."""

    source: str  # the importing module
    target: str  # the imported module (a package stands for its __init__)
    line: int
    in_function: bool  # runs when the function does, not when the module is imported
    type_checking: bool  # under `if TYPE_CHECKING:`: never runs, but a type checker follows it

    def __str__(self) -> str:
        where = " (in a function)" if self.in_function else " (TYPE_CHECKING)" if self.type_checking else ""
        return f"{self.source}:{self.line} imports {self.target}{where}"


def module_files(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Every tokenkit module: name -> (file, is it a package's __init__)."""
    modules = {}
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).glob("*.py")):
            is_package = path.stem == "__init__"
            modules[package if is_package else f"{package}.{path.stem}"] = (path, is_package)
    return modules


def part(module: str) -> str:
    """The package a module belongs to, by its folder: 'tokenkit.transformer.backends.cpu' -> 'transformer'."""
    names = module.split(".")
    return names[1] if len(names) > 1 else names[0]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.AST) -> Iterable[tuple[ast.stmt, bool, bool]]:
    """Every import statement of a module, with (in a function, under TYPE_CHECKING)."""

    def walk(node: ast.AST, in_function: bool, type_checking: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function, type_checking
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, True, type_checking)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), in_function, True)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), in_function, type_checking)
            else:
                yield from walk(child, in_function, type_checking)

    yield from walk(tree, False, False)


def _known(name: str, modules: Iterable[str]) -> str | None:
    """The longest prefix of a dotted name that is a tokenkit module (None: not tokenkit's)."""
    names = name.split(".")
    for n in range(len(names), 0, -1):
        if ".".join(names[:n]) in modules:
            return ".".join(names[:n])
    return None


def imports_of(module: str, source: str, is_package: bool, modules: Iterable[str]) -> list[Import]:
    """The tokenkit modules that `module` (its source text) imports, each import statement once
    per module it reaches. `from P import name` reaches the submodule P.name when there is one,
    else the package P (a name defined by P's __init__)."""
    modules = set(modules)
    found = []
    for stmt, in_function, type_checking in _statements(ast.parse(source)):
        targets = []
        if isinstance(stmt, ast.Import):
            targets = [_known(alias.name, modules) for alias in stmt.names]
        else:
            base = stmt.module or ""
            if stmt.level:  # relative: from the package that holds this module
                package = module if is_package else module.rpartition(".")[0]
                anchor = package.rsplit(".", stmt.level - 1)[0] if stmt.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in stmt.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in modules else _known(base, modules))
        for target in dict.fromkeys(targets):
            if target is not None and target != module:
                found.append(Import(module, target, stmt.lineno, in_function, type_checking))
    return found


def all_imports(root: Path = ROOT) -> list[Import]:
    modules = module_files(root)
    found = []
    for name, (path, is_package) in modules.items():
        found.extend(imports_of(name, path.read_text(encoding="utf-8"), is_package, modules))
    return found


def find_cycle(edges: Iterable[Import]) -> list[Import] | None:
    """One cycle of the graph as the imports that close it, or None when there is none."""
    graph: dict[str, list[Import]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge)
    state: dict[str, int] = {}  # 1: on the current path, 2: done (no cycle through it)
    path: list[Import] = []

    def visit(node: str) -> list[Import] | None:
        state[node] = 1
        for edge in graph.get(node, []):
            if state.get(edge.target) == 1:  # back to a module on the path: that stretch is a cycle
                if edge.target == node:
                    return [edge]
                start = next(i for i, e in enumerate(path) if e.source == edge.target)
                return path[start:] + [edge]
            if edge.target not in state:
                path.append(edge)
                if (cycle := visit(edge.target)) is not None:
                    return cycle
                path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def shown(cycle: list[Import]) -> str:
    """A cycle as 'a -> b -> a', then the import lines that make it."""
    chain = " -> ".join([cycle[0].source] + [e.target for e in cycle])
    return chain + "\n" + "\n".join(f"  {e}" for e in cycle)


# ---------------------------------------------------------------------------------------------
# the checker itself, on made-up modules


FAKE = ["tokenkit.bpe", "tokenkit.bpe.io", "tokenkit.bpe.tokenizer", "tokenkit.common", "tokenkit.common.atomic"]


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from tokenkit.bpe import io", ["tokenkit.bpe.io"]),
        ("from tokenkit.bpe import Tokenizer", ["tokenkit.bpe"]),
        ("from tokenkit.bpe import Tokenizer, io", ["tokenkit.bpe", "tokenkit.bpe.io"]),
        ("import tokenkit.bpe.io as x", ["tokenkit.bpe.io"]),
        ("from tokenkit.bpe.io import read_hf", ["tokenkit.bpe.io"]),
        ("from tokenkit.common.atomic import write_atomic", ["tokenkit.common.atomic"]),
        ("from . import io", ["tokenkit.bpe.io"]),
        ("from .io import read_hf", ["tokenkit.bpe.io"]),
        ("from .. import common", ["tokenkit.common"]),
        ("import numpy, regex", []),
        ("from tokenkit.bpe.tokenizer import Tokenizer", []),  # the module itself
    ],
)
def test_imports_are_resolved_to_modules(source, expected):
    assert [e.target for e in imports_of("tokenkit.bpe.tokenizer", source, False, FAKE)] == expected


def test_every_import_statement_is_seen():
    source = (
        "import tokenkit.bpe.io\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from tokenkit.common import atomic\n"
        "class C:\n    def f(self):\n        from tokenkit.bpe import Tokenizer\n"
    )
    found = imports_of("tokenkit.bpe.tokenizer", source, False, FAKE)
    assert [(e.target, e.line, e.in_function, e.type_checking) for e in found] == [
        ("tokenkit.bpe.io", 1, False, False),
        ("tokenkit.common.atomic", 4, False, True),
        ("tokenkit.bpe", 7, True, False),
    ]


def test_a_cycle_is_found_and_shown():
    a_b = Import("a", "b", 3, False, False)
    b_c = Import("b", "c", 5, True, False)
    c_a = Import("c", "a", 7, False, True)
    assert find_cycle([a_b, Import("c", "d", 1, False, False)]) is None
    cycle = find_cycle([a_b, b_c, c_a])
    assert cycle == [a_b, b_c, c_a]
    assert shown(cycle).splitlines()[0] == "a -> b -> c -> a"
    assert find_cycle([Import("x", "y", 1, False, False), a_b, b_c, c_a, Import("y", "a", 1, False, False)])


# ---------------------------------------------------------------------------------------------
# the real tree


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    found = all_imports()
    assert any(e.source == "tokenkit.bpe.tokenizer" and e.target == "tokenkit.bpe.layout" for e in found)
    return found


def test_bpe_modules_stand_in_layers(imports):
    inside = [e for e in imports if part(e.source) == part(e.target) == "bpe"]
    if (cycle := find_cycle(inside)) is not None:
        pytest.fail("bpe/ has an import cycle:\n" + shown(cycle), pytrace=False)
    hidden = [str(e) for e in inside if e.in_function]
    if hidden:
        pytest.fail("bpe/ imports bpe modules inside functions (import them at the top):\n" + "\n".join(hidden), False)


def test_packages_keep_apart(imports):
    bad = [str(e) for e in imports if part(e.target) in FORBIDDEN.get(part(e.source), ())]
    if bad:
        pytest.fail("imports across package lines:\n" + "\n".join(bad), pytrace=False)


def test_no_import_cycle_in_tokenkit(imports):
    if (cycle := find_cycle(e for e in imports if not e.in_function)) is not None:
        pytest.fail("tokenkit has an import cycle at module level:\n" + shown(cycle), pytrace=False)
