"""verl/utils/rollout_trace.py: decorated calls run as they are, trace blocks run as they are, and asking for a
tracing backend says once that none is built."""

import asyncio
import inspect

import pytest

from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op


@pytest.fixture(autouse=True)
def fresh_config():
    RolloutTraceConfig.reset()
    yield
    RolloutTraceConfig.reset()


class Tool:
    def __init__(self):
        self.calls = []

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> tuple[str, float, dict]:
        self.calls.append((instance_id, parameters, kwargs))
        return f"ran {parameters['x']}", 0.5, {"n": 1}

    @rollout_trace_op
    def parse(self, text: str, *, strict: bool = False) -> list[str]:
        if strict and not text:
            raise ValueError("empty")
        return text.split()


@rollout_trace_op
def free_function(a, b=2):
    return a * b


def test_the_decorator_leaves_sync_and_async_functions_and_methods_as_they_are():
    tool = Tool()
    assert inspect.iscoroutinefunction(Tool.execute)
    assert asyncio.run(tool.execute("id-1", {"x": 3}, step=4)) == ("ran 3", 0.5, {"n": 1})
    assert tool.calls == [("id-1", {"x": 3}, {"step": 4})]
    assert tool.parse("a b") == ["a", "b"]
    with pytest.raises(ValueError, match="empty"):
        tool.parse("", strict=True)
    assert free_function(3) == 6 and free_function.__name__ == "free_function"
    assert list(inspect.signature(Tool.execute).parameters) == ["self", "instance_id", "parameters", "kwargs"]


def test_trace_blocks_run_with_and_async_with():
    with rollout_trace_attr(sample_index=0, step=1, rollout_n=2, validate=False, name="agent_loop") as value:
        assert value is None

    async def agent_loop():
        async with rollout_trace_attr(step=1, trace=False):
            await asyncio.sleep(0)
        with rollout_trace_attr(step=2):
            return "done"

    assert asyncio.run(agent_loop()) == "done"
    with pytest.raises(KeyError), rollout_trace_attr(step=3):
        raise KeyError("the block's exception passes through")


def test_asking_for_a_backend_says_once_that_none_is_built(capsys):
    RolloutTraceConfig.init("proj", "exp", "weave", token2text=True, max_samples_per_step_per_worker=4)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "backend='weave' is not built in Quiver" in out and "run untraced" in out
    RolloutTraceConfig.init("other", "other", "mlflow")  # the first call wins, as in verl: no second line
    assert capsys.readouterr().out == ""
    config = RolloutTraceConfig.get_instance()
    assert (config.project_name, config.experiment_name, config.max_samples_per_step_per_worker) == ("proj", "exp", 4)
    assert RolloutTraceConfig.enable_token2text() is True
    assert RolloutTraceConfig.get_backend() is None and RolloutTraceConfig.get_client() is None


def test_no_backend_says_nothing(capsys):
    RolloutTraceConfig.init(None, None, None)
    assert capsys.readouterr().out == "" and RolloutTraceConfig.get_backend() is None


def test_verls_trace_backend_key_is_accepted_and_announced(capsys):
    from verl.trainer.config import load_config
    from verl.trainer.ppo.config_rules import announce_inert_keys

    cfg = load_config(overrides=["actor_rollout_ref.rollout.trace.backend=weave"])
    assert "actor_rollout_ref.rollout.trace.backend" in announce_inert_keys(cfg, "hf")
    assert "actor_rollout_ref.rollout.trace.backend=\"weave\" is accepted for verl scripts but does nothing" in (
        capsys.readouterr().out)
