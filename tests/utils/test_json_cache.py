"""verl/utils/json_cache.py: one JSON file shared by threads and processes; merged saves lose no entry, a reader never
sees a half-written file, and a save interval batches the writes."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time

from verl.utils.json_cache import JsonCache, key_of


def test_values_are_any_json_and_composite_keys_are_json_lists(tmp_path):
    path = tmp_path / "cache.json"
    cache = JsonCache(str(path))
    key = key_of("judge", "model", "question é", ["a", "b"], "answer")
    assert key == '["judge", "model", "question é", ["a", "b"], "answer"]'
    cache.put(key, {"reply": "Correct"})
    cache.put("plain query", "Page 1: x")
    assert JsonCache(str(path)).get(key) == {"reply": "Correct"}
    assert json.loads(path.read_text(encoding="utf-8")) == {key: {"reply": "Correct"}, "plain query": "Page 1: x"}


def test_a_save_interval_batches_the_writes_until_save(tmp_path):
    path = tmp_path / "cache.json"
    cache = JsonCache(str(path), save_interval_s=3600.0)
    cache.put("a", 1)  # the first put saves (nothing saved yet)
    cache.put("b", 2)
    cache.put("c", 3)
    assert json.loads(path.read_text()) == {"a": 1}
    cache.save()
    assert json.loads(path.read_text()) == {"a": 1, "b": 2, "c": 3}
    mtime = path.stat().st_mtime_ns
    cache.save()  # nothing new: no write
    assert path.stat().st_mtime_ns == mtime


def test_an_unreadable_cache_file_is_rewritten(tmp_path, caplog):
    path = tmp_path / "search_cache.json"
    path.write_text("{not json")
    cache = JsonCache(str(path))
    cache.put("q", "Page 1: a")
    assert json.loads(path.read_text()) == {"q": "Page 1: a"} and "unreadable" in caplog.text
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]  # no temporary file left


def test_cache_under_concurrent_threads(tmp_path):
    path = str(tmp_path / "search_cache.json")
    caches = [JsonCache(path, refresh_interval_s=0.0) for _ in range(2)]  # two tools in one process

    def write(worker):
        for q in range(20):
            caches[worker % 2].put(f"query {worker}-{q}", f"result {worker}-{q}")
            assert caches[worker % 2].get(f"query {worker}-{q}") == f"result {worker}-{q}"

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(json.loads(open(path, encoding="utf-8").read())) == 160


def _writer(path: str, worker: int, queries: int, start) -> None:
    cache = JsonCache(path, refresh_interval_s=0.0)
    start.wait()  # all writers at once (without the file lock this loses entries)
    for q in range(queries):
        cache.put(f"query {worker}-{q}", f"result {worker}-{q} " + "é" * 50)


def test_cache_under_concurrent_writers_from_several_processes_loses_no_entry(tmp_path):
    path = str(tmp_path / "shared" / "search_cache.json")
    os.makedirs(os.path.dirname(path))
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(4)
    writers = [context.Process(target=_writer, args=(path, w, 25, start)) for w in range(4)]
    for process in writers:
        process.start()
    reads = 0
    while any(process.is_alive() for process in writers):  # a reader without the lock always sees valid JSON
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                assert isinstance(json.load(f), dict)
            reads += 1
        time.sleep(0.005)
    for process in writers:
        process.join(60)
        assert process.exitcode == 0
    entries = json.loads(open(path, encoding="utf-8").read())
    assert len(entries) == 100 and reads > 0
    assert entries == {f"query {w}-{q}": f"result {w}-{q} " + "é" * 50 for w in range(4) for q in range(25)}
    assert sorted(os.listdir(os.path.dirname(path))) == ["search_cache.json", "search_cache.json.lock"]
