-- A workflow node whose run waited (an answer, a signal, a timer) and was answered:
-- the run event `node_resumed`.
ALTER TABLE run_events DROP CONSTRAINT run_events_event_known;
ALTER TABLE run_events ADD CONSTRAINT run_events_event_known CHECK (event IN (
    'submitted', 'claimed', 'finished', 'failed', 'canceled', 'retry', 'released',
    'cancel_requested', 'session_turn', 'recovering', 'interrupted',
    'waiting', 'resumed', 'signaled',
    'budget_reserved', 'budget_settled', 'budget_released', 'effect_resolved',
    'node_ready', 'node_started', 'node_retrying', 'node_waiting', 'node_resumed',
    'node_completed', 'node_failed', 'node_fell_back', 'node_skipped', 'node_timed_out'))
    NOT VALID;
