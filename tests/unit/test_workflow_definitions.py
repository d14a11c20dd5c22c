"""What makes a release's definition no workflow: checked when it is published."""

from typing import Any

import pytest
from pydantic import ValidationError

from runwire.contracts.workflows import WorkflowDefinition


def _node(node_id: str, **spec: Any) -> dict[str, Any]:
    return {"id": node_id, "runner": "scripted", **spec}


def _edges(*pairs: str) -> list[dict[str, str]]:
    return [{"from": a, "to": b} for a, _, b in (p.partition(">") for p in pairs)]


def _refused(definition: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as refused:
        WorkflowDefinition.model_validate(definition)
    return str(refused.value)


def test_a_graph_with_fan_out_fan_in_and_a_fallback_chain_is_a_workflow() -> None:
    definition = WorkflowDefinition.model_validate(
        {
            "nodes": [
                _node("a"),
                _node("b", on_failure="fallback", fallback="b2"),
                _node("b2", on_failure="fallback", fallback="b3", input={"x": {"$ref": "nodes.a"}}),
                _node("b3"),
                _node("c", on_failure="skip"),
                _node("d", input={"b": {"$ref": "nodes.b.text"}, "q": {"$ref": "input.q"}}),
            ],
            "edges": _edges("a>b", "a>c", "b>d", "c>d"),
        }
    )
    assert [n.id for n in definition.nodes] == ["a", "b", "b2", "b3", "c", "d"]
    assert definition.nodes[0].input == {"$ref": "input"}  # the workflow input by default


@pytest.mark.parametrize(
    ("definition", "says"),
    [
        ({"nodes": [_node("a"), _node("b")], "edges": _edges("a>b", "b>a")}, "cycle"),
        ({"nodes": [_node("a")], "edges": _edges("a>a")}, "cycle"),
        ({"nodes": [_node("a"), _node("a")]}, "used twice: a"),
        ({"nodes": [_node("a")], "edges": _edges("a>zz")}, "names no node 'zz'"),
        ({"nodes": [_node("a", on_failure="fallback", fallback="zz")]}, "'zz', no node"),
        ({"nodes": [_node("a", on_failure="fallback", fallback="a")]}, "falls back to itself"),
        (
            {
                "nodes": [
                    _node("a", on_failure="fallback", fallback="c"),
                    _node("b", on_failure="fallback", fallback="c"),
                    _node("c"),
                ]
            },
            "the fallback of both",
        ),
        (
            {
                "nodes": [_node("a", on_failure="fallback", fallback="b"), _node("b"), _node("c")],
                "edges": _edges("b>c"),
            },
            "it runs only in its place",
        ),
        (
            {
                "nodes": [
                    _node("a", on_failure="fallback", fallback="b"),
                    _node("b", on_failure="fallback", fallback="a"),
                ]
            },
            "make a cycle",
        ),
        (
            {"nodes": [_node("a", input={"x": {"$ref": "nodes.b"}}), _node("b")]},
            "not a node before it",
        ),
        ({"nodes": [_node("a", input={"x": {"$ref": "secrets.key"}})]}, "neither input nor nodes"),
        ({"nodes": [{"id": "a"}]}, "exactly one of runner, effect or signal"),
        ({"nodes": [_node("a", effect="http")]}, "exactly one of runner, effect or signal"),
        ({"nodes": [_node("a", signal="paid")]}, "exactly one of runner, effect or signal"),
        ({"nodes": [{"id": "a", "signal": "no spaces"}]}, "signal"),
        ({"nodes": [_node("a", on_failure="fallback")]}, "fallback names the node"),
        ({"nodes": [_node("a", fallback="b"), _node("b")]}, "fallback names the node"),
        ({"nodes": [_node("A")]}, "pattern"),
        ({"nodes": []}, "at least 1"),
        ({"nodes": [_node("a", deadline_ms="100")]}, "valid integer"),
        ({"nodes": [_node("a", retry={"max_attempts": 0})]}, "greater than or equal to 1"),
    ],
)
def test_a_definition_that_is_no_workflow_is_refused_saying_why(
    definition: dict[str, Any], says: str
) -> None:
    assert says in _refused(definition)


def test_a_fallbacks_input_may_use_only_what_its_node_could() -> None:
    # b2 stands in for b, which comes after a: it may use a, never c (b's sibling).
    ok = {
        "nodes": [
            _node("a"),
            _node("b", on_failure="fallback", fallback="b2"),
            _node("b2", input={"x": {"$ref": "nodes.a"}}),
            _node("c"),
        ],
        "edges": _edges("a>b", "a>c"),
    }
    WorkflowDefinition.model_validate(ok)
    ok["nodes"][2] = _node("b2", input={"x": {"$ref": "nodes.c"}})
    assert "names 'c', which is not a node before it" in _refused(ok)
