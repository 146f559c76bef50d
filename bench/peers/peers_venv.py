"""The peers' own virtual environment (bench/peers/.venv), built from requirements.txt
so the peers never enter the project's dependencies."""

from __future__ import annotations

import hashlib
import subprocess
import sys

from systems.base import PEERS_BIN, PEERS_DIR, PEERS_VENV

REQUIREMENTS = PEERS_DIR / "requirements.txt"
STAMP = PEERS_VENV / "requirements.sha256"


def install_command() -> str:
    """What to run by hand if the automatic install fails."""
    return f"python3 -m venv {PEERS_VENV} && {PEERS_BIN / 'pip'} install -r {REQUIREMENTS}"


def ensure_peers_venv() -> None:
    """Create or update the venv when requirements.txt changed since it was built (the
    stamp holds the file's hash), so a checkout runs with one command."""
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if (PEERS_BIN / "python").exists() and STAMP.exists() and STAMP.read_text() == wanted:
        return
    print(f"installing the peers into {PEERS_VENV} ...", flush=True)
    try:
        if not (PEERS_BIN / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run(
            [str(PEERS_BIN / "pip"), "install", "-q", "-r", str(REQUIREMENTS)], check=True
        )
    except subprocess.CalledProcessError as exc:
        raise SystemExit(
            f"peer install failed ({exc}); run by hand:\n  {install_command()}"
        ) from exc
    STAMP.write_text(wanted)
