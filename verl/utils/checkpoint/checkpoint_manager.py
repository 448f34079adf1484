"""The driver's half of checkpointing: atomic step directories, their manifests, the `latest` marker, retention, and
choosing (and checking) the checkpoint a run resumes from.

A checkpoint is written into a hidden temporary directory and renamed to `global_step_N` only once every file is
complete, and `latest_checkpointed_iteration.txt` is replaced atomically afterwards. A run killed mid-save therefore
leaves at most a `.tmp-*` directory, which resume ignores (and the next save removes).

The last file written into a step directory, before the rename, is `manifest.json`: the step, the world size that
saved it and every other file's relative path, size in bytes and SHA-256. A checkpoint damaged afterwards (a
truncated shard, an emptied optimizer file, a deleted file) no longer matches it, and resume and the model merger
name each file that differs. A step directory without a manifest was written before Quiver kept manifests; it loads
"unverified", after a check that its files are there and not empty.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from verl.utils.config import ConfigError

LATEST_FILE = "latest_checkpointed_iteration.txt"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "quiver-checkpoint-manifest-v1"
STEP_DIR = re.compile(r"^global_step_(\d+)$")
TMP_PREFIX = ".tmp-global_step_"
# Per-rank files whose emptiness means damage in a checkpoint without a manifest.
RANK_FILE = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used as it is; the message names the files and what to do."""


def _fsync_tree(path: str) -> None:
    """Flush every file under `path` to disk, so a rename never publishes data still in the page cache."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())


def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` so that a reader sees the old file or the whole new one, never a part."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def step_dirs(root: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint under `root`, oldest first."""
    if not os.path.isdir(root):
        return []
    found = [(int(m.group(1)), os.path.join(root, name)) for name in os.listdir(root) if (m := STEP_DIR.match(name))]
    return sorted(found)


def _latest_step(root: str) -> int | None:
    """The step the `latest` file names, if it names a checkpoint that exists."""
    latest = os.path.join(root, LATEST_FILE)
    if not os.path.exists(latest):
        return None
    with open(latest) as f:
        text = f.read().strip()
    if text.isdigit() and os.path.isdir(os.path.join(root, f"global_step_{text}")):
        return int(text)
    print(f"[checkpoint] {latest} names step {text!r}, which has no complete checkpoint; scanning instead")
    return None


def find_latest_ckpt_path(root: str) -> str | None:
    """The newest complete checkpoint: the one the `latest` file names, else the highest global_step_N dir."""
    root = os.path.expanduser(root)
    step = _latest_step(root)
    if step is not None:
        return os.path.join(root, f"global_step_{step}")
    dirs = step_dirs(root)
    return dirs[-1][1] if dirs else None


# ------------------------------------------------------------------------------------------------ the manifest
def saved_world_size(step_dir: str, manifest: dict | None = None) -> int | None:
    """How many ranks saved checkpoint `step_dir`: its manifest's record, else its actor's fsdp_config.json's."""
    if manifest and manifest.get("world_size"):
        return manifest["world_size"]
    try:
        with open(os.path.join(step_dir, "actor", "fsdp_config.json")) as f:
            return json.load(f)["world_size"]
    except (OSError, ValueError, KeyError):
        return None


def sha256_of(path: str, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def _checksums(step_dir: str, relpaths: list[str]) -> dict[str, str]:
    """SHA-256 of each file, several at a time (hashlib releases the GIL, so threads hash in parallel)."""
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        digests = pool.map(sha256_of, [os.path.join(step_dir, rel) for rel in relpaths])
        return dict(zip(relpaths, digests))


def _files_under(step_dir: str) -> list[str]:
    """Relative paths of every file in `step_dir` except the manifest, sorted."""
    found = []
    for root, _dirs, files in os.walk(step_dir):
        found += [os.path.relpath(os.path.join(root, name), step_dir) for name in files]
    return sorted(rel for rel in found if rel != MANIFEST_FILE)


def write_manifest(step_dir: str, step: int) -> dict:
    """Describe every file of `step_dir` in `step_dir/manifest.json` (written atomically; call it last). The world
    size is the one the actor's fsdp_config.json records (None without one)."""
    relpaths = _files_under(step_dir)
    checksums = _checksums(step_dir, relpaths)
    manifest = {
        "format": MANIFEST_FORMAT,
        "step": step,
        "world_size": saved_world_size(step_dir),
        "files": {
            rel: {"size": os.path.getsize(os.path.join(step_dir, rel)), "sha256": checksums[rel]} for rel in relpaths
        },
    }
    write_atomic(os.path.join(step_dir, MANIFEST_FILE), json.dumps(manifest, indent=1))
    return manifest


def checkpoint_step(step_dir: str) -> int:
    """The training step a checkpoint was saved at: its manifest's, else the driver state's (data.pt)."""
    manifest = read_manifest(step_dir)
    if manifest is not None and manifest.get("step") is not None:
        return int(manifest["step"])
    import torch

    return int(torch.load(os.path.join(step_dir, "data.pt"), weights_only=False)["global_steps"])


def read_manifest(step_dir: str) -> dict | None:
    """The manifest of `step_dir`; None when it has none (a checkpoint written before manifests existed)."""
    path = os.path.join(step_dir, MANIFEST_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            manifest = json.load(f)
        if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("files"), dict):
            raise ValueError(f"not a {MANIFEST_FORMAT} manifest")
    except ValueError as e:  # json.JSONDecodeError is one
        raise CheckpointError(f"{path} is damaged ({e}); the checkpoint in {step_dir} cannot be verified") from e
    return manifest


def manifest_problems(step_dir: str, manifest: dict, under: str = "") -> list[str]:
    """One line per file of the manifest (below the subdirectory `under`, e.g. "actor") that is missing or differs
    in size or SHA-256 from what was saved; [] when every file matches."""
    prefix = f"{under.strip('/')}/" if under else ""
    problems, to_hash = [], []
    for rel, saved in sorted(manifest["files"].items()):
        if not rel.startswith(prefix):
            continue
        path = os.path.join(step_dir, rel)
        if not os.path.isfile(path):
            problems.append(f"{rel}: missing")
        elif (size := os.path.getsize(path)) != saved["size"]:
            kind = "empty" if size == 0 else "truncated" if size < saved["size"] else "longer than saved"
            problems.append(f"{rel}: {size} bytes, saved with {saved['size']} ({kind})")
        else:
            to_hash.append(rel)
    for rel, digest in _checksums(step_dir, to_hash).items():
        if digest != manifest["files"][rel]["sha256"]:
            problems.append(f"{rel}: contents changed since the save (SHA-256 differs, same size)")
    return problems


def unverified_problems(step_dir: str, under: str = "") -> list[str]:
    """The check a checkpoint without a manifest gets: no per-rank file (model/optim/extra_state) is empty."""
    problems = []
    for root, _dirs, files in os.walk(os.path.join(step_dir, under)):
        for name in sorted(files):
            path = os.path.join(root, name)
            if RANK_FILE.match(name) and os.path.getsize(path) == 0:
                problems.append(f"{os.path.relpath(path, step_dir)}: empty")
    return problems


def checkpoint_problems(step_dir: str, under: str = "", required: tuple[str, ...] = ()) -> tuple[list[str], bool]:
    """(what is wrong with checkpoint `step_dir`, file by file; whether it has a manifest to verify against).

    `under`: check only that subdirectory (the merger checks `actor` or `critic`). `required`: relative paths that
    must exist whatever the manifest says (the roles this run loads).
    """
    problems = [f"{rel}: missing" for rel in required if not os.path.exists(os.path.join(step_dir, rel))]
    try:
        manifest = read_manifest(step_dir)
    except CheckpointError as e:
        return problems + [f"{MANIFEST_FILE}: {e.__cause__}, so no file can be verified"], True
    if manifest is None:
        return problems + unverified_problems(step_dir, under), False
    return problems + [p for p in manifest_problems(step_dir, manifest, under) if p not in problems], True


def damage_report(step_dir: str, problems: list[str]) -> str:
    return f"{step_dir}: " + "; ".join(problems)


# ------------------------------------------------------------------------------------------------ saving
@contextmanager
def atomic_step_dir(root: str, step: int):
    """Yield a temporary directory to fill; on success its manifest is written, and it becomes
    `root/global_step_{step}` and the latest marker."""
    root = os.path.expanduser(root)
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):  # leftovers of saves that were killed
        if name.startswith(TMP_PREFIX):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    tmp = os.path.join(root, f"{TMP_PREFIX}{step}-{os.getpid()}")
    os.makedirs(tmp)
    try:
        yield tmp
        write_manifest(tmp, step)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_tree(tmp)
    final = os.path.join(root, f"global_step_{step}")
    if os.path.exists(final):  # saving the same step again (e.g. after a resume): replace it
        old = f"{final}.old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    write_atomic(os.path.join(root, LATEST_FILE), str(step))


def remove_old_checkpoints(root: str, keep: int | None, current_step: int | None = None) -> list[str]:
    """Delete all but the newest `keep` checkpoints (None or <= 0 keeps everything); returns what was removed.

    With `current_step`, only checkpoints up to it count: newer ones are left by a run this one resumed before (it
    fell back past a damaged checkpoint) and stay until this run saves their step again, which replaces them.
    """
    if not keep or keep <= 0:
        return []
    dirs = [
        (step, path)
        for step, path in step_dirs(os.path.expanduser(root))
        if current_step is None or step <= current_step
    ]
    removed = [path for _step, path in dirs[:-keep]]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


# ------------------------------------------------------------------------------------------------ resuming
def _usable(step_dir: str, roles: list[str]) -> list[str]:
    """What keeps `step_dir` from being resumed from ([] = nothing), noting an unverified one."""
    problems, verified = checkpoint_problems(step_dir, required=("data.pt", *(f"{r}/fsdp_config.json" for r in roles)))
    if not problems and not verified:
        print(
            f"[checkpoint] note: {step_dir} has no {MANIFEST_FILE} (saved before Quiver wrote manifests): its files "
            "are present and not empty, but their contents are not verified"
        )
    return problems


def select_resume_checkpoint(root: str, resume_mode: str, resume_from_path: str | None, roles: list[str]) -> str | None:
    """The step directory a run resumes from (None: from scratch), checked file by file against its manifest.

    - `disable`: None.
    - `resume_path`: `resume_from_path`; a damaged one is a CheckpointError naming its files.
    - `auto`: the newest checkpoint of `root` that is intact (the one the latest marker names, else the highest
      step, then older ones). Falling back past damaged ones prints one warning naming their files; when every
      checkpoint is damaged, a CheckpointError.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        path = os.path.abspath(os.path.expanduser(resume_from_path))
        problems = _usable(path, roles)
        if problems:
            raise CheckpointError(
                f"trainer.resume_from_path={resume_from_path} cannot be resumed from: "
                f"{damage_report(path, problems)}. Point trainer.resume_from_path at an intact global_step_N "
                "directory (with trainer.resume_mode=auto the newest intact checkpoint of trainer.default_local_dir "
                "is found for you)"
            )
        return path

    root = os.path.abspath(os.path.expanduser(root))
    newest = _latest_step(root)
    candidates = [path for step, path in reversed(step_dirs(root)) if newest is None or step <= newest]
    if not candidates:
        print(f"[checkpoint] no checkpoint in {root}: training from scratch")
        return None
    damaged = []
    for path in candidates:
        problems = _usable(path, roles)
        if not problems:
            break
        damaged.append(damage_report(path, problems))
    else:
        raise CheckpointError(
            f"every checkpoint in trainer.default_local_dir={root} is damaged: {' | '.join(damaged)}. Restore the "
            "files, point trainer.resume_mode=resume_path trainer.resume_from_path at a copy, or start over with "
            "trainer.resume_mode=disable trainer.overwrite=true"
        )
    if damaged:
        print(
            f"[checkpoint] WARNING: {len(damaged)} newer checkpoint(s) damaged, resuming from {path} instead: "
            f"{' | '.join(damaged)}. The damaged directories are left as they are; this run replaces each when it "
            "saves that step again",
            file=sys.stderr,
        )
    return path
