"""verl/utils/model_server.py without starting vLLM: the server's command line, the served reward model's settings
and names, and which runs serve one. (A real server starts in tests/e2e/test_served_model_e2e.py.)"""

import contextlib

from verl.trainer.config import load_config
from verl.utils.model_server import Server, serve_reward_model, served_reward_engine, server_command

GENRM = ["reward_model.enable=true", "reward_model.model.path=/models/judge", "reward_model.rollout.name=vllm"]


def test_the_command_line_names_every_setting():
    command = server_command("/m", ["genrm", "/m"], 8001, dtype="float32", max_model_len=4096,
                             gpu_memory_utilization=0.4, tensor_parallel_size=2, enforce_eager=True, seed=3)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    text = " ".join(command)
    for part in ("--model /m", "--served-model-name genrm /m", "--host 127.0.0.1", "--port 8001", "--dtype float32",
                 "--max-model-len 4096", "--gpu-memory-utilization 0.4", "--tensor-parallel-size 2", "--seed 3",
                 "--enforce-eager"):
        assert part in text, part
    assert "--gpu-memory-utilization" not in server_command("/m", "x", 1, gpu_memory_utilization=None)
    assert Server("http://127.0.0.1:8001/v1", "genrm", "log").address == "127.0.0.1:8001"


def test_which_runs_serve_a_reward_model():
    assert served_reward_engine(load_config(overrides=GENRM).reward_model) == "vllm"
    assert served_reward_engine(load_config(overrides=GENRM[:2]).reward_model) is None  # a classifier RM
    assert served_reward_engine(load_config(overrides=GENRM[1:]).reward_model) is None  # reward_model.enable=false
    # verl 0.9's spelling of the section (reward.reward_model.rollout.*) sets the same keys.
    config = load_config(overrides=GENRM[:2] + ["reward.reward_model.rollout.name=sglang",
                                                "reward.reward_model.rollout.gpu_memory_utilization=0.3"])
    assert served_reward_engine(config.reward_model) == "vllm"
    assert config.reward_model.rollout.gpu_memory_utilization == 0.3


def test_the_served_reward_model_takes_its_settings_from_reward_model_rollout(monkeypatch, capsys):
    seen = {}

    @contextlib.contextmanager
    def fake_serve(model_dir, log_path, name, **args):
        seen.update(model_dir=model_dir, name=name, **args)
        yield Server("http://127.0.0.1:9/v1", name[0], log_path)

    monkeypatch.setattr("verl.utils.model_server.serve_model", fake_serve)
    config = load_config(overrides=GENRM + ["reward_model.rollout.name=sglang", "reward_model.rollout.prompt_length=100",
                                            "reward_model.rollout.response_length=28"])
    for device, utilization in (("cpu", None), ("cuda", 0.5)):
        with serve_reward_model(config, device) as server:
            assert server.address == "127.0.0.1:9"
        assert seen == {"model_dir": "/models/judge", "name": ["genrm", "/models/judge"], "dtype": "auto",
                        "max_model_len": 128, "tensor_parallel_size": 1, "enforce_eager": True,
                        "gpu_memory_utilization": utilization}
    out = capsys.readouterr().out
    assert "reward_model.rollout.name=sglang: served by vLLM" in out
    assert "the reward function gets reward_router_address=127.0.0.1:9" in out
