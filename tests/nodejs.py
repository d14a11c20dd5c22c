"""The official JavaScript clients (tests/node/), installed from the committed lock file."""

import fcntl
import json
import subprocess
from pathlib import Path

NODE_DIR = Path(__file__).resolve().parent / "node"


def install_node_modules() -> None:
    """`npm ci` from the committed lock file, once (one pytest worker at a time)."""
    with (NODE_DIR / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        modules = NODE_DIR / "node_modules"
        wanted = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]
        if not all((modules / name).is_dir() for name in wanted):
            subprocess.run(
                ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
                cwd=NODE_DIR,
                check=True,
                capture_output=True,
                timeout=300,
            )


def bundle(entry: Path, out: Path) -> None:
    """`entry` (JSX, importing from tests/node's modules) bundled by esbuild for a browser
    into `out` (one ES module)."""
    install_node_modules()
    subprocess.run(
        [
            str(NODE_DIR / "node_modules" / ".bin" / "esbuild"),
            str(entry),
            "--bundle",
            "--format=esm",
            "--jsx=automatic",
            '--define:process.env.NODE_ENV="production"',
            f"--outfile={out}",
            "--log-level=warning",
        ],
        cwd=NODE_DIR,
        check=True,
        capture_output=True,
        timeout=120,
    )
