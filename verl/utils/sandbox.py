"""Run untrusted, model-written programs: the one way code rewards and the python tool execute code.

    result = run_python("print(int(input()) * 2)", stdin="21\\n", limits=SandboxLimits(wall_time_s=2))
    result.status, result.stdout        # ("ok", "42\\n")

Every run gets a fresh temporary directory, rlimits (CPU, address space, file size, no core dumps) and its own session
(so also its own scheduler autogroup: a fork bomb competes for CPU as one), is the OOM killer's first choice, and is
killed as a whole when its wall clock runs out or a stream passes `max_output_bytes`. Where the machine allows it
(root and util-linux `unshare`; checked once per process, see `isolation_status()`), the program also runs

- in new pid, mount, IPC and network namespaces: no network at all (not even loopback), and when the namespace's
  first process (our launcher) exits the kernel kills every process left in it, daemons included;
- in a private root file system: the system directories (/usr, /etc, ...) and the Python installation read-only and
  nosuid, fresh /dev, /proc, and a size-limited tmpfs at /tmp whose `/tmp/work` is the working directory and $HOME.
  The checkout, /root, /home and other runs' directories are not there;
- under a uid of its own (>= 2**30, never a real account), so RLIMIT_NPROC bounds a fork bomb to this run and the
  program cannot signal or read anything of the trainer's; no_new_privs forbids regaining privileges.

Elsewhere it degrades to rlimits plus its own session (and the uid drop if we are root), and logs once what is missing.

How a run is built: the trainer starts `[unshare ...] python -I -S this_file.py <spec>`. This file, run as a script,
is the launcher: it builds the private root, forks the program (rlimits, uid drop, exec), waits for it and writes a
JSON report (exit code, CPU seconds, or the setup error) to a pipe only it holds. The trainer stops a run by closing
its end of that pipe, and so does the kernel when the trainer dies: either way the launcher then kills the run.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import logging
import math
import os
import re
import resource
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

logger = logging.getLogger(__name__)

STATUSES = ("ok", "runtime_error", "timeout", "memory_limit", "output_limit", "sandbox_error")


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. Memory and CPU limits are per process (rlimits); processes are counted per run where the
    uid drop is active."""

    wall_time_s: float = 10.0  # whole run, interpreter start-up included; then the process tree is killed
    cpu_time_s: float | None = None  # RLIMIT_CPU, rounded up; None = wall_time_s
    memory_mb: int = 1024  # RLIMIT_AS: address space of each process
    file_size_mb: int = 16  # RLIMIT_FSIZE: largest file a process may write
    max_processes: int = 32  # RLIMIT_NPROC: processes and threads of the run (needs the uid drop)
    max_output_bytes: int = 64 * 1024  # per stream; beyond it the run is killed, status "output_limit"
    tmpfs_mb: int = 64  # size of the private /tmp (and of /dev/shm) in namespace mode
    network: bool = False  # False = a new network namespace without any interface up

    def __post_init__(self):
        positive = (
            "wall_time_s",
            "cpu_time_s",
            "memory_mb",
            "file_size_mb",
            "max_processes",
            "max_output_bytes",
            "tmpfs_mb",
        )
        for name in positive:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"SandboxLimits.{name}={value} must be positive")


@dataclass
class SandboxResult:
    status: str  # one of STATUSES
    returncode: int | None  # the program's exit code, -N if signal N ended it; None if the sandbox killed it
    stdout: str  # truncated to max_output_bytes (then status is "output_limit")
    stderr: str  # for "sandbox_error" it ends with what went wrong
    wall_time_s: float
    cpu_time_s: float | None = None  # user + system seconds of the program and the children it waited for

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class SandboxRequest:
    """One `run_python` call, for `SandboxPool`."""

    code: str
    stdin: str = ""
    limits: SandboxLimits | None = None
    files: dict[str, str] | None = None


def run_python(
    code: str, stdin: str = "", limits: SandboxLimits | None = None, files: dict[str, str] | None = None
) -> SandboxResult:
    """Run `code` as `main.py` with the base interpreter (no venv packages) in a fresh working directory that also
    holds `files` (relative path -> text). The interpreter runs as `python -I` but for the working directory being
    on sys.path, so that `files` can be imported."""
    if files and "main.py" in files:
        raise ValueError("files must not contain 'main.py': the code argument is written there")
    argv = [_BASE_PYTHON, "-E", "-s", "-B", "main.py"]
    return run_command(argv, stdin, limits, {**(files or {}), "main.py": code})


def run_command(
    argv: list[str], stdin: str = "", limits: SandboxLimits | None = None, files: dict[str, str] | None = None
) -> SandboxResult:
    """Run `argv` (argv[0] looked up on the sandbox's PATH, /usr/bin:/bin) like `run_python` runs its program."""
    return _run(argv, stdin, limits or SandboxLimits(), files or {}, _plan())


class SandboxPool:
    """Runs many programs at once, `max_workers` at a time (threads driving one subprocess each).

    with SandboxPool(max_workers=4) as pool:
        results = pool.map(SandboxRequest(code, stdin=case) for case in cases)   # in request order
    """

    def __init__(self, max_workers: int = 4):
        if max_workers < 1:
            raise ValueError(f"SandboxPool max_workers={max_workers} must be at least 1")
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sandbox")

    def submit(self, request: SandboxRequest) -> Future[SandboxResult]:
        return self._executor.submit(_run_request, request)

    def map(self, requests: Iterable[SandboxRequest]) -> list[SandboxResult]:
        return list(self._executor.map(_run_request, requests))

    def close(self) -> None:
        """Waits for the runs under way (each ends within its wall time) and drops the queued ones."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def isolation_status() -> dict[str, bool | str]:
    """What isolation runs get on this machine (probed once per process); `missing` says what is not and why."""
    plan = _plan()
    return {
        "network_namespace": plan.namespaces,
        "pid_namespace": plan.namespaces,
        "ipc_namespace": plan.namespaces,
        "private_filesystem": plan.namespaces,
        "uid_drop": plan.drop_uid,
        "process_limit": plan.drop_uid,  # RLIMIT_NPROC does not bind root, nor a uid the trainer shares
        "rlimits": True,
        "own_session": True,
        "missing": plan.missing,
    }


def _run_request(request: SandboxRequest) -> SandboxResult:
    return run_python(request.code, request.stdin, request.limits, request.files)


# --------------------------------------------------------------------------------------------------------------------
# Trainer side: choose the isolation, start the launcher, feed stdin, collect output, classify the outcome.
# --------------------------------------------------------------------------------------------------------------------

# The base interpreter, not the venv's: the venv lives in the checkout, which the program must not see.
_BASE_PYTHON = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
_BASE_PREFIX = os.path.realpath(sys.base_prefix)
_LAUNCHER = os.path.realpath(__file__)
_LAUNCHER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_PRIVATE_WORKDIR = "/tmp/work"  # the working directory inside the private root
_UID_BASE = 1 << 30  # per-run uids start here, far above any real account
_uid_counter = itertools.count()
_CHUNK = 64 * 1024
_POLL_S = 0.1  # how often the I/O loop checks whether the program has exited while a straggler holds its pipes
_DRAIN_S = 0.25  # after the program exits, how long to wait for output still held by processes it left behind
_STOP_GRACE_S = 1.0  # how long the launcher gets to take a run down before its process group is SIGKILLed
# With a pid namespace, unshare exits only once the kernel has killed and reaped the whole namespace (it waits for its
# init, whose exit does that). Killing unshare sooner would return while the run's processes are still dying, so it
# gets this long: a fork bomb capped by the process limit under a loaded machine takes over a second.
_NAMESPACE_STOP_GRACE_S = 30.0
# The last stderr line of a program that died of an allocation failure (Python's MemoryError and subclasses such
# as numpy's _ArrayMemoryError, C++'s bad_alloc, C's ENOMEM).
_MEMORY_ERROR = re.compile(r"MemoryError\b|bad_alloc|Cannot allocate memory|[Oo]ut of memory")


@dataclass(frozen=True)
class _Plan:
    namespaces: bool  # pid + mount + IPC (+ network) namespaces and the private root
    drop_uid: bool  # run each program under its own unprivileged uid
    missing: str = ""  # what isolation is missing and why; empty when all of it is active


_plan_lock = threading.Lock()
_chosen_plan: _Plan | None = None


def _plan() -> _Plan:
    global _chosen_plan
    with _plan_lock:
        if _chosen_plan is None:
            _chosen_plan = _choose_plan()
            if _chosen_plan.missing:
                logger.warning(
                    "sandbox: %s; programs run with rlimits and their own session%s only",
                    _chosen_plan.missing,
                    ", under a uid of their own" if _chosen_plan.drop_uid else "",
                )
        return _chosen_plan


def _choose_plan() -> _Plan:
    """The strongest isolation under which a trivial program runs here."""
    reasons = []
    root = os.geteuid() == 0
    if shutil.which("unshare", path=_LAUNCHER_ENV["PATH"]) is None:
        reasons.append("network, pid and filesystem isolation unavailable: no unshare on /usr/bin:/bin")
    else:
        failure = _probe(_Plan(namespaces=True, drop_uid=root))
        if not failure:
            return _Plan(namespaces=True, drop_uid=root, missing="" if root else "uid drop unavailable: not root")
        reasons.append(f"network, pid and filesystem isolation unavailable: {failure}")
    if root:
        failure = _probe(_Plan(namespaces=False, drop_uid=True))
        if not failure:
            return _Plan(namespaces=False, drop_uid=True, missing="; ".join(reasons))
        reasons.append(f"uid drop unavailable: {failure}")
    else:
        reasons.append("uid drop and process limit unavailable: not root")
    return _Plan(namespaces=False, drop_uid=False, missing="; ".join(reasons))


def _probe(plan: _Plan) -> str:
    """'' if a trivial program runs under `plan`, else the error it met."""
    result = _run([_BASE_PYTHON, "-E", "-s", "-B", "-c", "pass"], "", SandboxLimits(wall_time_s=20), {}, plan)
    if result.ok:
        return ""
    lines = result.stderr.strip().splitlines()
    return lines[-1].removeprefix("sandbox: ") if lines else f"probe ended with status {result.status}"


def _run(argv: list[str], stdin: str, limits: SandboxLimits, files: dict[str, str], plan: _Plan) -> SandboxResult:
    for name in files:
        path = os.path.normpath(name)
        if os.path.isabs(path) or path == ".." or path.startswith("../"):
            raise ValueError(f"sandbox file name {name!r} must be a relative path inside the working directory")
    run_dir = tempfile.mkdtemp(prefix="quiver-sandbox-")
    try:
        os.chmod(run_dir, 0o711)  # without namespaces the dropped uid must pass through to its work/ directory
        workdir = os.path.join(run_dir, "work")
        for name, text in files.items():
            path = os.path.join(workdir, os.path.normpath(name))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        os.makedirs(workdir, exist_ok=True)
        os.mkdir(os.path.join(run_dir, "root"))  # where the launcher mounts the private root (in its namespace)
        return _execute(argv, stdin, limits, run_dir, plan)
    finally:
        _remove_tree(run_dir)


def _execute(argv: list[str], stdin: str, limits: SandboxLimits, run_dir: str, plan: _Plan) -> SandboxResult:
    home = _PRIVATE_WORKDIR if plan.namespaces else os.path.join(run_dir, "work")
    cpu_s = math.ceil(limits.cpu_time_s if limits.cpu_time_s is not None else limits.wall_time_s)
    rlimits = {
        "RLIMIT_CPU": [cpu_s, cpu_s + 1],  # SIGXCPU at the soft limit, SIGKILL a second later
        "RLIMIT_AS": [limits.memory_mb << 20] * 2,
        "RLIMIT_FSIZE": [limits.file_size_mb << 20] * 2,
        "RLIMIT_CORE": [0, 0],
    }
    if plan.drop_uid:
        rlimits["RLIMIT_NPROC"] = [limits.max_processes] * 2
    report_r, report_w = os.pipe()
    spec = {
        "argv": argv,
        "env": _program_env(home),
        "run_dir": run_dir,
        "private_root": plan.namespaces,
        "python_prefix": _BASE_PREFIX,
        "tmpfs_mb": limits.tmpfs_mb,
        "uid": _next_uid() if plan.drop_uid else None,
        "rlimits": rlimits,
        "report_fd": report_w,
    }
    command = [_BASE_PYTHON, "-I", "-S", "-B", _LAUNCHER, json.dumps(spec)]
    if plan.namespaces:
        unshare = ["unshare", "--mount", "--pid", "--ipc", "--fork", "--kill-child"]
        command = unshare + ([] if limits.network else ["--net"]) + command
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(report_w,),
            start_new_session=True,
            env=_LAUNCHER_ENV,
            cwd="/",
        )
    except OSError as exc:
        os.close(report_r)
        return SandboxResult("sandbox_error", None, "", f"sandbox: could not start: {exc}", 0.0)
    finally:
        os.close(report_w)
    deadline = start + limits.wall_time_s
    report: dict = {}
    try:
        stdout, stderr, killed_for = _communicate(proc, stdin.encode(), limits.max_output_bytes, deadline)
        if killed_for is None:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # the program closed its pipes but kept running
                killed_for = "timeout"
        if killed_for is None:
            report = _read_report(report_r)
    finally:
        _stop(proc, report_r, _NAMESPACE_STOP_GRACE_S if plan.namespaces else _STOP_GRACE_S)
    err = stderr.decode("utf-8", "replace")
    if "error" in report:
        err = f"{err.rstrip()}\nsandbox: {report['error']}".lstrip()
    elif "returncode" not in report and not killed_for:
        err = f"{err.rstrip()}\nsandbox: the launcher exited with {proc.returncode} without a report".lstrip()
    return SandboxResult(
        status=_classify(report, killed_for, err, cpu_s),
        returncode=None if killed_for else report.get("returncode"),
        stdout=stdout.decode("utf-8", "replace"),
        stderr=err,
        wall_time_s=time.monotonic() - start,
        cpu_time_s=report.get("cpu_s"),
    )


def _stop(proc: subprocess.Popen, report_r: int, grace_s: float) -> None:
    """End the run, whether or not it has ended by itself. Closing the report pipe makes the launcher take the run
    down; as a pid namespace's init it just exits, upon which the kernel kills and reaps everything in the namespace
    before unshare, which waits for it, can exit. So when `proc` has exited, nothing of the run is left. Without a pid
    namespace, whatever left the process group (setsid) survives this."""
    os.close(report_r)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # also what the program left behind in its group without a namespace
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _classify(report: dict, killed_for: str | None, stderr: str, cpu_limit_s: int) -> str:
    if "error" in report:
        return "sandbox_error"
    if killed_for:
        return killed_for
    if "returncode" not in report:
        return "sandbox_error"
    code = report["returncode"]
    # SIGXCPU at the soft CPU limit, SIGKILL at the hard one (Python does not catch SIGXCPU).
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and report["cpu_s"] >= cpu_limit_s):
        return "timeout"
    if code == -signal.SIGKILL:  # not us, not the CPU limit: the OOM killer, whose first choice our programs are
        return "memory_limit"
    if code == 0:
        return "ok"
    last_line = stderr.rstrip().rpartition("\n")[2]
    return "memory_limit" if _MEMORY_ERROR.search(last_line) else "runtime_error"


def _communicate(proc: subprocess.Popen, data: bytes, cap: int, deadline: float) -> tuple[bytes, bytes, str | None]:
    """Feed `data` to stdin and collect stdout and stderr until the program is done. Returns (stdout, stderr, why):
    `why` is "timeout" or "output_limit" if the run had to be killed, else None."""
    out = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    pending = memoryview(data)
    why = None
    exited, stop_at = False, deadline
    with selectors.DefaultSelector() as selector:
        for pipe in out:
            selector.register(pipe, selectors.EVENT_READ)
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)  # never block on a program that does not read its input
            selector.register(proc.stdin, selectors.EVENT_WRITE)
        while why is None and selector.get_map():
            now = time.monotonic()
            if now >= stop_at:
                if not exited:
                    why = "timeout"
                break  # else the program has exited and a process it left behind is holding the pipes
            for key, _ in selector.select(min(stop_at - now, _POLL_S)):
                pipe = key.fileobj
                if pipe is proc.stdin:
                    try:
                        pending = pending[os.write(pipe.fileno(), pending[:_CHUNK]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # the program stopped reading
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(pipe)
                        pipe.close()
                    continue
                chunk = os.read(pipe.fileno(), _CHUNK)
                if not chunk:
                    selector.unregister(pipe)
                    continue
                buffer = out[pipe]
                buffer += chunk
                if len(buffer) > cap:
                    del buffer[cap:]
                    why = "output_limit"
                    break
            if not exited and proc.poll() is not None:
                exited, stop_at = True, min(deadline, time.monotonic() + _DRAIN_S)
    return bytes(out[proc.stdout]), bytes(out[proc.stderr]), why


def _read_report(fd: int) -> dict:
    """The launcher's report: {"returncode", "cpu_s"} or {"error"}; {} if it died before writing one."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, _CHUNK):
            data += chunk
    except BlockingIOError:
        pass
    report: dict = {}
    try:
        for line in data.decode("utf-8", "replace").splitlines():
            report.update(json.loads(line))  # an error line from the forked program stays next to the exit line
    except (ValueError, TypeError):
        return {"error": f"unreadable launcher report {data[:200]!r}"}
    return report


def _program_env(home: str) -> dict[str, str]:
    path = "/usr/bin:/bin"
    python_bin = os.path.dirname(_BASE_PYTHON)
    if python_bin not in path.split(":"):
        path = f"{python_bin}:{path}"  # so that `python3` inside means the interpreter that runs the program
    return {"PATH": path, "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home, "PYTHONDONTWRITEBYTECODE": "1"}


def _next_uid() -> int:
    """A uid no other run of this process is using at the same time (256 in flight), and, through the pid, no run of
    another trainer process either; sharing one would only make two runs share their process count."""
    return _UID_BASE + ((os.getpid() & 0x3FFFFF) << 8 | next(_uid_counter) & 0xFF)


def _remove_tree(path: str) -> None:
    def make_writable_and_retry(function, failed_path, _exc_info):
        os.chmod(os.path.dirname(failed_path), 0o700)  # the program may have taken its own permissions away
        function(failed_path)

    try:
        shutil.rmtree(path, onerror=make_writable_and_retry)
    except OSError as exc:
        logger.warning("sandbox: could not remove %s: %s", path, exc)


# --------------------------------------------------------------------------------------------------------------------
# Launcher side: this file run as a script by the base interpreter (`-I -S`: standard library only), as root in the
# new namespaces when they are available.
# --------------------------------------------------------------------------------------------------------------------

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_NO_NEW_PRIVS = 38
_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_DEVICE_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}


def _launch(spec: dict) -> None:
    report_fd = spec["report_fd"]
    os.set_inheritable(report_fd, False)  # the program must not be able to forge its own report
    try:
        uid = spec["uid"]
        workdir = _enter_private_root(spec) if spec["private_root"] else os.path.join(spec["run_dir"], "work")
        if uid is not None:
            for directory, _, names in os.walk(workdir):
                for path in [directory] + [os.path.join(directory, name) for name in names]:
                    os.lchown(path, uid, uid)
        os.chdir(workdir)
        pid = os.fork()
        if pid == 0:
            _exec_program(spec)
        threading.Thread(target=_die_with_trainer, args=(report_fd, spec["private_root"]), daemon=True).start()
        while True:  # as a pid namespace's init we also reap the orphans the program leaves
            reaped, status, usage = os.wait4(-1, 0)
            if reaped == pid:
                break
        report = {"returncode": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime}
    except Exception as exc:
        report = {"error": f"{type(exc).__name__}: {exc}"}
    os.write(report_fd, (json.dumps(report) + "\n").encode())


def _exec_program(spec: dict) -> None:
    """In the forked child: limits, then the unprivileged uid, then the program. Never returns."""
    try:
        for name, (soft, hard) in spec["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        # RLIMIT_AS is per process: should a run's processes together exhaust the machine's memory, the OOM killer
        # is to take them, not the trainer. Unprivileged processes cannot lower this again.
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        uid = spec["uid"]
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        if _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these, and exec would keep them ignored
            signal.signal(signum, signal.SIG_DFL)
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except BaseException as exc:
        os.write(spec["report_fd"], (json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n").encode())
    finally:
        os._exit(127)


def _die_with_trainer(report_fd: int, namespace_init: bool) -> None:
    """Block until the trainer closes its end of the report pipe: it does so to stop the run (timeout, output limit),
    or the kernel does because the trainer died. Then take the whole run down."""
    poller = select.poll()
    poller.register(report_fd, 0)  # POLLERR, reported on a pipe's write end once it has no reader, is always polled
    poller.poll()
    if not namespace_init:
        os.killpg(0, signal.SIGKILL)
    os._exit(1)  # as the namespace's init: the kernel kills everything else in the namespace


def _enter_private_root(spec: dict) -> str:
    """Build a root file system of read-only system directories, the Python installation, fresh /dev and /proc and
    a size-limited tmpfs /tmp, and chroot into it. Runs in our private mount namespace, so nothing here is seen by
    the host; new directories are only made inside tmpfs we mounted. Returns the working directory."""
    root = os.path.join(spec["run_dir"], "root")
    tmpfs = f"mode=1777,size={spec['tmpfs_mb']}m"
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
    for name in _SYSTEM_DIRS:
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), root + host)
        elif os.path.isdir(host):
            os.mkdir(root + host)
            _bind(host, root + host, _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    prefix = spec["python_prefix"]
    if not os.path.isdir(root + prefix):  # not already inside /usr
        os.makedirs(root + prefix)
        _bind(prefix, root + prefix, _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.mkdir(root + "/dev")
    for name in _DEVICES:
        open(f"{root}/dev/{name}", "w").close()
        _bind(f"/dev/{name}", f"{root}/dev/{name}", _MS_NOSUID | _MS_NOEXEC)
    for name, target in _DEVICE_LINKS.items():
        os.symlink(target, f"{root}/dev/{name}")
    os.mkdir(root + "/dev/shm")  # POSIX semaphores (multiprocessing) live here
    _mount("tmpfs", root + "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, tmpfs)
    os.mkdir(root + "/proc")
    _mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    os.mkdir(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, tmpfs)
    shutil.copytree(os.path.join(spec["run_dir"], "work"), root + _PRIVATE_WORKDIR)
    os.chmod(root + _PRIVATE_WORKDIR, 0o700)
    _mount(None, root, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.chroot(root)
    return _PRIVATE_WORKDIR


def _bind(source: str, target: str, flags: int) -> None:
    _mount(source, target, None, _MS_BIND)
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | flags)  # bind mounts take their flags on a remount


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def encode(text):
        return None if text is None else text.encode()

    if _libc().mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source or ''} on {target}: {os.strerror(errno)}")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


if __name__ == "__main__":
    _launch(json.loads(sys.argv[1]))
