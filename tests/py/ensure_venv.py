"""Creates (once) a virtualenv with pymongo for the pymongo policy tests.

Usage: python3 ensure_venv.py VENV_DIR

Safe to run from parallel test processes: an exclusive lock on VENV_DIR.lock serialises
creation, and a venv that already imports pymongo is reused. Exits non-zero with a message
on stderr when the venv cannot be made (no silent skip).
"""

import fcntl
import os
import shutil
import subprocess
import sys

PYMONGO = "pymongo>=4.9,<5"


def has_pymongo(python):
    if not os.path.exists(python):
        return False
    probe = [python, "-c", "import pymongo, sys; sys.stdout.write(pymongo.version)"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ensure_venv.py VENV_DIR")
    venv = os.path.abspath(sys.argv[1])
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    python = os.path.join(venv, "bin", "python")
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if has_pymongo(python):
            return
        if os.path.exists(venv):
            shutil.rmtree(venv)  # half-made by an interrupted run
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", PYMONGO]
        subprocess.run(pip, check=True)
        if not has_pymongo(python):
            sys.exit(f"pymongo still not importable from {python}")


if __name__ == "__main__":
    main()
