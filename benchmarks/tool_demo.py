"""Tools matter: large-number arithmetic that a tiny model can only do by calling the python tool; GRPO vs ARPO.

    .venv/bin/python benchmarks/tool_demo.py                    # about 40 min on 2 cores
    .venv/bin/python benchmarks/tool_demo.py --rl-steps 5       # a quick look

One tiny model (hidden 192, 4 layers) gets a cold-start SFT on the tool-arithmetic demonstrations of
`verl/demo/tool_tasks.py` ("What is 482 * 37?": 30% answer at once, 70% call
`<python>print(482 * 37)</python>` and copy the result into the answer). Then, from that SFT
model, with the same prompts, samples per prompt (n), steps and learning rate:

- GRPO: the tool loop without branching (n independent trajectories per prompt);
- ARPO: the tool loop with entropy-based branching (n/2 initial trajectories, beam 2, the rest branches or refills).

`--format hermes` runs the same task the way verl 0.9 users write it: the calculator tool of
`configs/tools/calculator_tool.yaml` (`multi_turn.tool_config_path`), called as a hermes
`<tool_call>{"name": "calculator", ...}</tool_call>` with its result as a chat-template tool turn, and GRPO through
verl's agent loops (`rollout.mode=async`, `agent.default_agent_loop=tool_agent`); the SFT demonstrations are the
same ones rewritten into that format (`verl.demo.tool_tasks.hermes_calculator_response`).

Reported, each measured in this run: held-out greedy accuracy with the python tool (and, for the SFT model, without
it: the baseline that shows the task needs the tool), tool calls per response, and the RL wall time.
Results go to `<out>/results.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import pandas as pd
from compare_losses import REPO, merge_final, run

ROLLOUT, ACTOR = "actor_rollout_ref.rollout", "actor_rollout_ref.actor"
TOOLS = ["tools.tool_instances.python.class_path=verl.workers.tools.python_tool.PythonTool",
         "tools.tool_instances.python.params.timeout_s=5", "tools.call_limit=2"]
METHODS = {
    "grpo": [f"{ROLLOUT}.beam_size=1"],
    "arpo": [f"{ROLLOUT}.beam_size=2", f"{ROLLOUT}.initial_rollouts=HALF", f"{ROLLOUT}.branch_probability=0.5",
             f"{ROLLOUT}.entropy_weight=0.2"],
}
PROMPT_LENGTH = 160
# Response tokens: a hermes call (JSON) and its tool turn take about 60 more than a <python> call and its result.
RESPONSE_LENGTH = {"tags": 128, "hermes": 192}
CALCULATOR = os.path.join(REPO, "configs", "tools", "calculator_tool.yaml")
# Per --format: the RL rollout's overrides (under actor_rollout_ref.rollout / rollout), the methods compared.
FORMATS = {
    "tags": {"rollout": ["mode=sync_with_tool", *(f"+{t}" for t in TOOLS)], "methods": METHODS},
    "hermes": {"rollout": ["mode=async", "agent.default_agent_loop=tool_agent",
                           f"multi_turn.tool_config_path={CALCULATOR}"],
               "methods": {"grpo_async": [f"{ROLLOUT}.beam_size=1"]}},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="default outputs/tool_demo (outputs/tool_demo_hermes)")
    parser.add_argument("--format", choices=sorted(FORMATS), default="tags",
                        help="tags: the seeds' <python> tool loop, GRPO vs ARPO; hermes: verl's agent loop with the "
                             "calculator tool in hermes format")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft-steps", type=int, default=1200)
    parser.add_argument("--rl-steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--test-size", type=int, default=128)
    parser.add_argument("--eval-samples", type=int, default=4, help="samples per held-out prompt of the sampled eval")
    parser.add_argument("--digits", type=int, nargs=2, default=[3, 2], help="digits of the two factors")
    parser.add_argument("--hidden-size", type=int, default=192, help="of the demo model (128 does not learn to copy "
                        "the numbers into the tool call and back)")
    parser.add_argument("--layers", type=int, default=4, help="of the demo model")
    parser.add_argument("--sft-tool-fraction", type=float, default=0.7,
                        help="share of SFT demonstrations that call the tool")
    return parser.parse_args(argv)


def prepare(args: argparse.Namespace) -> tuple[str, str]:
    """Tiny model, tool-arithmetic data and the SFT cold start: (sft model dir, data dir)."""
    root = args.out
    model, data, sft = (os.path.join(root, name) for name in ("model", "data", "sft"))
    sft_model = os.path.join(sft, f"global_step_{args.sft_steps}")
    if os.path.isdir(sft_model):
        return sft_model, data
    os.makedirs(os.path.join(root, "logs"), exist_ok=True)
    run([sys.executable, "tools/make_tiny_model.py", "--output_dir", model, "--seed", str(args.seed), "--hidden_size",
         str(args.hidden_size), "--num_layers", str(args.layers), "--num_heads", "4", "--num_kv_heads", "4",
         "--intermediate_size", str(4 * args.hidden_size)],
        os.path.join(root, "logs", "model.log"))
    everything = os.path.join(root, "all_tasks")
    run([sys.executable, "data/make_tool_tasks.py", "--out_dir", everything, "--arithmetic_train", "8192",
         "--arithmetic_test", str(args.test_size), "--n_countries", "2", "--seed", str(args.seed),
         "--operand_digits", *map(str, args.digits), "--sft_tool_fraction", str(args.sft_tool_fraction)],
        os.path.join(root, "logs", "data.log"))
    os.makedirs(data, exist_ok=True)
    for split in ("train", "test"):  # the arithmetic task only
        rows = pd.read_parquet(os.path.join(everything, f"{split}.parquet"))
        rows[rows["data_source"] == "tool_arithmetic"].to_parquet(os.path.join(data, f"{split}.parquet"))
    sft_rows = pd.read_parquet(os.path.join(everything, "sft_train.parquet"))
    sft_rows[~sft_rows["response"].str.contains("<search>", regex=False)].to_parquet(
        os.path.join(data, "sft_train.parquet"))
    if args.format == "hermes":
        to_hermes(model, data)
    run([sys.executable, "-m", "verl.trainer.fsdp_sft_trainer", f"model.partial_pretrain={model}",
         "model.enable_gradient_checkpointing=false", f"data.train_files={data}/sft_train.parquet",
         "data.prompt_key=prompt", "data.response_key=response", "data.max_length=320", "data.train_batch_size=32",
         "data.micro_batch_size_per_gpu=32", "optim.lr=2e-3", "optim.warmup_steps_ratio=0.05",
         f"trainer.total_training_steps={args.sft_steps}", f"trainer.seed={args.seed}", "trainer.device=cpu",
         "trainer.logger=[console]", f"trainer.default_local_dir={sft}"], os.path.join(root, "logs", "sft.log"))
    return sft_model, data


def to_hermes(model: str, data: str) -> None:
    """Rewrite the task's prompts and SFT demonstrations into the hermes calculator format (in place)."""
    from transformers import AutoTokenizer

    from verl.demo.tool_tasks import hermes_calculator_response, hermes_messages
    from verl.workers.rollout.tool_formats import HermesFormat

    tokenizer = AutoTokenizer.from_pretrained(model)
    tool_turn = HermesFormat(["calculator"], tokenizer).results_text
    for name in ("train", "test", "sft_train"):
        path = os.path.join(data, f"{name}.parquet")
        rows = pd.read_parquet(path)
        rows["prompt"] = [hermes_messages(list(p)) for p in rows["prompt"]]
        if "response" in rows:
            rows["response"] = [hermes_calculator_response(r, tool_turn, tokenizer.eos_token) for r in rows["response"]]
        rows.to_parquet(path)


def greedy_eval(model_dir: str, data: str, out_path: str, log: str, tools: bool = True,
                fmt: str = "tags", samples: int = 1) -> dict[str, float]:
    """Greedy pass@1 on the test split, with the tool (the agent loop of `fmt`) or without it; with `samples` > 1
    instead the mean reward of that many samples per prompt at temperature 1 (avg@k: what the policy earns as it
    samples, which RL moves before it moves the greedy answer)."""
    agent = [f"rollout.{o}" if o[0] != "+" else f"+rollout.{o[1:]}" for o in FORMATS[fmt]["rollout"]] if tools else []
    sampling = (["data.n_samples=1", "rollout.do_sample=false"] if samples == 1 else
                [f"data.n_samples={samples}", "rollout.do_sample=true", "rollout.temperature=1.0", "rollout.seed=1"])
    run([sys.executable, "-m", "verl.trainer.main_generation", f"model.path={model_dir}",
         f"data.path={data}/test.parquet", "trainer.device=cpu", f"rollout.response_length={RESPONSE_LENGTH[fmt]}",
         f"rollout.prompt_length={PROMPT_LENGTH}", *sampling, f"data.output_path={out_path}", *agent], log, threads=1)
    with open(out_path.removesuffix(".parquet") + ".metrics.json") as f:
        row = json.load(f)["all"]
    if samples > 1:
        return {f"sampled_avg@{samples}": row[f"avg@{samples}"]}
    return {"acc": row["pass@1"], "tool_calls": row.get("tool_calls_per_response", 0.0)}


def train(args: argparse.Namespace, method: str, sft_model: str, data: str) -> dict[str, float]:
    root = args.out
    run_dir = os.path.join(root, f"rl_{method}")
    done = os.path.join(run_dir, "result.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    overrides = [o.replace("HALF", str(args.n // 2)) for o in FORMATS[args.format]["methods"][method]]
    rollout = [f"{ROLLOUT}.{o}" if o[0] != "+" else f"+{ROLLOUT}.{o[1:]}" for o in FORMATS[args.format]["rollout"]]
    start = time.perf_counter()
    run([sys.executable, "-m", "verl.trainer.main_ppo", f"actor_rollout_ref.model.path={sft_model}",
         f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
         f"data.train_batch_size={args.prompts}", f"data.max_prompt_length={PROMPT_LENGTH}",
         f"data.max_response_length={RESPONSE_LENGTH[args.format]}", f"data.seed={args.seed}", "algorithm.adv_estimator=grpo",
         f"{ROLLOUT}.n={args.n}", *rollout,
         f"{ACTOR}.ppo_mini_batch_size={args.prompts // 2}", f"{ACTOR}.optim.lr={args.lr}",
         f"{ACTOR}.use_kl_loss=false", f"{ACTOR}.entropy_coeff=0",
         "actor_rollout_ref.model.enable_gradient_checkpointing=false", "trainer.device=cpu",
         "trainer.n_gpus_per_node=2", f"trainer.seed={args.seed}", f"trainer.total_training_steps={args.rl_steps}",
         f"trainer.save_freq={args.rl_steps}", "trainer.test_freq=-1", "trainer.val_before_train=false",
         "trainer.resume_mode=disable", "trainer.project_name=tool_demo", f"trainer.experiment_name={method}",
         f"trainer.default_local_dir={run_dir}", *overrides], os.path.join(root, "logs", f"rl_{method}.log"))
    seconds = time.perf_counter() - start
    merged = merge_final(run_dir, args.rl_steps, os.path.join(root, "logs", f"merge_{method}.log"))
    result = greedy_eval(merged, data, os.path.join(run_dir, "greedy.parquet"),
                         os.path.join(root, "logs", f"eval_{method}.log"), fmt=args.format)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f]
    last = steps[-5:]
    result.update({
        "train_score_first": steps[0]["critic/score/mean"],
        "train_score_last5": sum(s["critic/score/mean"] for s in last) / len(last),
        "train_tool_calls_last5": sum(s["tools/calls_per_trajectory"] for s in last) / len(last),
        "branches_per_prompt": sum(s.get("rollout/branches_per_prompt", 0.0) for s in steps) / len(steps),
        "seconds": seconds,
    })
    with open(done, "w") as f:
        json.dump(result, f)
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out = os.path.abspath(args.out or ("outputs/tool_demo" if args.format == "tags" else
                                            "outputs/tool_demo_hermes"))
    os.chdir(REPO)
    sft_model, data = prepare(args)
    logs = os.path.join(args.out, "logs")
    results = {"sft_without_tool": greedy_eval(sft_model, data, os.path.join(args.out, "sft_notool.parquet"),
                                               os.path.join(logs, "sft_notool.log"), tools=False),
               "sft_with_tool": greedy_eval(sft_model, data, os.path.join(args.out, "sft_tool.parquet"),
                                            os.path.join(logs, "sft_tool.log"), fmt=args.format)}
    methods = FORMATS[args.format]["methods"]
    models = {"sft_with_tool": sft_model}
    for method in methods:
        results[method] = train(args, method, sft_model, data)
        models[method] = os.path.join(args.out, f"rl_{method}", "merged")
    key = f"sampled_avg@{args.eval_samples}"
    for name, model_dir in models.items():  # the held-out reward as the policy samples
        results[name].update(greedy_eval(model_dir, data, os.path.join(args.out, f"{name}_sampled.parquet"),
                                         os.path.join(logs, f"{name}_sampled.log"), fmt=args.format,
                                         samples=args.eval_samples))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"{'':18} {'greedy acc':>10} {key:>16} {'tool calls':>10} {'RL seconds':>10}")
    for name, row in results.items():
        sampled = f"{row[key]:>16.3f}" if key in row else f"{'':>16}"
        print(f"{name:18} {row['acc']:>10.3f} {sampled} {row['tool_calls']:>10.2f} {row.get('seconds', 0):>10.0f}")
    base = results[next(iter(methods))]
    for method in methods:
        row = results[method]
        print(f"{method}: accuracy {row['acc'] - base['acc']:+.3f} vs GRPO, wall time x{row['seconds'] / base['seconds']:.2f}, "
              f"train score {row['train_score_first']:.3f} -> {row['train_score_last5']:.3f}, "
              f"branches/prompt {row['branches_per_prompt']:.2f}")


if __name__ == "__main__":
    main()
