"""The submitter: submit, get, cancel and abort_session commands."""
