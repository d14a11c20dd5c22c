"""runwire's services: runtime (shared), submitter, executor, relay, recovery, client."""
