"""`make bench`: throughput, latency, streaming, re-join, recovery, memory, overload
and the DBOS and pgqueuer peers, against a stack the bench starts itself."""
