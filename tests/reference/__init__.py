"""LangGraph's own server (`langgraph-api`, in memory, as `langgraph dev` runs it) as the
oracle of the gateway's LangGraph face: its venv, its graph, and a runwire runner that
behaves as that graph does."""

from typing import Any


def same(theirs: list[tuple[str, Any]], ours: list[tuple[str, Any]]) -> None:
    """Each observation the same, compared one by one (the first difference named)."""
    for (label, want), (label_ours, got) in zip(theirs, ours, strict=True):
        assert label == label_ours
        assert got == want, f"{label}: LangGraph's server {want!r}, the gateway {got!r}"
