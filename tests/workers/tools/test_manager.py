"""ToolManager: configuration forms and errors, concurrency, per-call timeouts, retries, failures as text, metrics."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from omegaconf import OmegaConf

from verl.workers.tools import BaseTool, ToolError, ToolManager
from verl.workers.tools.python_tool import PythonTool
from verl.workers.tools.search_tool import BingSearchTool, SearchTool

PREFIX = "actor_rollout_ref.rollout.tools"
PYTHON = "verl.workers.tools.python_tool.PythonTool"
HYDRA_DEFAULTS = {"config_path": None, "call_limit": None, "max_workers": None, "timeout": None, "retry_count": None,
                  "verbose_logging": None, "fail_on_error": None, "tool_instances": {}}


class Sleepy(BaseTool):
    """Sleeps `content` seconds (a float), then answers."""

    name = trigger_tag = "sleepy"

    def execute(self, content):
        time.sleep(float(content))
        return f"slept {content}"


class Scripted(BaseTool):
    """Fails transiently `transient` times, then follows `content`: "ok", "hard" (ToolError), "crash" (KeyError),
    "empty" ("" returned), "blank" (whitespace returned)."""

    name = trigger_tag = "scripted"

    def __init__(self, transient: int = 0):
        self.transient, self.calls, self.closed = transient, 0, False
        self.lock = threading.Lock()

    def execute(self, content):
        with self.lock:
            self.calls += 1
            calls = self.calls
        if calls <= self.transient:
            raise ToolError("network down", retryable=True)
        if content == "hard":
            raise ToolError("bad input")
        if content == "crash":
            raise KeyError("oops")
        return {"empty": "", "blank": " \n"}.get(content, f"done {content}")

    def close(self):
        self.closed = True


class Meeting(BaseTool):
    """Each call waits until `parties` calls are inside execute at once: only a concurrent run completes them."""

    name = trigger_tag = "meet"

    def __init__(self, parties: int):
        self.barrier = threading.Barrier(parties)

    def execute(self, content):
        self.barrier.wait(timeout=10)
        return f"met {content}"


class Hang(BaseTool):
    """Blocks until `release` is set (a tool that never returns on its own)."""

    name = trigger_tag = "hang"

    def __init__(self):
        self.release = threading.Event()

    def execute(self, content):
        self.release.wait(30)
        return "released"


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"text": "Ostmar is the capital of Veltria."}\n')
    return str(path)


# ---------------------------------------------------------------------------------------------- configuration
def test_inline_config_and_defaults(corpus):
    config = OmegaConf.create({**HYDRA_DEFAULTS, "call_limit": 3, "tool_instances": {
        "python": {"class_path": PYTHON, "params": {"timeout_s": 2, "max_output_chars": 50}},
        "search": {"class_path": "verl.workers.tools.search_tool.SearchTool", "params": {"corpus_path": corpus}}}})
    with ToolManager.from_config(config) as tools:
        assert tools.call_limit == 3 and tools.stop_strings == ["</python>", "</search>"]
        assert isinstance(tools.tools["python"], PythonTool) and tools.tools["python"].limits.wall_time_s == 2
        assert (tools.max_workers, tools.timeout, tools.retry_count, tools.verbose_logging) == (64, 120.0, 3, False)
    # Stop strings follow the configuration's order.
    reordered = {"tool_instances": {"search": {"class_path": "verl.workers.tools.search_tool.SearchTool",
                                               "params": {"corpus_path": corpus}}, "python": {"class_path": PYTHON}}}
    with ToolManager.from_config(reordered) as tools:
        assert tools.stop_strings == ["</search>", "</python>"] and tools.call_limit == 5


@pytest.mark.parametrize("config", [None, {}, {"call_limit": 3}, {"tool_instances": {}}, HYDRA_DEFAULTS])
def test_no_tools_means_no_manager(config):
    assert ToolManager.from_config(config) is None


def test_yaml_file_and_config_path_with_inline_overrides(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(f"call_limit: 6\nretry_count: 4\ntool_instances:\n  python:\n    class_path: {PYTHON}\n"
                    "    params: {timeout_s: 7, memory_mb: 300}\n")
    with ToolManager.from_config(str(path)) as tools:
        assert (tools.call_limit, tools.retry_count) == (6, 4) and tools.tools["python"].limits.wall_time_s == 7
    # Inline keys win, inline nulls (the trainer YAML's defaults) do not hide the file's, params merge key by key.
    inline = {**HYDRA_DEFAULTS, "config_path": str(path), "call_limit": 2,
              "tool_instances": {"python": {"params": {"timeout_s": 3}}}}
    with ToolManager.from_config(OmegaConf.create(inline)) as tools:
        assert (tools.call_limit, tools.retry_count) == (2, 4)
        assert tools.tools["python"].limits.wall_time_s == 3 and tools.tools["python"].limits.memory_mb == 300


def test_reference_class_paths_load_our_classes(tmp_path):
    path = tmp_path / "arpo_tools.yaml"  # the shape of the reference's tool YAML
    path.write_text(
        "call_limit: 3\nmax_workers: 64\ntimeout: 120\nretry_count: 3\nverbose_logging: true\nfail_on_error: false\n"
        "tool_instances:\n"
        "  python:\n    class_path: verl.workers.rollout.tools.python_tool.PythonTool\n"
        "    params: {conda_path: /opt/conda, conda_env: verl}\n"
        "  search:\n    class_path: verl.workers.rollout.tools.search_tool.BingSearchTool\n"
        f"    params: {{api_key: k, zone: z, max_results: 10, result_length: 1000, location: cn,\n"
        f"             cache_file: {tmp_path}/search_cache.json, async_cache_write: true}}\n")
    with ToolManager.from_config(str(path)) as tools:
        assert isinstance(tools.tools["python"], PythonTool) and tools.verbose_logging
        search = tools.tools["search"]
        assert isinstance(search, BingSearchTool) and isinstance(search, SearchTool)
        assert (search.max_results, search.backend.location, search.backend.zone) == (10, "cn", "z")


def test_a_tool_that_fails_to_load_raises_or_is_skipped(corpus, caplog):
    broken = {"calc": {"class_path": "no.such.Calculator"}, "python": {"class_path": PYTHON}}
    named = rf"{PREFIX}.tool_instances.calc.class_path=no.such.Calculator: .*No module named"
    with pytest.raises(ValueError, match=named):  # fail_on_error: true by default
        ToolManager.from_config({"tool_instances": broken})
    with caplog.at_level(logging.WARNING):
        with ToolManager.from_config({"fail_on_error": False, "tool_instances": broken}) as tools:
            assert list(tools.tools) == ["python"]
    assert f"{PREFIX}.tool_instances.calc.class_path=no.such.Calculator" in caplog.text
    bad_params = {"search": {"class_path": "verl.workers.tools.search_tool.SearchTool",
                             "params": {"corpus_path": corpus, "max_result": 3}}}
    with pytest.raises(ValueError, match=r"tool_instances.search.class_path=.*SearchTool: .*max_result"):
        ToolManager.from_config({"tool_instances": bad_params})
    assert ToolManager.from_config({"fail_on_error": False, "tool_instances": bad_params}) is None  # skipped
    not_a_tool = {"x": {"class_path": "collections.OrderedDict"}}
    with pytest.raises(ValueError, match="not a BaseTool subclass"):
        ToolManager.from_config({"tool_instances": not_a_tool})


def agent_rollout(tools: dict, mode: str = "sync_with_tool"):
    """A rollout node as the composed config holds it."""
    return OmegaConf.create({"mode": mode, "tools": {**HYDRA_DEFAULTS, **tools}})


def test_check_tools_stops_a_run_before_ray_or_warns_on_the_driver(corpus, capsys):
    """main_ppo's pre-Ray check: the class is imported and its params bound, nothing is built."""
    from verl.utils.config import ConfigError
    from verl.workers.tools.manager import check_tools

    tools = {"python": {"class_path": PYTHON},
             "calc": {"class_path": "verl.workers.tools.python_tool.PythonTol"},
             "search": {"class_path": "verl.workers.tools.search_tool.SearchTool",
                        "params": {"corpus_path": corpus, "max_result": 3}}}
    with pytest.raises(ConfigError) as error:
        check_tools(agent_rollout({"tool_instances": tools}))
    lines = str(error.value).splitlines()
    assert lines[0] == (f"{PREFIX}.tool_instances.calc.class_path=verl.workers.tools.python_tool.PythonTol: the tool "
                        "could not be loaded: ImportError: module verl.workers.tools.python_tool has no PythonTol")
    assert lines[1].startswith(f"{PREFIX}.tool_instances.search.class_path=verl.workers.tools.search_tool.SearchTool:"
                               " the tool could not be loaded: TypeError: got an unexpected keyword argument")
    assert f"or set {PREFIX}.fail_on_error=false" in lines[2]

    check_tools(agent_rollout({"tool_instances": tools, "fail_on_error": False}))
    warnings = capsys.readouterr().out.splitlines()
    assert len(warnings) == 2 and all(line.startswith("[tools] WARNING ") for line in warnings)
    assert "PythonTol" in warnings[0] and warnings[0].endswith("the run goes on without this tool")
    check_tools(agent_rollout({"tool_instances": tools}, mode="sync"))  # no agent loop: the tools are not used
    check_tools(agent_rollout({"tool_instances": {"python": {"class_path": PYTHON}}}))


@pytest.mark.parametrize(("config", "message"), [
    ({"call_limit": 0}, rf"{PREFIX}.call_limit=0 must be a positive integer"),
    ({"max_workers": -2}, rf"{PREFIX}.max_workers=-2 must be a positive integer"),
    ({"retry_count": 1.5}, rf"{PREFIX}.retry_count=1.5 must be a positive integer"),
    ({"call_limit": True}, rf"{PREFIX}.call_limit=True must be a positive integer"),
    ({"timeout": 0}, rf"{PREFIX}.timeout=0 must be a positive number"),
    ({"fail_on_error": "yes"}, rf"{PREFIX}.fail_on_error='yes' must be true or false"),
    ({"call_limt": 3}, rf"{PREFIX}.call_limt is not a tool setting"),
    ({"tool_instances": {"python": {"params": {}}}}, rf"{PREFIX}.tool_instances.python.class_path is not set"),
    ({"tool_instances": {"python": {"class_path": PYTHON, "param": {}}}},
     rf"{PREFIX}.tool_instances.python.param is not a tool key"),
    ({"tool_instances": {"python": {"class_path": PYTHON, "params": [1]}}},
     rf"{PREFIX}.tool_instances.python.params must be a mapping"),
    ({"tool_instances": ["python"]}, rf"{PREFIX}.tool_instances must map tool names"),
])
def test_bad_settings_name_the_key(config, message):
    with pytest.raises(ValueError, match=message):
        ToolManager.from_config(config)


def test_bad_config_files_are_named(tmp_path):
    with pytest.raises(ValueError, match=rf"{PREFIX}.config_path=.*missing.yaml: cannot read it"):
        ToolManager.from_config(str(tmp_path / "missing.yaml"))
    listing = tmp_path / "list.yaml"
    listing.write_text("- python\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        ToolManager.from_config({"config_path": str(listing)})
    with pytest.raises(ValueError, match="must be a mapping of tool settings or a YAML path"):
        ToolManager.from_config(3)


# ---------------------------------------------------------------------------------------------- running calls
def test_calls_run_concurrently_and_come_back_in_order():
    with ToolManager([Meeting(6)], max_workers=8) as tools:
        results = tools.run([("meet", str(i)) for i in range(6)])
    assert [r.text for r in results] == [f"met {i}" for i in range(6)] and all(r.success for r in results)

    with ToolManager([Sleepy()], max_workers=4) as tools:
        start = time.monotonic()
        results = tools.run([("sleepy", "0.4")] * 4)
        assert time.monotonic() - start < 1.2 and all(r.success for r in results)  # serially it would take 1.6 s


def test_a_call_past_the_timeout_becomes_text_and_the_round_returns():
    with ToolManager([Sleepy()], timeout=0.3) as tools:
        start = time.monotonic()
        slow, fast = tools.run([("sleepy", "3"), ("sleepy", "0")])
        assert time.monotonic() - start < 1.5
        assert slow.text == "Error: Tool(sleepy) timed out after 0.3 s." and not slow.success
        assert (slow.seconds, slow.attempts) == (0.3, 1)
        assert fast.text == "slept 0" and fast.success
        assert tools.metrics()["tools/timeouts"] == 1
        assert tools.run([("sleepy", "0")])[0].success  # the manager still works


def test_the_timeout_counts_from_when_a_worker_takes_the_call():
    """With one worker the second call waits for the first; it still gets its whole timeout."""
    with ToolManager([Sleepy()], max_workers=1, timeout=0.7) as tools:
        results = tools.run([("sleepy", "0.4"), ("sleepy", "0.4")])
    assert all(r.success for r in results)


def test_calls_that_never_return_do_not_block_later_rounds():
    hang = Hang()
    with ToolManager([hang, Sleepy()], max_workers=1, timeout=0.2) as tools:
        first = tools.run([("hang", "")])[0]
        assert "timed out" in first.text
        start = time.monotonic()
        second = tools.run([("sleepy", "0")])[0]  # the only worker is still held by the hung call
        assert second.text == "slept 0" and time.monotonic() - start < 3
    hang.release.set()


def test_only_transient_failures_are_retried():
    def run(tool, content="x", retry_count=3):
        with ToolManager([tool], retry_count=retry_count) as tools:
            return tools.run([("scripted", content)])[0]

    tool = Scripted(transient=2)
    result = run(tool)
    assert (result.text, result.success, result.attempts, tool.calls) == ("done x", True, 3, 3)

    tool = Scripted(transient=5)
    result = run(tool)
    assert result.text == "Error: Tool(scripted) execution failed with message: network down"
    assert (result.success, result.attempts, tool.calls) == (False, 3, 3)

    for content, text in [("hard", "Error: Tool(scripted) execution failed with message: bad input"),
                          ("crash", "Error: Tool(scripted) execution failed with message: KeyError: 'oops'"),
                          ("empty", "Tool(scripted) returned empty output."),
                          ("blank", "Tool(scripted) returned empty output.")]:
        tool = Scripted()
        result = run(tool, content)
        assert (result.text, result.success, result.attempts, tool.calls) == (text, False, 1, 1)


def test_no_retry_after_the_timeout():
    class SlowFlaky(BaseTool):
        name = trigger_tag = "slow"
        calls = 0

        def execute(self, content):
            SlowFlaky.calls += 1
            time.sleep(0.2)
            raise ToolError("network down", retryable=True)

    with ToolManager([SlowFlaky()], timeout=0.3, retry_count=100) as tools:
        assert "timed out" in tools.run([("slow", "")])[0].text
        time.sleep(0.3)
    assert SlowFlaky.calls == 2


def test_unknown_tags_become_text():
    with ToolManager([Scripted()]) as tools:
        (result,) = tools.run([("calculator", "1+1")])
    assert (result.text, result.success, result.attempts) == ("Error: unknown tool calculator", False, 0)


def test_metrics_on_a_scripted_sequence():
    with ToolManager([Scripted(transient=1), Sleepy()], retry_count=2, timeout=0.5) as tools:
        assert tools.metrics()["tools/total_calls"] == 0.0
        tools.run([("scripted", "x"), ("scripted", "crash"), ("sleepy", "0.1"), ("sleepy", "2"), ("nope", "")])
        metrics = tools.metrics(reset=False)
        assert metrics == tools.metrics()  # reset=False kept them
        assert tools.metrics() == {"tools/total_calls": 0.0, "tools/successful_calls": 0.0, "tools/failed_calls": 0.0,
                                   "tools/timeouts": 0.0, "tools/retries": 0.0, "tools/mean_seconds": 0.0}
    assert (metrics["tools/total_calls"], metrics["tools/successful_calls"], metrics["tools/failed_calls"]) == (5, 2, 3)
    assert (metrics["tools/timeouts"], metrics["tools/retries"]) == (1, 1)
    assert (metrics["tools/scripted/calls"], metrics["tools/scripted/success_rate"]) == (2, 0.5)
    assert (metrics["tools/sleepy/calls"], metrics["tools/sleepy/success_rate"]) == (2, 0.5)
    assert (metrics["tools/nope/calls"], metrics["tools/nope/success_rate"]) == (1, 0.0)
    assert metrics["tools/sleepy/mean_seconds"] == pytest.approx((0.1 + 0.5) / 2, abs=0.1)
    assert metrics["tools/mean_seconds"] == pytest.approx(0.6 / 5, abs=0.05)
    assert all(isinstance(value, float) for value in metrics.values())


def test_rounds_from_several_threads_at_once():
    tool = Scripted()
    with ToolManager([tool], max_workers=4) as tools:
        outputs: dict[int, list[str]] = {}

        def one_round(k):
            outputs[k] = [r.text for r in tools.run([("scripted", f"{k}-{i}") for i in range(5)])]

        threads = [threading.Thread(target=one_round, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert outputs == {k: [f"done {k}-{i}" for i in range(5)] for k in range(4)}
        assert tools.metrics()["tools/total_calls"] == 20 and tool.calls == 20


def test_close_closes_the_tools():
    tool = Scripted()
    tools = ToolManager([tool])
    tools.close()
    assert tool.closed
    with pytest.raises(RuntimeError, match="after close"):
        tools.run([("scripted", "x")])


def test_two_tools_with_one_tag_are_an_error():
    with pytest.raises(ValueError, match="share a trigger tag"):
        ToolManager([Scripted(), Scripted()])


@pytest.mark.parametrize("package", ["rollout", "agent"])
def test_the_seeds_class_paths_load_our_tools(package):
    from verl.workers.tools.manager import import_tool_class

    assert import_tool_class(f"verl.workers.{package}.tools.python_tool.PythonTool") is PythonTool
    assert import_tool_class(f"verl.workers.{package}.tools.search_tool.BingSearchTool") is BingSearchTool


def test_a_tool_file_wins_over_inline_keys_nobody_set(tmp_path):
    from verl.workers.tools.manager import load_tool_config

    path = tmp_path / "tools.yaml"
    path.write_text("call_limit: 3\nretry_count: 4\ntool_instances:\n  python:\n    class_path: a.B\n")
    # What the composed config holds when only config_path was given: the shipped defaults (call_limit 5, ...).
    inline = {"config_path": str(path), "call_limit": 5, "max_workers": 64, "timeout": 120, "retry_count": 3,
              "verbose_logging": False, "fail_on_error": True, "tool_instances": {}}
    settings = load_tool_config(inline)
    assert (settings["call_limit"], settings["retry_count"]) == (3, 4) and list(settings["tool_instances"]) == ["python"]
    assert load_tool_config({**inline, "call_limit": 7})["call_limit"] == 7  # an inline value someone set wins
