"""What a service publishes through the `Broker` seam, declared on its FastStream broker.

Jobs, frames and run events leave through our own code (pipelined JetStream publishes
whose acknowledgement errors become QUEUE_FULL or UNAVAILABLE; jobs, closing frames and
run events from the outbox, `runwire.runtime.outbox`), not through FastStream
publishers, and the executor's jobs and the frames the relay archives are consumed by
our own consumers (`runwire.runtime.consumer`). A service declares here
what it publishes, as FastStream publishers of its application that are never called,
so that the AsyncAPI document (`runwire.asyncapi`) lists them with their contract
schemas, next to the subscribers FastStream does serve. Each declaration says who
consumes the subject.
"""

from typing import Any

from runwire.contracts.events import RunEvent
from runwire.contracts.frames import Frame, Job
from runwire.runtime.app import Service
from runwire.runtime.streams import EXECUTOR_CONSUMER

TENANT = "{tenant}"
RUN_ID = "{run_id}"


def jobs(service: Service[Any]) -> None:
    """A run's job, from the outbox (the submitter, executors, recovery's sweep)."""
    s = service.subjects
    service.faststream.publisher(
        s.job("{runner}", RUN_ID),
        title="jobs",
        description=(
            f"Internal. A run's job, stored in the work-queue stream `{s.jobs_stream}`: "
            "written to the outbox by the transition that queues an attempt, published by "
            "the service that committed it (a submit, an executor's shutdown) or, once "
            "due, by recovery's outbox sweep (a retry after its backoff, a recovered run). "
            "Only executors that have the run's runner take it, through that runner's "
            f"durable pull consumer `{EXECUTOR_CONSUMER}-<runner>`."
        ),
        schema=Job,
    )


def frames_out(service: Service[Any]) -> None:
    """A run's numbered frames (executors; closing frames from the submitter and
    recovery)."""
    s = service.subjects
    service.faststream.publisher(
        s.frames_out(TENANT, RUN_ID),
        title="frames.out",
        description=(
            f"Internal. A run's frames, each published once, numbered after the run's last "
            f"stored frame and fenced by it (`Nats-Expected-Last-Subject-Sequence`): the "
            f"stream `{s.run_frames_stream}` stores each under the run's client subject "
            f"`{s.run_frames(TENANT, RUN_ID)}`. Published by "
            "executors; a run's closing frames, `error` and `done`, come from the outbox: "
            "published by the service whose transition ended the run, or by recovery's "
            "outbox sweep."
        ),
        schema=Frame,
    )


def client_frames(service: Service[Any]) -> None:
    """A run's frames as clients read them (stored by the stream; the relay archives them
    and answers joins)."""
    s = service.subjects
    service.faststream.publisher(
        s.run_frames(TENANT, RUN_ID),
        title="runs.frames",
        description=(
            f"A run's frames in `seq` order (JetStream stream `{s.run_frames_stream}`, "
            f"which stores what executors and the outbox publish on "
            f"`{s.frames_out(TENANT, RUN_ID)}`, and republishes each frame it stores on "
            f"`{s.live_frames(TENANT, RUN_ID)}` for plain subscriptions). "
            "`seq` increases across attempts; `done` is last. Read from a cursor with "
            "`cmd.join`, then live from its `stream_seq`."
        ),
        schema=Frame,
    )


def events(service: Service[Any]) -> None:
    """Every recorded transition of a run (recovery's outbox sweep)."""
    s = service.subjects
    service.faststream.publisher(
        s.events(TENANT, RUN_ID),
        title="events",
        description=(
            f"Every recorded transition of a run, after its commit, in the order of the "
            f"run's transitions (JetStream stream `{s.events_stream}`; published from the "
            f"outbox by recovery's sweep); follow a tenant's runs on "
            f"`{s.events(TENANT, '>')}`."
        ),
        schema=RunEvent,
    )
