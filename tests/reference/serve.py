"""Run LangGraph's in-memory API server (what `langgraph dev` runs) on PORT with the
reference graph, nothing kept on disk: `python serve.py PORT GRAPH_FILE`. Run by the
reference venv's Python (tests/reference/server.py), never by runwire's."""

import os
import sys

os.environ.update(
    LANGSMITH_TRACING="false", LANGCHAIN_TRACING_V2="false", LANGGRAPH_NO_VERSION_CHECK="true"
)

from langgraph_api.cli import run_server

run_server(
    host="127.0.0.1",
    port=int(sys.argv[1]),
    graphs={"chat": f"{sys.argv[2]}:graph"},
    disable_persistence=True,
    # Runs of different threads at once, as runwire runs them.
    n_jobs_per_worker=10,
)
