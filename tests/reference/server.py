"""LangGraph's own server for the differential tests: a venv of its packages, pinned,
made once under `.venv-langgraph/` (one pytest worker at a time), and the server started
on a free loopback port with the reference graph."""

import fcntl
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
VENV = HERE.parent.parent / ".venv-langgraph"
# The versions the differential tests were recorded against (LangGraph's in-memory
# server as `langgraph dev` 0.4 runs it, and the Python SDK it ships with).
PINS = (
    "langgraph-api==0.16.7",
    "langgraph-runtime-inmem==0.36.7",
    "langgraph==1.2.24",
    "langgraph-sdk==0.4.14",
)
START_WITHIN_S = 60.0
# The reference graph's id, as serve.py registers chat_graph.py.
GRAPH = "chat"


def ensure_venv() -> Path:
    """The reference venv's Python, installed from the package index when missing."""
    python = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    with (HERE / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == "\n".join(PINS):
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PINS],
            check=True,
            capture_output=True,
            timeout=600,
        )
        stamp.write_text("\n".join(PINS))
    return python


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _serves_graph(url: str) -> bool:
    """Whether the server answers and has registered the reference graph: under load it
    answers `/ok` before its graphs are loaded, and a run on `chat` is then refused."""
    if httpx.get(f"{url}/ok", timeout=2).status_code != 200:
        return False
    found = httpx.post(f"{url}/assistants/search", json={"graph_id": GRAPH, "limit": 1}, timeout=2)
    return found.status_code == 200 and len(found.json()) > 0


@contextmanager
def langgraph_server(log: Path) -> Iterator[str]:
    """LangGraph's server with the reference graph `chat`; yields its base URL."""
    python = ensure_venv()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(python), str(HERE / "serve.py"), str(port), str(HERE / "chat_graph.py")],
            stdout=out,
            stderr=subprocess.STDOUT,
            # Where it keeps what it keeps of its queue (.langgraph_api/): not the checkout.
            cwd=log.parent,
        )
        try:
            deadline = time.monotonic() + START_WITHIN_S
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"LangGraph's server exited: {_tail(log)}")
                try:
                    if _serves_graph(url):
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"LangGraph's server did not start: {_tail(log)}")
                time.sleep(0.1)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
