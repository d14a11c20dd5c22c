"""A local stack's ports: the gateway's port a shell asks for is not bound until the
gateway starts, so the operating system may hand the same port out again; no server may
be given it (CI once saw Postgres and the gateway on one port, the gateway unable to
bind)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from runwire.infra import ports as ports_module
from runwire.infra.layout import Layout
from runwire.infra.ports import load_ports, stored_ports

pytestmark = pytest.mark.unit

ASKED = 47309


def _handing_out(monkeypatch: pytest.MonkeyPatch, *handed: int) -> None:
    """The operating system's free ports, in this order: the asked port comes first, as
    it may while nothing listens on it."""
    queue: Iterator[int] = iter(handed)
    monkeypatch.setattr(ports_module, "find_free_port", lambda: next(queue))


def test_no_server_is_given_the_gateway_port_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _handing_out(monkeypatch, ASKED, 41001, ASKED, 41002)
    chosen = load_ports(Layout(repo=tmp_path, folder=tmp_path), servers=1, gateway_port=ASKED)
    assert chosen.gateway == ASKED
    assert {chosen.nats, chosen.postgres} == {41001, 41002}


def test_a_cluster_gets_none_of_the_asked_port_either(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _handing_out(monkeypatch, 41001, 41002, *range(42001, 42005), ASKED, *range(42005, 42011))
    chosen = load_ports(Layout(repo=tmp_path, folder=tmp_path), servers=3, gateway_port=ASKED)
    assert ASKED not in chosen.cluster
    assert len(set(chosen.cluster)) == 9
    assert chosen.gateway_2 not in {ASKED, chosen.nats, chosen.postgres, *chosen.cluster}


def test_stored_server_ports_on_the_asked_port_are_chosen_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = Layout(repo=tmp_path, folder=tmp_path)
    _handing_out(monkeypatch, 41001, ASKED)
    first = load_ports(layout, servers=1, gateway_port=41500)
    assert first.postgres == ASKED
    _handing_out(monkeypatch, 41003, 41004)
    again = load_ports(layout, servers=1, gateway_port=ASKED)
    assert (again.nats, again.postgres, again.gateway) == (41003, 41004, ASKED)
    assert stored_ports(layout) == again
