"""The layout of docs/layout.md: services → runtime → contracts; client → contracts;
gateway → client; and the page's tree, the folders and pyproject.toml in step."""

import ast
import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("submitter", "executor", "relay", "recovery", "client")


def _imports(folder: Path) -> set[tuple[Path, str]]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add((path, node.module))
            elif isinstance(node, ast.Import):
                found.update((path, alias.name) for alias in node.names)
    return found


def test_contracts_import_nothing_of_ours() -> None:
    bad = [
        (p, m)
        for p, m in _imports(ROOT / "contracts")
        if m.startswith("runwire") and not m.startswith("runwire.contracts")
    ]
    assert bad == []


@pytest.mark.parametrize("service", SERVICES)
def test_no_service_imports_another(service: str) -> None:
    others = tuple(f"runwire.{s}" for s in SERVICES if s != service)
    bad = [(p, m) for p, m in _imports(ROOT / "services" / service) if m.startswith(others)]
    assert bad == []


def test_client_never_imports_the_runtime() -> None:
    bad = [
        (p, m)
        for p, m in _imports(ROOT / "services" / "client")
        if m.startswith(("runwire.runtime", "asyncpg"))
    ]
    assert bad == []


def test_the_gateway_is_only_a_client() -> None:
    # It speaks to the rest of runwire through the SDK over NATS: no store, no runtime.
    services = tuple(f"runwire.{s}" for s in SERVICES if s != "client")
    others = ("runwire.runtime", "runwire.runners", "runwire.infra", "asyncpg", *services)
    found = _imports(ROOT / "services" / "gateway")
    assert any(m.startswith("runwire.client") for _, m in found)
    assert [(p, m) for p, m in found if m.startswith(others)] == []


def test_only_the_store_and_the_test_kits_servers_import_asyncpg() -> None:
    store = ROOT / "services" / "runtime" / "store"
    # The test kit creates and drops the databases of tests, outside any service.
    servers = ROOT / "services" / "testing" / "servers.py"
    users = {p for p, m in _imports(ROOT / "services") if m.startswith("asyncpg")}
    assert users
    assert all(p.parent == store or p == servers for p in users), users


def test_the_code_imports_itself_only_through_the_runwire_namespace() -> None:
    # The folders are not packages of their own once installed: `contracts.x` would
    # work from the repository root only.
    bad = [
        (p, m)
        for folder in ("services", "contracts", "infra")
        for p, m in _imports(ROOT / folder)
        if m.split(".")[0] in ("services", "contracts", "infra", "tests")
    ]
    assert bad == []


def _layout_entries() -> list[tuple[str, str]]:
    """(path, description) of each entry of the tree in docs/layout.md."""
    text = (ROOT / "docs" / "layout.md").read_text()
    block = text.split("## Where each part lives", 1)[1].split("```\n", 2)[1]
    entries: list[tuple[str, str]] = []
    for line in block.splitlines():
        if line and not line[0].isspace():
            path, _, rest = line.partition(" ")
            entries.append((path, rest))
        elif entries:
            path, rest = entries[-1]
            entries[-1] = (path, f"{rest} {line.strip()}")
    return entries


def test_every_path_the_layout_page_names_exists() -> None:
    missing = []
    for path, description in _layout_entries():
        if not (ROOT / path).exists():
            missing.append(path)
            continue
        folder = ROOT / path if path.endswith("/") else ROOT
        for name in re.findall(r"[\w/.-]+\.(?:py|sql|html|yaml|conf|sh|json)\b", description):
            if not (folder / name).exists() and not (ROOT / name).exists():
                missing.append(f"{path}: {name}")
    assert missing == []


def test_every_package_is_in_the_layout_page_and_in_pyproject() -> None:
    mapping = {"services": "runwire", "contracts": "runwire.contracts", "infra": "runwire.infra"}
    folders = sorted(
        init.parent.relative_to(ROOT)
        for top in mapping
        for init in (ROOT / top).rglob("__init__.py")
        if "node_modules" not in init.parts
    )
    named = {path.rstrip("/") for path, _ in _layout_entries()}
    assert [str(f) for f in folders if str(f) not in named and f.parts[0] == "services"] in (
        [],
        ["services"],  # the package's root is named by its files, __init__.py among them
    )
    assert {"contracts", "infra"} <= named
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = set(pyproject["tool"]["setuptools"]["packages"])
    expected = {".".join((mapping[f.parts[0]], *f.parts[1:])) for f in folders}
    assert packages == expected
