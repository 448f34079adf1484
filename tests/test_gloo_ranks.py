"""tests/gloo_ranks.py's `spawn`: ranks forked from the fork server run in the test's environment of the moment."""

import os

from gloo_ranks import spawn


def _report(rank: int, out_dir: str) -> None:
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(f"{os.environ.get('QUIVER_GLOO_RANKS_PROBE')} {os.getppid()}")


def test_ranks_see_the_environment_the_test_set_after_the_server_started(tmp_path, monkeypatch):
    spawn(_report, args=(str(tmp_path),), nprocs=1)  # starts the server (or finds it started)
    first = (tmp_path / "rank0").read_text().split()
    monkeypatch.setenv("QUIVER_GLOO_RANKS_PROBE", "set-later")
    spawn(_report, args=(str(tmp_path),), nprocs=2)
    reports = [(tmp_path / f"rank{rank}").read_text().split() for rank in range(2)]
    assert first[0] == "None"
    # Both ranks: the variable set after the server started, and the first call's rank's parent (one fork server for
    # the test worker, not the test's own process).
    assert reports == [["set-later", first[1]]] * 2
    assert first[1] != str(os.getpid())
