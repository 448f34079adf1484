"""Offline generation and scoring: `python -m verl.trainer.main_generation model.path=... data.path=... k=v ...`.

For every prompt of `data.path` (a .parquet, .jsonl or .json file in verl's row schema, read with RLHFDataset's chat template and
truncation rules) the model samples `data.n_samples` responses; each is scored by the reward manager
(`reward_model.reward_manager`, with the rule scorer of the row's data_source or `custom_reward_function`). Written:

- `data.output_path`: the input rows plus `responses` (list of n strings) and `scores` (list of n floats);
- `<output_path without .parquet>.metrics.json`: `{data_source: {"num_prompts", "avg@N", "mean@N", "pass@k"}}`
  plus an "all" row (see `verl/trainer/ppo/eval_metrics.py`; pass@k counts a score >= 1.0 as correct);
- the same metrics as a table on stdout.

The model runs in this process on one device through the rollout engine interface (`rollout.name=hf`: batched
KV-cache decoding of a plain HF model, `data.batch_size` prompts at a time). No Ray and no FSDP are involved, so
`trainer.nnodes` / `trainer.n_gpus_per_node` are accepted but unused; the vLLM engine plugs in later through
`get_rollout_cls` without changing this file. `run_generation(config)` does the whole job in-process and returns the
metrics, for pipelines (quickstart, tools/run_eval_pipeline.py) that want them without a subprocess.

AvgN convention (RLPR's eval files): with `data.n_samples=null`, N comes from an `AvgN` / `avgN` token in the data
file's name (`math500_Avg8.parquet` -> 8), else 1.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from verl.protocol import DataProto
from verl.trainer.ppo.eval_metrics import compute_eval_metrics, format_metrics_table
from verl.utils.config import ConfigError, resolve_device, run_cli
from verl.utils.dataset.rl_dataset import read_rows

# "AvgN" as its own token: not preceded by a letter (so "navg8" does not count) and not followed by more digits.
_AVG_N_TOKEN = re.compile(r"(?<![a-z])avg(\d+)(?!\d)", re.IGNORECASE)

TRUNCATION_MODES = ("error", "left", "right", "middle")
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


def infer_n_samples(data_path: str) -> int | None:
    """N from an `AvgN` / `avgN` token in the file name (`math500_Avg8.parquet` -> 8), None when there is none."""
    match = _AVG_N_TOKEN.search(os.path.basename(data_path))
    return int(match.group(1)) if match else None


def metrics_path(output_path: str) -> str:
    """Where the metrics JSON goes: `out.parquet` -> `out.metrics.json`."""
    return output_path.removesuffix(".parquet") + ".metrics.json"


def resolve_n_samples(config: DictConfig) -> int:
    """`data.n_samples`, or the AvgN of the data file name when it is null, or 1."""
    if config.data.n_samples is not None:
        return int(config.data.n_samples)
    return infer_n_samples(config.data.path or "") or 1


def is_greedy(rollout: DictConfig) -> bool:
    return not rollout.do_sample or rollout.temperature == 0


def check_generation_config(config: DictConfig) -> int:
    """Raise one ConfigError listing every problem (naming the keys); return the number of samples per prompt."""
    problems: list[str] = []
    data, model, rollout = config.data, config.model, config.rollout

    if model.path is None:
        problems.append("model.path is not set; pass model.path=<local Hugging Face model directory>")
    elif not os.path.isfile(os.path.join(os.path.expanduser(model.path), "config.json")):
        problems.append(f"model.path={model.path}: not a Hugging Face model directory (no config.json there; "
                        "models are never downloaded at run time)")
    if data.path is None:
        problems.append("data.path is not set; pass data.path=<prompts .parquet/.jsonl/.json file>")
    elif not os.path.isfile(os.path.expanduser(data.path)):
        problems.append(f"data.path={data.path}: file not found")
    elif not str(data.path).endswith(DATA_SUFFIXES):
        problems.append(f"data.path={data.path} must be a {'/'.join(DATA_SUFFIXES)} file")
    if data.output_path is None:
        problems.append("data.output_path is not set; pass data.output_path=<file .parquet to write>")
    elif not str(data.output_path).endswith(".parquet"):
        problems.append(f"data.output_path={data.output_path} must end with .parquet")
    custom = config.custom_reward_function.path
    if custom is not None and not os.path.isfile(os.path.expanduser(custom)):
        problems.append(f"custom_reward_function.path={custom}: file not found")

    for key in ("data.batch_size", "rollout.response_length", "rollout.prompt_length"):
        value = OmegaConf.select(config, key)
        if not (isinstance(value, int) and value >= 1):
            problems.append(f"{key}={value} must be a positive integer")
    if data.max_prompt_length is not None and data.max_prompt_length < 1:
        problems.append(f"data.max_prompt_length={data.max_prompt_length} must be a positive integer (or null)")
    if rollout.micro_batch_size is not None and rollout.micro_batch_size < 1:
        problems.append(f"rollout.micro_batch_size={rollout.micro_batch_size} must be >= 1 (or null)")
    if data.truncation not in TRUNCATION_MODES:
        problems.append(f"data.truncation={data.truncation!r} must be one of {', '.join(TRUNCATION_MODES)}")
    if rollout.temperature < 0:
        problems.append(f"rollout.temperature={rollout.temperature} must be >= 0 (0 means greedy)")
    if not 0 < rollout.top_p <= 1:
        problems.append(f"rollout.top_p={rollout.top_p} must be in (0, 1]")

    n_samples = resolve_n_samples(config)
    origin = (f"data.n_samples={n_samples}" if data.n_samples is not None
              else f"data.n_samples=null (N={n_samples} from the AvgN token in data.path)")
    if n_samples < 1:
        problems.append(f"{origin} must be at least 1")
    elif n_samples > 1 and is_greedy(rollout):
        problems.append(f"{origin} asks for {n_samples} samples per prompt, but greedy decoding (rollout.do_sample="
                        f"{str(rollout.do_sample).lower()}, rollout.temperature={rollout.temperature}) makes them "
                        "identical; set data.n_samples=1, or rollout.do_sample=true with rollout.temperature>0")
    if problems:
        raise ConfigError("the generation config has problems:\n  - " + "\n  - ".join(problems))
    return n_samples


def load_model_and_tokenizer(model_config: DictConfig, device: str):
    """The HF causal LM (float32 on CPU, bfloat16 on CUDA) and its tokenizer, after importing model.external_lib."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if model_config.external_lib:
        try:
            importlib.import_module(model_config.external_lib)
        except ImportError as err:
            raise ConfigError(f"model.external_lib={model_config.external_lib!r} could not be imported: {err}") from err
    path = os.path.expanduser(model_config.path)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_config.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=torch.bfloat16 if device == "cuda" else torch.float32,
        trust_remote_code=model_config.trust_remote_code,
    )
    return model, tokenizer


def _output_table(dataset, responses: list[list[str]], scores: list[list[float]]) -> pa.Table:
    """The input rows that were generated for (all of them unless overlong prompts were filtered) + the results."""
    path = os.path.expanduser(dataset.data_files[0])
    rows = [row_in_file for _, row_in_file, _ in dataset.origins]
    table = pq.read_table(path) if path.endswith(".parquet") else pa.Table.from_pylist(read_rows(path))
    table = table.take(rows)
    # Re-scoring an earlier output file replaces its results rather than adding a second pair of columns.
    table = table.drop_columns([name for name in ("responses", "scores") if name in table.column_names])
    table = table.append_column("responses", pa.array(responses, type=pa.list_(pa.string())))
    return table.append_column("scores", pa.array(scores, type=pa.list_(pa.float64())))


def run_generation(config: DictConfig) -> dict[str, dict[str, float]]:
    """Generate, score, write the output parquet and the metrics JSON; return the metrics (see module docstring)."""
    from verl.trainer.ppo.reward import compute_reward, load_reward_manager
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.workers.rollout.base import SamplingParams, generate_sequences, get_rollout_cls

    n_samples = check_generation_config(config)
    if config.data.n_samples is None and n_samples > 1:
        print(f"[quiver] data.n_samples=null: sampling N={n_samples} per prompt (AvgN in {config.data.path})")
    device = resolve_device(config.trainer.device)
    data, rollout = config.data, config.rollout

    model, tokenizer = load_model_and_tokenizer(config.model, device)
    data_config = OmegaConf.to_container(data, resolve=True)
    data_config["max_prompt_length"] = data.max_prompt_length or rollout.prompt_length
    dataset = RLHFDataset(os.path.expanduser(data.path), tokenizer, data_config)
    engine = get_rollout_cls(rollout.name)(module=model, tokenizer=tokenizer, config=rollout, device=device,
                                           seed=rollout.seed)
    params = SamplingParams(n=n_samples, temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                            max_tokens=rollout.response_length, do_sample=rollout.do_sample)
    reward_fn = load_reward_manager(config, tokenizer, num_examine=config.reward_model.num_examine, is_eval=True)

    responses, scores, sources, prompt_ids = [], [], [], []
    starts = range(0, len(dataset), data.batch_size)
    for start in tqdm(starts, desc=f"generating {n_samples} x {len(dataset)} prompts", unit="batch"):
        items = range(start, min(start + data.batch_size, len(dataset)))
        prompts = DataProto.from_single_dict(collate_fn([dataset[i] for i in items]))
        output = generate_sequences(engine, prompts, params, response_length=rollout.response_length,
                                    pad_token_id=dataset.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        reward_tensor, _ = compute_reward(output, reward_fn)
        batch_scores = reward_tensor.sum(-1).tolist()
        texts = [tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
                 for ids, mask in zip(output.batch["responses"], output.batch["response_mask"])]
        # generate_sequences keeps the n samples of a prompt adjacent.
        for j in range(len(items)):
            responses.append(texts[j * n_samples : (j + 1) * n_samples])
            scores.append(batch_scores[j * n_samples : (j + 1) * n_samples])
        sources.extend(output.non_tensor_batch[data.reward_fn_key].tolist())
        prompt_ids.extend(item for item in items for _ in range(n_samples))

    metrics = compute_eval_metrics(sources, prompt_ids, [s for group in scores for s in group], n_samples)
    output_path = os.path.expanduser(data.output_path)
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    pq.write_table(_output_table(dataset, responses, scores), output_path)
    with open(metrics_path(output_path), "w") as f:
        json.dump(metrics, f, indent=2)

    print(f"\n{data.path}: {len(dataset)} prompts x {n_samples} samples, model {config.model.path}")
    print(format_metrics_table(metrics))
    print(f"wrote {output_path} and {metrics_path(output_path)}")
    return metrics


def main(argv: list[str] | None = None) -> int:
    return run_cli("generation", run_generation, argv)


if __name__ == "__main__":
    sys.exit(main())
