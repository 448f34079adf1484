"""The run plan decides each derived fact once (verl/trainer/ppo/topology.py, verl/trainer/ppo/run_plan.py): the
config keys those facts come from are read by the plan's builders and the config check only. Every other module
reads the plan (`plan.<fact>`, a worker's constructor argument). This test fails when a module outside them reads one
of the keys from a config node, so a planned fact cannot be re-derived on the side."""

import ast
from pathlib import Path

import pytest

VERL = Path(__file__).resolve().parents[1] / "verl"

# The keys the plan owns: the ranks (topology), the micro-batches of every pass, padding removal, the models' dtypes,
# FSDP sizes, sequence parallelism, compilation and fused kernels, the HF engine's decode loop and sharing, LoRA's
# rank (whether LoRA runs), the old log-probs' source, the optimizer schedule's length.
PLAN_KEYS = frozenset({
    "n_gpus_per_node", "cpu_ranks_per_node",
    "ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size", "ppo_max_token_len_per_gpu", "use_dynamic_bsz",
    "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz",
    "log_prob_max_token_len_per_gpu", "forward_micro_batch_size_per_gpu", "forward_max_token_len_per_gpu",
    "micro_batch_size_per_gpu",
    "use_remove_padding", "model_dtype", "fsdp_size", "ulysses_sequence_parallel_size",
    "use_torch_compile", "use_fused_kernels", "use_liger", "enable_activation_offload",
    "static_decode", "share_cpu_engine", "lora_rank", "bypass_mode", "total_training_steps",
})

# Who may read them: the plan's types and builders, the config's sections and checks (before the plan exists), the input checks
# that run before it (preflight), LoRA's settings builder that the plan calls, the SFT trainer, a separate entry point
# with its own config and no PPO plan, and the HF engine built on its own (tests, offline generation: no plan), which
# reads its config's static_decode only when the caller passes no decision (a run's workers pass the plan's).
READERS = {
    "trainer/ppo/run_plan.py", "trainer/ppo/topology.py", "trainer/ppo/async_plan.py", "trainer/ppo/config_rules.py", "utils/run_plan.py",
    "trainer/config/schema.py", "trainer/config/sft.py", "trainer/config/algorithm.py", "trainer/fsdp_sft_trainer.py",
    "workers/config/actor.py", "workers/config/rollout.py", "workers/config/critic.py",
    "utils/preflight.py", "utils/lora.py", "workers/rollout/hf_rollout.py",
}


def config_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, 'node.key') for each read of a PLAN_KEYS key from a config node: `node.key`, `node.get("key")`,
    `option(node, "key", ...)`; reads from the plan (`plan.<fact>`, `self.plan...`, `topology.<fact>`) and a
    module's own attributes (`self.key`) are not config reads."""
    reads = []
    for node in ast.walk(tree):
        key = base = None
        if isinstance(node, ast.Attribute) and node.attr in PLAN_KEYS:
            key, base = node.attr, ast.unparse(node.value)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args[0].value in PLAN_KEYS:
                key, base = node.args[0].value, ast.unparse(node.func.value)
        if (isinstance(node, ast.Call) and ast.unparse(node.func) in ("option", "config_value") and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in PLAN_KEYS):
            key, base = node.args[1].value, ast.unparse(node.args[0])
        if key is None or base == "self" or "plan" in base or "topology" in base:
            continue
        reads.append((node.lineno, f"{base}.{key}"))
    return sorted(set(reads))


@pytest.mark.parametrize("path", sorted(p for p in VERL.rglob("*.py") if str(p.relative_to(VERL)) not in READERS),
                         ids=lambda p: str(p.relative_to(VERL)))
def test_no_module_outside_the_plan_reads_a_key_the_plan_owns(path):
    reads = config_reads(ast.parse(path.read_text()))
    assert not reads, (f"{path.relative_to(VERL)} reads {reads}: these keys are the run plan's; read the plan's fact "
                       "(verl/utils/run_plan.py) instead of the config")


def test_the_check_sees_a_re_derived_fact():
    """The scan itself: a worker that reads its padding switch from the config is caught; one that takes the plan's
    is not."""
    assert config_reads(ast.parse("x = self.config.model.use_remove_padding")) == [
        (1, "self.config.model.use_remove_padding")]
    assert config_reads(ast.parse("x = rollout.get('static_decode')")) == [(1, "rollout.static_decode")]
    assert config_reads(ast.parse("x = self.plan.actor.remove_padding or plan.actor.update or self.use_remove_padding")) == []


def test_only_the_plan_derives_lora():
    """Whether LoRA runs, and its settings, are the plan's (`lora_settings` is called by the plan's builder only)."""
    callers = [str(p.relative_to(VERL)) for p in VERL.rglob("*.py")
               if any(isinstance(n, ast.Call) and ast.unparse(n.func).endswith("lora_settings")
                      for n in ast.walk(ast.parse(p.read_text())))]
    assert set(callers) <= {"trainer/ppo/run_plan.py", "utils/lora.py", "trainer/fsdp_sft_trainer.py"}, callers
