"""The LangGraph API that the official `langgraph-sdk` clients use (threads, runs,
assistants), answered as LangGraph's own server answers for a `MessagesState` graph, so
that the clients and front ends built on them work against runwire unchanged.
tests/integration/test_langgraph_reference.py runs the same client calls against
LangGraph's server and the gateway and compares what the client sees; docs/langgraph-sdk.md
lists what is served and the differences kept on purpose.

An assistant is a runner (by name, or by the UUID LangGraph's server would give a graph
of that name), and a run's `input` is the runner's input. A thread is a session: its
runs are the session's runs, and `multitask_strategy` is the session rule (`rollback`
is `interrupt`, and the interrupted run is deleted from the thread). The thread's values
are its runs' inputs with the messages, each finished run's text added as an AI message
(gateway/lgvalues.py). Threads are kept in a key-value bucket of the broker, so any
gateway replica knows them.

Interrupts: a run whose runner asks (`ctx.interrupt`) and now waits ends its stream with
`__interrupt__`; the run reads `success` and its thread `interrupted`, with the question
in `interrupts`. `command: {"resume": value}` answers it: the thread's waiting run goes
on (the same run, where LangGraph starts a new one), streamed from the question on.
"""

from runwire.gateway.langgraph.runs import mount

__all__ = ["mount"]
