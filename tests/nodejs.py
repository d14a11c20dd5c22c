"""The official JavaScript clients (tests/node/), installed from the committed lock file."""

import fcntl
import subprocess
from pathlib import Path

NODE_DIR = Path(__file__).resolve().parent / "node"


def install_node_modules() -> None:
    """`npm ci` from the committed lock file, once (one pytest worker at a time)."""
    with (NODE_DIR / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        modules = NODE_DIR / "node_modules"
        if not all((modules / name).is_dir() for name in ("nats", "@langchain/langgraph-sdk")):
            subprocess.run(
                ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
                cwd=NODE_DIR,
                check=True,
                capture_output=True,
                timeout=300,
            )
