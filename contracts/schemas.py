"""Export the JSON Schema of every wire body to `contracts/schema/` (`make schemas`)."""

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from runwire.contracts.commands import (
    AbortSessionCommand,
    BackfillScheduleCommand,
    CancelCommand,
    EndTenantCommand,
    ForgetTenantCommand,
    GetBudgetCommand,
    GetCommand,
    GetPolicyCommand,
    GetRateLimitsCommand,
    GetWebhooksCommand,
    JoinCommand,
    ListCommand,
    ListSchedulesCommand,
    ReleaseCommand,
    RemoveScheduleCommand,
    RescheduleCommand,
    ResolveEffectCommand,
    ResumeCommand,
    SetBudgetCommand,
    SetPolicyCommand,
    SetRateLimitCommand,
    SetScheduleCommand,
    SetWebhooksCommand,
    SignalCommand,
    SubmitCommand,
)
from runwire.contracts.errors import ErrorReply
from runwire.contracts.events import RunEvent
from runwire.contracts.frames import FRAME_DATA, Frame, Job
from runwire.contracts.health import HealthReply
from runwire.contracts.replies import (
    AbortSessionReply,
    BudgetReply,
    EndTenantReply,
    ForgetTenantReply,
    JoinReply,
    ListReply,
    PolicyReply,
    RateLimitsReply,
    ReleaseReply,
    ResumeReply,
    RunReply,
    RunSummary,
    SchedulesReply,
    SignalReply,
    SubmitReply,
    WebhooksReply,
)
from runwire.contracts.scripted import ScriptedInput
from runwire.contracts.webhooks import WebhookPayload
from runwire.contracts.workflows import WorkflowDefinition

SCHEMA_DIR = Path(__file__).parent / "schema"

EXPORTED: tuple[type[BaseModel], ...] = (
    SubmitCommand,
    ReleaseCommand,
    CancelCommand,
    GetCommand,
    ListCommand,
    AbortSessionCommand,
    EndTenantCommand,
    ForgetTenantCommand,
    RescheduleCommand,
    ResumeCommand,
    SignalCommand,
    ResolveEffectCommand,
    SetBudgetCommand,
    GetBudgetCommand,
    SetPolicyCommand,
    SetRateLimitCommand,
    GetRateLimitsCommand,
    SetWebhooksCommand,
    GetWebhooksCommand,
    SetScheduleCommand,
    RemoveScheduleCommand,
    ListSchedulesCommand,
    BackfillScheduleCommand,
    GetPolicyCommand,
    JoinCommand,
    SubmitReply,
    ReleaseReply,
    BudgetReply,
    PolicyReply,
    RateLimitsReply,
    RunReply,
    AbortSessionReply,
    EndTenantReply,
    ForgetTenantReply,
    ResumeReply,
    SignalReply,
    WebhooksReply,
    SchedulesReply,
    JoinReply,
    ListReply,
    ErrorReply,
    RunSummary,
    Frame,
    Job,
    RunEvent,
    HealthReply,
    ScriptedInput,
    WorkflowDefinition,
    WebhookPayload,
    # The `data` of each frame type (ErrorBody for `error`).
    *FRAME_DATA.values(),
)


def render() -> dict[str, str]:
    """File name → JSON text of each exported model's schema."""
    return {
        f"{model.__name__}.json": json.dumps(model.model_json_schema(), indent=2, sort_keys=True)
        + "\n"
        for model in EXPORTED
    }


def main() -> None:
    """Write every schema, removing files of models no longer exported."""
    SCHEMA_DIR.mkdir(exist_ok=True)
    rendered = render()
    for stale in SCHEMA_DIR.glob("*.json"):
        if stale.name not in rendered:
            stale.unlink()
    for name, text in rendered.items():
        (SCHEMA_DIR / name).write_text(text)
    sys.stdout.write(f"wrote {len(rendered)} schemas to {SCHEMA_DIR}\n")


if __name__ == "__main__":
    main()
