"""benchmarks/.venv: the peers torchdoctor is compared with, kept out of the project's venv.

One pip command installs torch (pinned: a peer must never upgrade it), the peers and
torchdoctor's own dependencies; torchdoctor itself is then installed from this checkout
with `pip install -e . --no-deps`. Scripts import this module to find or create it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: torchdoctor depends on tomli there
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV = HERE / ".venv"
PYTHON = VENV / "bin" / "python"
TORCH_PIN = "torch==2.13.0"  # the CPU build the project's .venv carries
PEERS = ("accelerate", "lightning", "torchfix", "ruff", "matplotlib")
# import names that must work in the venv
PROBE = (
    "import torch, accelerate, lightning, lightning_utilities, torchfix, matplotlib, torchdoctor"
)


def project_dependencies() -> list[str]:
    """torchdoctor's runtime requirements (with their markers) from pyproject.toml."""
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return list(tomllib.load(handle)["project"]["dependencies"])


def in_peer_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def ready() -> bool:
    if not PYTHON.exists():
        return False
    probe = subprocess.run([str(PYTHON), "-c", PROBE], capture_output=True, check=False)
    ruff = VENV / "bin" / "ruff"
    return probe.returncode == 0 and ruff.exists()


def ensure_peer_venv(log: bool = True) -> Path:
    """Create benchmarks/.venv with every peer unless it is already complete; its python."""
    if ready():
        return PYTHON
    if not PYTHON.exists():
        if log:
            print(f"creating {VENV} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if log:
        print(f"installing {TORCH_PIN} and {', '.join(PEERS)} into {VENV} ...", file=sys.stderr)
    subprocess.run([*pip, TORCH_PIN, *PEERS, *project_dependencies()], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True)
    return PYTHON
