"""Workflows: a run as a graph of nodes, from an immutable release.

A release is published once (`<prefix>.<tenant>.cmd.release`, commands.ReleaseCommand)
under a `release_id` and a `version`, and never changes. A run of it (`submit` with
`workflow`) runs each node as a node run: a run of its own, claimed, heartbeated, fenced,
retried and recovered like any attempt, created when every node it depends on has ended.
The node's input is its `input` template with every `{"$ref": "input.a.b"}` replaced by that part of
the workflow input and every `{"$ref": "nodes.<id>.a.b"}` by that part of node `<id>`'s
output (null where the path has no value).

What a node does when it fails for good (its retries spent, a fatal error, its deadline
passed): `on_failure`
- `retry` (default): its retries are spent, so the workflow run fails;
- `fail_run`: the workflow run fails at once, without retries;
- `skip`: the node is `skipped`; the nodes after it run, with null for its output;
- `fallback`: node `fallback` runs in its place (with its own input, retries, deadline
  and on_failure), and its output stands for the failed node's; not after the node's run
  performed a side effect (or may have: committed, reconciled, unknown, claimed, or failed
  by its deadline), which its fallback would repeat, unless the node sets
  `fallback_after_effect`: then the workflow run fails as with `retry`.

A node may wait (its run waits, holding no executor): its runner asks
(`ctx.interrupt`, answered by `resume` of its node run) or waits for a signal; a node
with `signal` instead of a runner waits for the signal of that name sent to its
workflow run (kept in the workflow run's mailbox until a node takes it), and the
signal's payload is its output. Its `deadline_ms` still ends it as `timed_out`, once.

A node that is some node's `fallback` runs only in that case: it has no edges of its
own, and its input may only use the workflow input and the nodes before the node it
stands in for.
"""

from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import Field, StringConstraints, model_validator

from runwire.contracts.base import WireModel
from runwire.contracts.subjects import (
    EFFECT_KIND_PATTERN,
    RUNNER_NAME_PATTERN,
    SIGNAL_NAME_PATTERN,
)

NODE_ID_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"
NodeId = Annotated[str, StringConstraints(pattern=NODE_ID_PATTERN)]
RELEASE_ID_PATTERN = r"^[a-z][a-z0-9_.-]{0,127}$"
MAX_NODES = 500
MAX_VERSION = 2**31 - 1
# Where a `$ref` may point: the workflow input, or an upstream node's output.
REF_ROOTS = ("input", "nodes")
# The runner that performs a node's side effect (a node with `effect` instead of `runner`).
EFFECT_RUNNER = "effect"
# The runner that waits for a node's signal (a node with `signal` instead of `runner`).
SIGNAL_RUNNER = "signal"


class OnFailure(StrEnum):
    """What a node that failed for good does to its workflow run."""

    RETRY = "retry"
    FAIL_RUN = "fail_run"
    SKIP = "skip"
    FALLBACK = "fallback"


class NodeStatus(StrEnum):
    """Where a node run stands. `ready`: created (or answered), waiting for an executor;
    `running`: an attempt runs; `waiting`: between attempts (a backoff, or resuming after
    a crash), or its run waits for an answer, a signal or a timer (`waiting_for`)."""

    READY = "ready"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    SKIPPED = "skipped"


class RetryPolicy(WireModel):
    """Attempts of one node run: retryable errors are retried after `backoff_ms`,
    doubling each time (with jitter; the executor's own setting when null)."""

    max_attempts: int = Field(default=3, ge=1, le=100, strict=True)
    backoff_ms: int | None = Field(default=None, ge=0, le=3_600_000, strict=True)


class NodeSpec(WireModel):
    """One node: what it runs, on what input, and what happens when it fails."""

    id: NodeId
    # The runner of its runs; or `effect`, an effect adapter that performs the node's
    # input as its request once (through the side-effect fence), the receipt its output;
    # or `signal`, the name of a signal to the workflow run that the node waits for (its
    # payload the node's output; `input` is not used).
    runner: str | None = Field(default=None, pattern=RUNNER_NAME_PATTERN)
    effect: str | None = Field(default=None, pattern=EFFECT_KIND_PATTERN)
    signal: str | None = Field(default=None, pattern=SIGNAL_NAME_PATTERN)
    input: dict[str, Any] = Field(default_factory=lambda: {"$ref": "input"})
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    on_failure: OnFailure = OnFailure.RETRY
    fallback: NodeId | None = None
    # A node run that performed a side effect (or may have) has no fallback: the node
    # in its place would do it again. True: its fallback runs all the same (it does not
    # repeat the effect, or repeating it is fine).
    fallback_after_effect: bool = Field(default=False, strict=True)
    # From the node run's creation to its end, retries included: past it the node is
    # `timed_out` (its attempt stopped) and its on_failure applies.
    deadline_ms: int | None = Field(default=None, ge=100, le=86_400_000, strict=True)
    attempt_timeout_ms: int | None = Field(default=None, ge=100, le=86_400_000, strict=True)

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if [self.runner, self.effect, self.signal].count(None) != 2:
            raise ValueError(f"node {self.id!r}: give exactly one of runner, effect or signal")
        if (self.on_failure == OnFailure.FALLBACK) != (self.fallback is not None):
            raise ValueError(
                f"node {self.id!r}: fallback names the node to run when on_failure is "
                "'fallback', and only then"
            )
        return self

    @property
    def runs_with(self) -> str:
        """The runner of the node's runs."""
        if self.signal is not None:
            return SIGNAL_RUNNER
        return self.runner or EFFECT_RUNNER


class Edge(WireModel):
    """`to` runs after `from` has ended (completed or skipped)."""

    from_: NodeId = Field(alias="from")
    to: NodeId

    model_config = WireModel.model_config | {"populate_by_name": True}


class WorkflowDefinition(WireModel):
    """The graph: nodes and the edges between them."""

    nodes: list[NodeSpec] = Field(min_length=1, max_length=MAX_NODES)
    edges: list[Edge] = Field(default_factory=list, max_length=MAX_NODES * 8)

    @model_validator(mode="after")
    def _a_graph(self) -> Self:
        problems = graph_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class WorkflowRef(WireModel):
    """Which release a run runs (its highest version when `version` is null), on what."""

    release_id: str = Field(pattern=RELEASE_ID_PATTERN)
    version: int | None = Field(default=None, ge=1, le=MAX_VERSION, strict=True)
    input: dict[str, Any] = Field(default_factory=dict)


class ReleaseRef(WireModel):
    """The release a workflow run runs."""

    release_id: str
    version: int


class NodeRunData(WireModel):
    """A node run of a workflow run. `slot` is the node whose place it fills: its own
    id, or, for a fallback, the node it stands in for. `node_run_id` is its run: join
    it to follow the node's own frames (its text deltas, tool calls)."""

    node_id: str
    slot: str
    node_run_id: str
    status: NodeStatus
    attempt: int
    version: int
    output: Any = None
    error: dict[str, Any] | None = None
    # What its run waits for, while it waits (frames.WaitData's fields).
    waiting_for: dict[str, Any] | None = None


class NodeAction(StrEnum):
    """What a `node` frame reports."""

    STARTED = "started"  # an attempt of the node run started
    RETRYING = "retrying"  # an attempt failed; another follows after a backoff
    WAITING = "waiting"  # its executor stopped, or its run waits (an answer, a signal)
    RESUMED = "resumed"  # the wait of its run was decided: its next attempt is queued
    COMPLETED = "completed"
    FAILED = "failed"
    FELL_BACK = "fell_back"  # it failed; its fallback runs in its place
    SKIPPED = "skipped"  # it failed; the nodes after it run without its output
    TIMED_OUT = "timed_out"  # its deadline passed


class NodeData(WireModel):
    """`node`: a node run of the workflow changed (see NodeAction); `reason` says why,
    in words, and `fallback` names the node that runs in its place."""

    node_id: str
    slot: str
    node_run_id: str
    action: NodeAction
    status: NodeStatus
    attempt: int
    reason: str | None = None
    code: str | None = None
    fallback: str | None = None


def _refs(template: Any) -> list[str]:
    """Every `$ref` path in a template."""
    if isinstance(template, dict):
        if set(template) == {"$ref"} and isinstance(template["$ref"], str):
            return [template["$ref"]]
        return [ref for value in template.values() for ref in _refs(value)]
    if isinstance(template, list):
        return [ref for value in template for ref in _refs(value)]
    return []


def upstream(definition: WorkflowDefinition) -> dict[str, set[str]]:
    """Each node's direct predecessors by its edges."""
    before: dict[str, set[str]] = {n.id: set() for n in definition.nodes}
    for edge in definition.edges:
        if edge.to in before:
            before[edge.to].add(edge.from_)
    return before


def graph_problems(definition: WorkflowDefinition) -> list[str]:
    """What makes `definition` no workflow (pure logic; runners are checked against the
    deployment by the submitter): duplicate ids, edges or fallbacks to unknown nodes, a
    cycle, a fallback with edges or reused, references to nodes that are not upstream."""
    problems: list[str] = []
    ids = [n.id for n in definition.nodes]
    known = set(ids)
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        problems.append(f"node ids used twice: {', '.join(duplicates)}")
    for edge in definition.edges:
        for end in (edge.from_, edge.to):
            if end not in known:
                problems.append(f"edge {edge.from_} -> {edge.to} names no node {end!r}")
        if edge.from_ == edge.to:
            problems.append(f"edge {edge.from_} -> {edge.to} is a cycle")
    if problems:
        return problems
    before = upstream(definition)
    order = _order(before)
    if order is None:
        return ["the edges make a cycle: a workflow is acyclic"]
    ancestors: dict[str, set[str]] = {}
    for name in order:
        ancestors[name] = set().union(*(ancestors[p] | {p} for p in before[name]))
    stands_in: dict[str, str] = {}
    for node in definition.nodes:
        if node.fallback is None:
            continue
        if node.fallback not in known:
            problems.append(f"node {node.id!r} falls back to {node.fallback!r}, no node")
        elif node.fallback == node.id:
            problems.append(f"node {node.id!r} falls back to itself")
        elif node.fallback in stands_in:
            problems.append(
                f"node {node.fallback!r} is the fallback of both "
                f"{stands_in[node.fallback]!r} and {node.id!r}"
            )
        else:
            stands_in[node.fallback] = node.id
    touching = {e.from_ for e in definition.edges} | {e.to for e in definition.edges}
    for fallback, failed in sorted(stands_in.items()):
        if fallback in touching:
            problems.append(
                f"node {fallback!r} is the fallback of {failed!r}: it runs only in its "
                "place, so it has no edges"
            )
    if problems:
        return problems
    # A fallback chain (a -> b -> c) ends; its members stand in for its first node.
    chain_head: dict[str, str] = {}
    for fallback in stands_in:
        seen = {fallback}
        head = stands_in[fallback]
        while head in stands_in:
            if head in seen:
                return [f"the fallbacks of {fallback!r} make a cycle"]
            seen.add(head)
            head = stands_in[head]
        chain_head[fallback] = head
    for node in definition.nodes:
        allowed = ancestors[chain_head.get(node.id, node.id)]
        for ref in _refs(node.input):
            root, _, rest = ref.partition(".")
            if root not in REF_ROOTS:
                problems.append(
                    f"node {node.id!r}: $ref {ref!r} starts with neither input nor nodes"
                )
            elif root == "nodes":
                target = rest.partition(".")[0]
                if target not in allowed:
                    problems.append(
                        f"node {node.id!r}: $ref {ref!r} names {target!r}, which is not a "
                        "node before it"
                    )
    return problems


def _order(before: dict[str, set[str]]) -> list[str] | None:
    """The nodes in an order where each comes after its predecessors; None for a cycle."""
    remaining = {node: set(preds) for node, preds in before.items()}
    order: list[str] = []
    ready = sorted(n for n, preds in remaining.items() if not preds)
    while ready:
        node = ready.pop()
        order.append(node)
        for other, preds in remaining.items():
            if node in preds:
                preds.discard(node)
                if not preds and other not in order and other not in ready:
                    ready.append(other)
    return order if len(order) == len(before) else None
