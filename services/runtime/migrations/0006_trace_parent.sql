-- The W3C trace context of the run (`traceparent`), set by the submit command: every
-- span of the run, in any service and any attempt, belongs to this trace.

ALTER TABLE runs ADD COLUMN trace_parent text;
