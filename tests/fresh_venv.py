"""A fresh virtual environment outside the checkout, made without the network: its site-packages
gets a `.pth` line naming a folder of links to this environment's installed distributions, less
the ones a test leaves out (the editable hstu-replay, or torch and the target's other packages)."""

from __future__ import annotations

import re
import site
import subprocess
import sys
from pathlib import Path

EDITABLE = ("__editable__", "hstu_replay")
# The reference target's packages (extras `target` and `gpu`) and what only torch needs.
TARGET_ONLY = ("torch", "torchgen", "functorch", "triton", "pytriton", "nvidia_pytriton", "nvidia",
               "sympy", "isympy", "mpmath", "networkx")


def _distribution(entry: str) -> str:
    """`torch-2.6.0.dist-info`, `torch`, `isympy.py`, `__editable___x_finder.py` -> the leading name."""
    return "__editable__" if entry.startswith("__editable__") else re.split(r"[-.]", entry, maxsplit=1)[0].lower()


def fresh_venv(root: Path, leave_out: tuple[str, ...]) -> Path:
    """A venv under `root` seeing this one's packages except `leave_out`; returns its python."""
    packages = Path(site.getsitepackages()[0])
    links = root / "links"
    links.mkdir(parents=True)
    for entry in packages.iterdir():
        if _distribution(entry.name) not in leave_out and not entry.name.endswith(".pth"):
            (links / entry.name).symlink_to(entry)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    (Path(own) / "links.pth").write_text(f"{links}\n")
    return python
