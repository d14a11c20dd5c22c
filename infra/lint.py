"""The house's measures, printed by `make lint`: module sizes, repeated blocks, the import
graph and the README's length.

Each measure has a limit. Some are held already and fail the step when broken (no
import circle, a README of at most 250 lines); the others are ratchets: a module longer
than MAX_MODULE_LINES must be named in LARGE_MODULES and may not grow past the size
written there, and the repeated blocks may not outnumber MAX_REPEATED_BLOCKS. Lower the
figures as the code gets smaller; never raise them to let a change through.
"""

import ast
import hashlib
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from runwire.runtime.store.schema import LAST_MIGRATION_WITH_FUNCTIONS

ROOT = Path(__file__).resolve().parents[1]
# The repository's folders and the package each one is (pyproject.toml).
PACKAGES = {"services": "runwire", "contracts": "runwire.contracts", "infra": "runwire.infra"}
MAX_MODULE_LINES = 600
# Modules still above the limit, each at most this long (split them; then remove them).
LARGE_MODULES: dict[str, int] = {}
README_MAX_LINES = 250
# What `pip install runwire` gives (the client and the contract) imports nothing else of
# ours: the services, the gateway and the stack's tools come with runwire[server].
CLIENT_SIDE = ("runwire.client", "runwire.contracts")
# Six or more lines (blank and comment lines aside) found in two places.
REPEAT_LINES = 6
MAX_REPEATED_BLOCKS = 8
# Generated files are measured by their generators, not here.
GENERATED = ("contracts/schema/", "services/runtime/schema.sql")
MIGRATION = re.compile(r"^services/runtime/migrations/(\d+)_\w+\.sql$")
# Lines too plain to count as repeated code: brackets, `else:`, `pass` and the like.
PLAIN = re.compile(r"^[\s)\]}(\[{,;:]*$|^(else|try|finally|pass|return|begin|end|\)\s*as)\b.{0,3}$")


def history(rel: str) -> bool:
    """Whether `rel` is a migration of the history: never edited again, so what it
    repeats of another is not a repetition to remove (see runwire.runtime.store.schema)."""
    match = MIGRATION.match(rel)
    return match is not None and int(match.group(1)) <= LAST_MIGRATION_WITH_FUNCTIONS


def sources(suffixes: tuple[str, ...]) -> Iterator[Path]:
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if (
                path.suffix in suffixes
                and "node_modules" not in path.parts
                and not rel.startswith(GENERATED)
                and not history(rel)
            ):
                yield path


def module_sizes() -> dict[str, int]:
    return {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in sources((".py",))
    }


def _code_lines(path: Path) -> list[tuple[int, str]]:
    comment = "--" if path.suffix == ".sql" else "#"
    kept = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.strip()
        if text and not text.startswith(comment) and not PLAIN.match(text):
            kept.append((number, text))
    return kept


@dataclass(frozen=True)
class Repeat:
    first: str
    second: str
    lines: int


def repeated_blocks(paths: Iterable[Path], root: Path = ROOT) -> list[Repeat]:
    """Pairs of places that share REPEAT_LINES or more code lines in a row."""
    windows: dict[str, list[tuple[str, int]]] = defaultdict(list)
    lines_of: dict[str, list[tuple[int, str]]] = {}
    for path in paths:
        rel = path.relative_to(root).as_posix()
        lines = lines_of[rel] = _code_lines(path)
        for i in range(len(lines) - REPEAT_LINES + 1):
            text = "\n".join(t for _, t in lines[i : i + REPEAT_LINES])
            windows[hashlib.sha1(text.encode()).hexdigest()].append((rel, i))
    # Windows in a row that repeat in the same two places are one repeated block.
    runs: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    for places in windows.values():
        for a in range(len(places)):
            for b in range(a + 1, len(places)):
                (fa, ia), (fb, ib) = sorted((places[a], places[b]))
                if fa == fb and abs(ia - ib) < REPEAT_LINES:
                    continue  # a block overlapping itself
                if MIGRATION.match(fa) and MIGRATION.match(fb):
                    continue  # a migration restating an older one's list: both stay as they are
                runs[(fa, fb, ib - ia)].append(ia)
    found = []
    for (fa, fb, offset), starts in runs.items():
        starts.sort()
        begin = previous = starts[0]
        for start in [*starts[1:], None]:
            if start is not None and start == previous + 1:
                previous = start
                continue
            first = lines_of[fa][begin][0]
            second = lines_of[fb][begin + offset][0]
            size = previous - begin + REPEAT_LINES
            found.append(Repeat(f"{fa}:{first}", f"{fb}:{second}", size))
            if start is not None:
                begin = previous = start
    return sorted(found, key=lambda r: -r.lines)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [PACKAGES[rel.parts[0]], *rel.with_suffix("").parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Which of our modules each of our modules imports (type-checking imports too)."""
    paths = {_module_name(p): p for p in sources((".py",))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            targets.update(c for c in candidates if c in paths and c != name)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, however indirectly (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
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
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def client_side_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from the client side (CLIENT_SIDE) of anything else of ours."""

    def ours(name: str) -> bool:
        return any(name == side or name.startswith(side + ".") for side in CLIENT_SIDE)

    return sorted(
        f"{name} imports {target}"
        for name, targets in graph.items()
        if ours(name)
        for target in targets
        if not ours(target)
    )


def main() -> int:
    failures = []
    sizes = module_sizes()
    large = sorted(((n, p) for p, n in sizes.items() if n > MAX_MODULE_LINES), reverse=True)
    print(f"modules: {len(sizes)}, largest {max(sizes.values())} lines; limit {MAX_MODULE_LINES}")
    for lines, path in large:
        allowed = LARGE_MODULES.get(path)
        state = "not allowed" if allowed is None else f"allowed up to {allowed} until split"
        if allowed is not None and lines < allowed:
            state += f"; lower its allowance to {lines}"
        print(f"  {path}: {lines} lines ({state})")
        if allowed is None or lines > allowed:
            failures.append(f"{path} has {lines} lines (limit {allowed or MAX_MODULE_LINES})")
    repeats = repeated_blocks(sources((".py", ".sql")))
    print(
        f"repeated blocks ({REPEAT_LINES}+ lines in two places): {len(repeats)}, "
        f"at most {MAX_REPEATED_BLOCKS}"
    )
    for repeat in repeats[:5]:
        print(f"  {repeat.lines} lines: {repeat.first} and {repeat.second}")
    if len(repeats) > MAX_REPEATED_BLOCKS:
        failures.append(f"{len(repeats)} repeated blocks (at most {MAX_REPEATED_BLOCKS})")
    graph = import_graph()
    groups = circles(graph)
    edges = sum(len(t) for t in graph.values())
    print(f"import graph: {len(graph)} modules, {edges} imports, {len(groups)} circles")
    for group in groups:
        print(f"  circle: {' ↔ '.join(group)}")
        failures.append(f"import circle: {', '.join(group)}")
    crossing = client_side_imports(graph)
    print(f"client side ({', '.join(CLIENT_SIDE)}): {len(crossing)} imports of the server's")
    failures += [f"the client side is not the server's: {line}" for line in crossing]
    readme = len((ROOT / "README.md").read_text().splitlines())
    print(f"README.md: {readme} lines, at most {README_MAX_LINES}")
    if readme > README_MAX_LINES:
        failures.append(f"README.md has {readme} lines")
    sys.stdout.flush()
    for failure in failures:
        print(f"lint: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
