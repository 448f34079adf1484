"""tools/start_ray.sh with a fake ssh and a fake ray: hostfile parsing, head choice, failures named, --stop."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "start_ray.sh"

FAKE_SSH = """#!/usr/bin/env bash
host="$1"; shift
echo "$host" >> "$FAKE_LOG.ssh"
case " $FAIL_HOSTS " in *" $host "*) exit 255 ;; esac
FAKE_HOST="$host" bash -c "$*"
"""
# `ray status` reports one active node per `ray start` so far.
FAKE_RAY = """#!/usr/bin/env bash
echo "${FAKE_HOST:-local} $*" >> "$FAKE_LOG"
if [ "$1" = status ]; then
  echo "Node status"; echo "Active:"
  n=$(grep -c " start " "$FAKE_LOG")
  for i in $(seq 1 "$n"); do echo " 1 node_$i"; done
  echo "Resources"; echo " 0.0/$((4 * n)).0 CPU"; echo " 0.0/$n.0 GPU"
fi
"""


@pytest.fixture()
def env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("fake_ssh", FAKE_SSH), ("fake_ray", FAKE_RAY)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# the cluster\nnode1 slots=8\n\nnode2\nnode3   # last one\n")
    return {**os.environ, "SSH": str(bin_dir / "fake_ssh"), "RAY": str(bin_dir / "fake_ray"),
            "FAKE_LOG": str(tmp_path / "log"), "RAY_ENV_SETUP": "true", "FAIL_HOSTS": "",
            "HOSTFILE": str(hostfile)}


def run(env, *args, **extra):
    return subprocess.run(["bash", str(SCRIPT), *args, "--timeout", "4"], env={**env, **extra}, capture_output=True,
                          text=True, timeout=60)


def calls(env):
    return Path(env["FAKE_LOG"]).read_text().splitlines()


def test_all_hosts_join(env):
    result = run(env)
    assert result.returncode == 0, result.stderr
    log = calls(env)
    assert log[0] == "node1 start --head --port=6379 --dashboard-host=0.0.0.0"  # the first line is the head
    assert "node2 start --address=node1:6379" in log and "node3 start --address=node1:6379" in log
    assert "all 3 nodes joined" in result.stdout and "12.0 CPU" in result.stdout


def test_head_ip_and_hostfile_argument(env, tmp_path):
    other = tmp_path / "hosts2"
    other.write_text("a\nb\n")
    result = run(env, str(other), "--head-ip", "b", "--port", "7000")
    assert result.returncode == 0, result.stderr
    assert calls(env)[:2] == ["b start --head --port=7000 --dashboard-host=0.0.0.0", "a start --address=b:7000"]


def test_unreachable_hosts_are_named(env):
    result = run(env, FAIL_HOSTS="node3")
    assert result.returncode == 1
    assert "2 of 3 nodes joined" in result.stderr and "node3" in result.stderr.split("start ray:")[-1]


def test_unreachable_head_fails_at_once(env):
    result = run(env, FAIL_HOSTS="node1")
    assert result.returncode == 1 and "the head node1 could not start ray" in result.stderr


def test_stop_reaches_every_host(env):
    result = run(env, "--stop")
    assert result.returncode == 0
    assert sorted(calls(env)) == ["node1 stop --force", "node2 stop --force", "node3 stop --force"]
    failed = run(env, "--stop", FAIL_HOSTS="node2")
    assert failed.returncode == 1 and "could not stop ray on: node2" in failed.stderr


def test_missing_or_empty_hostfile(env, tmp_path):
    result = run({k: v for k, v in env.items() if k != "HOSTFILE"})
    assert result.returncode == 2 and "no hostfile" in result.stderr
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    result = run(env, str(empty))
    assert result.returncode == 2 and "lists no host" in result.stderr
