"""The import rules of docs/architecture.md, checked on the source: no service imports another
service's package, the allocator's layers import only downward, the shared packages import no
service, and no first-party modules import each other in a cycle.

Imports are read with `ast`, so every import counts: at module level, inside a function, or under
`if TYPE_CHECKING:`.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("allocator_service", "executor_service", "gateway", "kernels", "pagedserve",
               "bench", "scripts")
SERVICES = ("allocator_service", "executor_service", "gateway")

# (importer prefix, imported prefixes it must not import, why)
RULES = [
    ("executor_service", ("allocator_service", "gateway"), "a service imports no other service"),
    ("gateway", ("allocator_service", "executor_service"), "a service imports no other service"),
    ("allocator_service", ("executor_service", "gateway"), "a service imports no other service"),
    ("allocator_service.core", ("allocator_service.durability", "allocator_service.server",
                                "allocator_service.local_block_allocator"),
     "the allocator core is the bottom layer"),
    ("allocator_service.durability", ("allocator_service.server",),
     "durability sits below the server"),
    ("gateway.executors", ("gateway.openai_http",), "the executor links know no HTTP API"),
    ("pagedserve.protocol", SERVICES + ("pagedserve.cli", "pagedserve.supervisor"),
     "the shared vocabulary belongs to no service"),
    ("pagedserve.common", SERVICES + ("pagedserve.cli", "pagedserve.supervisor"),
     "shared plumbing belongs to no service"),
    ("pagedserve.gateway_client", SERVICES, "the client library needs no server code"),
    ("kernels", SERVICES + ("pagedserve",), "kernels stand alone"),
]
PRODUCT = SERVICES + ("kernels", "pagedserve")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules(root: Path) -> dict[str, Path]:
    modules = {}
    for package in FIRST_PARTY:
        for path in sorted((root / package).rglob("*.py")):
            if "_pb2" not in path.name:
                modules[module_name(path, root)] = path
    return modules


def imports_of(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """First-party modules `path` imports; `from a import b` counts as a.b when b is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in modules else base)
    return {imported for imported in found if imported.split(".")[0] in FIRST_PARTY}


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = source_modules(root)
    return {name: imports_of(path, name, modules) for name, path in modules.items()}


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def crossings(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for importer, imported in sorted(graph.items()):
        for target in sorted(imported):
            if within(importer, "bench") or within(importer, "scripts"):
                continue
            if any(within(importer, p) for p in PRODUCT) and (within(target, "bench")
                                                                or within(target, "tests")):
                found.append(f"{importer} imports {target}: the product imports no bench or test")
            for prefix, forbidden, why in RULES:
                if within(importer, prefix) and any(within(target, f) for f in forbidden):
                    found.append(f"{importer} imports {target}: {why}")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_package_imports_across_its_boundaries() -> None:
    assert crossings(import_graph(ROOT)) == []


def test_no_first_party_modules_import_each_other_in_a_cycle() -> None:
    assert cycles(import_graph(ROOT)) == []


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("importer, line, expected", [
    ("executor_service/engine/x.py", "from allocator_service.core.block import Block\n",
     "executor_service.engine.x imports allocator_service.core.block"),
    ("gateway/x.py", "import executor_service.config\n",
     "gateway.x imports executor_service.config"),
    ("allocator_service/core/x.py", "def f():\n    from allocator_service.server import y\n",
     "allocator_service.core.x imports allocator_service.server.y"),
    ("pagedserve/protocol/x.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway import y\n",
     "pagedserve.protocol.x imports gateway.y"),
])
def test_the_check_fails_on_an_added_crossing(tmp_path: Path, importer: str, line: str,
                                              expected: str) -> None:
    for package in FIRST_PARTY:
        write(tmp_path, f"{package}/__init__.py", "")
    for module in ("allocator_service/core/block.py", "allocator_service/server/y.py",
                   "executor_service/config.py", "gateway/y.py"):
        write(tmp_path, module, "")
    write(tmp_path, importer, line)
    assert [c for c in crossings(import_graph(tmp_path)) if c.startswith(expected)]


def test_the_check_finds_a_cycle(tmp_path: Path) -> None:
    for package in FIRST_PARTY:
        write(tmp_path, f"{package}/__init__.py", "")
    write(tmp_path, "gateway/a.py", "from gateway import b\n")
    write(tmp_path, "gateway/b.py", "from gateway.a import thing\n")
    assert cycles(import_graph(tmp_path)) == [["gateway.a", "gateway.b"]]
