-- Where to acknowledge the job of a running attempt. When its executor dies, recovery
-- terminates that job at once, so it stops holding a slot of the global in-flight limit
-- until its ack wait runs out.

ALTER TABLE runs ADD COLUMN job_ack text;
