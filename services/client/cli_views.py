"""What the `runwire` command prints: a run's frames as they come, a run in a line, a
workflow run's node tree, a wait and how to answer it, a service's health."""

import json
import sys

from runwire.client.sdk import Client, Transcript
from runwire.contracts.frames import Frame, FrameType, WaitData, WaitKind
from runwire.contracts.health import HealthReply
from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus
from runwire.contracts.workflows import NodeRunData

# The exit status of a command whose run (or check) did not succeed.
EXIT_FAILED = 1


def node_tree(run: RunSummary) -> str:
    """A workflow run and its node runs: each fallback under the node it stands in for."""
    release = (
        f" (release {run.workflow.release_id} v{run.workflow.version})" if run.workflow else ""
    )
    lines = [f"run {run.run_id} {run.status}{release}"]
    by_slot: dict[str, list[NodeRunData]] = {}
    for node in run.nodes:
        by_slot.setdefault(node.slot, []).append(node)
    for slot, chain in by_slot.items():
        for depth, node in enumerate(chain):
            code = f"  {node.error['code']}" if node.error and "code" in node.error else ""
            stands_in = f"  (in place of {slot})" if node.node_id != slot else ""
            lines.append(
                f"{'  ' * (depth + 1)}{'└─ ' if depth else ''}{node.node_id:<20} "
                f"{node.status:<10} attempt {node.attempt}{code}{stands_in}"
            )
            if node.waiting_for is not None:
                lines.append(f"{'  ' * (depth + 3)}{node_wait_line(run.run_id, node)}")
    if run.workflow is not None and not run.nodes:
        lines.append("  (no node has started)")
    return "\n".join(lines)


def node_wait_line(run_id: str, node: NodeRunData) -> str:
    """What a waiting node waits for, and how to answer it: a question to its node run,
    a signal to the workflow run (which keeps it for the node)."""
    wait = WaitData.model_validate(node.waiting_for)
    if wait.kind == WaitKind.SLEEP:
        return f"sleeps until {wait.timeout_at.isoformat() if wait.timeout_at else '?'}"
    if wait.kind == WaitKind.SIGNAL:
        return (
            f"waits for the signal {wait.name}: runwire signal {run_id} {wait.name} --payload JSON"
        )
    return f"asks {json.dumps(wait.payload)}: runwire resume {node.node_run_id} --value JSON"


async def watch_nodes(client: Client, run_id: str) -> int:
    """Print the node tree, then again each time it changes, until the run ends (a run
    that has ended: once)."""
    run = await client.get(run_id)
    shown = node_tree(run)
    print(shown, flush=True)
    if not run.status.terminal:
        async for frame in client.stream(run_id, run.last_seq):
            if frame.type not in (FrameType.NODE, FrameType.DONE):
                continue
            run = await client.get(run_id)
            if (tree := node_tree(run)) != shown:
                shown = tree
                print(shown, flush=True)
    return 0 if run.status == RunStatus.FINISHED else EXIT_FAILED


async def watch(client: Client, run_id: str, after: int, frames: bool) -> int:
    transcript = Transcript()
    status = "unknown"
    async for frame in client.stream(run_id, after):
        if frames:
            print(frame.model_dump_json(), flush=True)
        else:
            print_frame(frame, transcript)
        if frame.type == FrameType.DONE:
            status = str(frame.data.get("status"))
            code = frame.data.get("code")
            if not frames:
                print(f"\nrun {run_id} {status}" + (f" ({code})" if code else ""), flush=True)
    return 0 if status == "finished" else EXIT_FAILED


def print_frame(frame: Frame, transcript: Transcript) -> None:
    before = transcript.text
    transcript.apply(frame)
    if frame.type == FrameType.MESSAGE:
        sys.stdout.write(transcript.text[len(before) :])
        sys.stdout.flush()
    elif frame.type == FrameType.RUN and frame.data.get("resumed"):
        print(
            f"\n[attempt {frame.data.get('attempt')} resumes after "
            f"{frame.data.get('partial_length')} characters]",
            flush=True,
        )
        sys.stdout.write(transcript.text)
    elif frame.type == FrameType.ERROR:
        print(f"\n[error {frame.data.get('code')}: {frame.data.get('message')}]", flush=True)
    elif frame.type == FrameType.WAIT:
        print(f"\n[{wait_line(frame)}]", flush=True)


def run_line(run: RunSummary) -> str:
    """A run in a line: id, status, when it was submitted, and what a waiting one waits
    for."""
    line = f"{run.run_id}  {run.status.value:<11} {run.created_at.isoformat()}"
    if run.error is not None:
        line += f"  {run.error.code}"
    if run.waiting_for is not None:
        wait = run.waiting_for
        what = wait.name if wait.kind == WaitKind.SIGNAL else json.dumps(wait.payload)
        line += f"  waits ({wait.kind.value} {wait.wait_id}): {what}"
    return line


def wait_line(frame: Frame) -> str:
    """What a `wait` frame says, and how to answer it."""
    wait = WaitData.model_validate(frame.data)
    until = f" (until {wait.timeout_at.isoformat()})" if wait.timeout_at else ""
    if wait.kind == WaitKind.SLEEP:
        return f"sleeping until {wait.timeout_at.isoformat() if wait.timeout_at else '?'}"
    if wait.kind == WaitKind.SIGNAL:
        return (
            f"waiting for the signal {wait.name}{until}: runwire signal {frame.run_id} "
            f"{wait.name} --payload JSON"
        )
    return (
        f"waiting for an answer to {json.dumps(wait.payload)}{until}: runwire resume "
        f"{frame.run_id} --value JSON"
    )


def health_line(reply: HealthReply) -> str:
    dependencies = ", ".join(f"{name} {state}" for name, state in reply.dependencies.items())
    runners = f"  runners {', '.join(reply.runners)}" if reply.runners else ""
    return (
        f"{reply.instance}  {'ok' if reply.ok else 'not ok'}  version {reply.version}  "
        f"up {reply.uptime_s:.1f} s  {dependencies}{runners}"
    )
