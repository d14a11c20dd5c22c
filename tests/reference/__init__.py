"""LangGraph's own server (`langgraph-api`, in memory, as `langgraph dev` runs it) as the
oracle of the gateway's LangGraph face: its venv, its graph, and a runwire runner that
behaves as that graph does."""
