"""What `make lint` measures: import circles and blocks repeated in two places."""

from pathlib import Path

import pytest

from runwire.infra import lint

pytestmark = pytest.mark.unit


def test_a_circle_through_a_third_module_is_found() -> None:
    graph = {
        "runwire.runners.base": {"runwire.runners.tools"},
        "runwire.runners.tools": {"runwire.runners.registry"},
        "runwire.runners.registry": {"runwire.runners.base", "runwire.contracts"},
        "runwire.contracts": set(),
    }
    assert lint.circles(graph) == [
        ["runwire.runners.base", "runwire.runners.registry", "runwire.runners.tools"]
    ]
    graph["runwire.runners.base"] = set()
    assert lint.circles(graph) == []


def test_our_modules_import_each_other_without_circles() -> None:
    graph = lint.import_graph()
    assert "runwire.runners.base" in graph
    assert "runwire.contracts.frames" in graph["runwire.runners.base"]
    assert lint.circles(graph) == []


def test_the_client_side_imports_nothing_of_the_servers() -> None:
    graph = {
        "runwire.client.cli": {"runwire.client.sdk", "runwire.contracts.identities"},
        "runwire.client.sdk": {"runwire.contracts"},
        "runwire.contracts": set(),
        "runwire.infra.tenants": {"runwire.client.sdk", "runwire.infra.auth"},
    }
    assert lint.client_side_imports(graph) == []  # the server's tools may use the client
    graph["runwire.client.cli"].add("runwire.infra.auth")
    graph["runwire.contracts"].add("runwire.gateway.keys")
    assert lint.client_side_imports(graph) == [
        "runwire.client.cli imports runwire.infra.auth",
        "runwire.contracts imports runwire.gateway.keys",
    ]
    # And ours do not: a plain `pip install runwire` has what its client needs.
    assert lint.client_side_imports(lint.import_graph()) == []


def test_a_block_repeated_in_two_files_counts_once_whatever_its_length(tmp_path: Path) -> None:
    shared = [f"value_{i} = compute({i})" for i in range(9)]
    (tmp_path / "a.py").write_text("\n".join(["import os", "", *shared, "print(1)"]))
    (tmp_path / "b.py").write_text("\n".join(["# a copy", *shared, "", "print(2)"]))
    (tmp_path / "c.py").write_text("\n".join(shared[:5]))  # five lines: not repeated code
    repeats = lint.repeated_blocks(sorted(tmp_path.glob("*.py")), root=tmp_path)
    assert repeats == [lint.Repeat("a.py:3", "b.py:2", 9)]


def test_a_migration_restating_an_older_ones_list_is_not_repeated_code(tmp_path: Path) -> None:
    # A later migration that widens a CHECK restates its list: neither may be edited.
    folder = tmp_path / "services/runtime/migrations"
    folder.mkdir(parents=True)
    names = [f"    'event_{i}'," for i in range(8)]
    (folder / "0040_events.sql").write_text("\n".join(["ADD CONSTRAINT c CHECK (", *names, ")"]))
    (folder / "0041_more.sql").write_text("\n".join(["ADD CONSTRAINT c CHECK (", *names, ")"]))
    (tmp_path / "code.sql").write_text("\n".join(["SELECT (", *names, ")"]))
    paths = sorted(tmp_path.rglob("*.sql"))
    repeats = lint.repeated_blocks(paths, root=tmp_path)
    # What live code repeats of a migration still counts, once per migration.
    assert {(r.first.split(":")[0], r.second.split(":")[0]) for r in repeats} == {
        ("code.sql", "services/runtime/migrations/0040_events.sql"),
        ("code.sql", "services/runtime/migrations/0041_more.sql"),
    }
