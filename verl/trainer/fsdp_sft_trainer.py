r"""Supervised fine-tuning (the cold start before RL) of an HF causal LM sharded with FSDP2.

    python -m verl.trainer.fsdp_sft_trainer model.partial_pretrain=<hf dir> data.train_files=<file> k=v ...
    torchrun --nproc_per_node N -m verl.trainer.fsdp_sft_trainer k=v ...

Without torchrun the run is a world of one process. The loss of a step is the token-level cross-entropy averaged
over every loss-masked token of the global batch (all micro-batches on all ranks):

    L = -(1 / T) * sum_{sequences b, positions t with loss_mask[b, t] = 1} log p(x[b, t] | x[b, <t])

where T counts those tokens over the global batch. Each micro-batch backpropagates its share
`sum(nll) * world_size / T` (FSDP averages gradients over ranks), so the gradient is exactly that of L whatever the
split into ranks and micro-batches. At the end, and every `trainer.save_freq` steps, rank 0 writes a plain HF
model (safetensors, config, generation config, tokenizer) to `trainer.default_local_dir/global_step_N/`; it can be
passed directly as `actor_rollout_ref.model.path` to `verl.trainer.main_ppo`.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm

from verl.single_controller.base.worker import BACKENDS, find_free_port
from verl.trainer.config import run_cli
from verl.trainer.config.sft import MODEL_DTYPES, SFTConfig
from verl.utils.config import ConfigError, need, resolve_device
from verl.utils.dataset.sft_dataset import SFTDataset
from verl.utils.fsdp_utils import build_optimizer, clip_grad_and_step, shard_model
from verl.utils.import_utils import import_external_libs
from verl.utils.tracking import Tracking
from verl.utils.typed_config import build_section, check_config_types

CONFIG_NAME = "sft_trainer"


# ------------------------------------------------------------------------------------------------- set-up
def validate_sft_config(config: DictConfig, world_size: int) -> None:
    """Raise one ConfigError listing every setting that cannot work (checked before any model is loaded).

    Each section checks its own keys (verl/trainer/config/sft.py); here the batch sizes against the ranks."""
    problems: list[str] = []
    build_section(SFTConfig, check_config_types(SFTConfig, config), problems)
    data = config.data
    bsz, global_micro = data.train_batch_size, data.micro_batch_size
    sizes = (bsz, data.micro_batch_size_per_gpu, 1 if global_micro is None else global_micro)
    if min(sizes) >= 1:  # a size < 1 is reported by the data section
        micro = micro_batch_size_per_rank(config, world_size)
        micro_name = "data.micro_batch_size / ranks" if global_micro is not None else "data.micro_batch_size_per_gpu"
        need(bsz % world_size == 0, f"data.train_batch_size={bsz} must be divisible by the number of ranks "
             f"({world_size})", problems)
        need(bsz // world_size % micro == 0, f"the per-rank batch data.train_batch_size / ranks = "
             f"{bsz // world_size} must be divisible by {micro_name}={micro}", problems)
    if problems:
        raise ConfigError("the config has problems:\n  - " + "\n  - ".join(problems))


def micro_batch_size_per_rank(config: DictConfig, world_size: int) -> int:
    """`data.micro_batch_size_per_gpu`, unless verl's deprecated global `data.micro_batch_size` is set: that one is
    divided over the ranks and wins, so old scripts that set only it keep their meaning."""
    if config.data.micro_batch_size is not None:
        return max(1, config.data.micro_batch_size // world_size)
    return config.data.micro_batch_size_per_gpu


def init_distributed(device: str) -> bool:
    """Join torch.distributed: from torchrun's environment, or as a world of one on a free local port.

    Returns True when this call created the group (the caller then destroys it).
    """
    if dist.is_initialized():
        return False
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=BACKENDS[device])
    else:
        dist.init_process_group(backend=BACKENDS[device], init_method=f"tcp://127.0.0.1:{find_free_port()}",
                                rank=0, world_size=1)
    return True


def load_model(config: DictConfig, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    import_external_libs(config.model.external_lib, key="model.external_lib")
    model = AutoModelForCausalLM.from_pretrained(
        os.path.expanduser(config.model.partial_pretrain),
        dtype=getattr(torch, MODEL_DTYPES[config.model.fsdp_config.model_dtype]),
        trust_remote_code=config.model.trust_remote_code,
    )
    if config.model.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device)


# ---------------------------------------------------------------------------------------------------- loss
def token_nll_sum(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum of -log p(x_t | x_<t) over the positions t where `loss_mask` is 1. Tensors `(micro, max_length)`.

    Padding is on the right, so the columns after the longest sequence are cut off before the forward pass.
    """
    length = int(batch["attention_mask"].sum(dim=-1).max())
    input_ids = batch["input_ids"][:, :length]
    logits = model(input_ids=input_ids, attention_mask=batch["attention_mask"][:, :length],
                   position_ids=batch["position_ids"][:, :length], use_cache=False).logits
    labels, mask = input_ids[:, 1:], batch["loss_mask"][:, 1:length]  # token t is predicted at position t - 1
    nll = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), labels, reduction="none")
    return (nll * mask).sum()


def _all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    value = value.detach().clone()
    dist.all_reduce(value)
    return value


def train_step(model, optimizer, batch: dict[str, torch.Tensor], micro_batch_size: int, clip_grad: float) -> dict:
    """One optimizer step on this rank's share of the global batch; returns train/loss and train/grad_norm."""
    n_tokens = _all_reduce_sum(batch["loss_mask"][:, 1:].sum().float()).clamp(min=1)
    scale = dist.get_world_size() / n_tokens
    nll_total = torch.zeros((), device=n_tokens.device)
    n_rows = batch["input_ids"].shape[0]
    for start in range(0, n_rows, micro_batch_size):
        micro = {key: value[start:start + micro_batch_size] for key, value in batch.items()}
        nll = token_nll_sum(model, micro)
        (nll * scale).backward()
        nll_total += nll.detach()
    grad_norm = clip_grad_and_step(model, optimizer, clip_grad, who="sft")
    return {"train/loss": float(_all_reduce_sum(nll_total) / n_tokens), "train/grad_norm": grad_norm}


@torch.no_grad()
def validation_loss(model, loader: DataLoader, device: torch.device) -> float:
    """Token-level mean cross-entropy over the whole validation set (all ranks)."""
    model.eval()
    totals = torch.zeros(2, device=device)
    for batch in loader:
        batch = {key: value.to(device) for key, value in batch.items()}
        totals[0] += token_nll_sum(model, batch)
        totals[1] += batch["loss_mask"][:, 1:].sum()
    model.train()
    totals = _all_reduce_sum(totals)
    return float(totals[0] / totals[1].clamp(min=1))


# ---------------------------------------------------------------------------------------------------- save
def save_hf_model(model, hf_config, generation_config, tokenizer, out_dir: str, trust_remote_code: bool) -> None:
    """Gather the full weights (a collective: every rank calls this) and let rank 0 write an HF model directory.

    The files go to a temporary sibling directory that is renamed to `out_dir` once complete, so a crash never
    leaves a half-written model under the final name.
    """
    from transformers import AutoModelForCausalLM

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        parent = os.path.dirname(os.path.abspath(out_dir))
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.", dir=parent)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model is meant to be shared like any output
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(hf_config, trust_remote_code=trust_remote_code)
        plain.load_state_dict(state, assign=True)
        plain.generation_config = generation_config
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if os.path.exists(out_dir):
            stale = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.old.", dir=parent)
            os.replace(out_dir, os.path.join(stale, "model"))
            os.replace(tmp, out_dir)
            shutil.rmtree(stale)
        else:
            os.replace(tmp, out_dir)
    dist.barrier()


# --------------------------------------------------------------------------------------------------- train
def _epochs(loader: DataLoader, sampler: DistributedSampler):
    """Batches forever, reshuffled every epoch (the caller stops after the last step)."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _train(config: DictConfig, device: str) -> str:
    from transformers import AutoTokenizer

    rank, world_size = dist.get_rank(), dist.get_world_size()
    validate_sft_config(config, world_size)
    torch_device = torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch_device = torch.device("cuda", torch.cuda.current_device())
    seed = config.trainer.seed
    torch.manual_seed(seed)

    model_path = os.path.expanduser(config.model.partial_pretrain)
    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=config.model.trust_remote_code)
    if config.data.chat_template:
        tokenizer.chat_template = config.data.chat_template  # the saved model keeps the template it learned
    train_dataset = SFTDataset(config.data.train_files, tokenizer, config.data)
    per_rank = config.data.train_batch_size // world_size
    micro = micro_batch_size_per_rank(config, world_size)
    train_sampler = DistributedSampler(train_dataset, world_size, rank, shuffle=True, seed=seed, drop_last=True)
    train_loader = DataLoader(train_dataset, batch_size=per_rank, sampler=train_sampler, drop_last=True)
    if len(train_loader) == 0:
        raise ConfigError(f"data.train_files hold {len(train_dataset)} rows, fewer than one global batch "
                          f"(data.train_batch_size={config.data.train_batch_size})")
    val_loader = None
    if config.data.val_files:
        val_dataset = SFTDataset(config.data.val_files, tokenizer, config.data)
        val_loader = DataLoader(val_dataset, batch_size=micro,
                                sampler=DistributedSampler(val_dataset, world_size, rank, shuffle=False))
    total_steps = config.trainer.total_training_steps or config.trainer.total_epochs * len(train_loader)

    model = load_model(config, torch_device)
    hf_config, generation_config = model.config, model.generation_config
    mesh = init_device_mesh(device, (world_size,), mesh_dim_names=("fsdp",))
    fsdp = config.model.fsdp_config
    model = shard_model(model, mesh, device, {"param_offload": fsdp.cpu_offload or fsdp.offload_params})
    optim = config.optim
    optimizer, scheduler = build_optimizer(model, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay,
                                           total_steps=total_steps, warmup_steps=int(optim.warmup_steps_ratio * total_steps),
                                           scheduler=optim.lr_scheduler)
    tracking = None
    if rank == 0:
        tracking = Tracking(project_name=config.trainer.project_name, experiment_name=config.trainer.experiment_name,
                            default_backend=config.trainer.logger, config=OmegaConf.to_container(config, resolve=True))

    try:
        out_root = os.path.expanduser(config.trainer.default_local_dir)
        out_dir = ""
        batches = _epochs(train_loader, train_sampler)
        model.train()
        for step in tqdm(range(1, total_steps + 1), desc="SFT", disable=rank != 0):
            batch = {key: value.to(torch_device) for key, value in next(batches).items()}
            lr = scheduler.get_last_lr()[0]
            metrics = train_step(model, optimizer, batch, micro, config.optim.clip_grad)
            scheduler.step()
            metrics["train/lr"] = lr
            last = step == total_steps
            validate = last or (config.trainer.test_freq > 0 and step % config.trainer.test_freq == 0)
            if val_loader is not None and validate:
                metrics["val/loss"] = validation_loss(model, val_loader, torch_device)
            if tracking is not None:
                tracking.log(metrics, step=step)
            if last or (config.trainer.save_freq > 0 and step % config.trainer.save_freq == 0):
                out_dir = os.path.join(out_root, f"global_step_{step}")
                save_hf_model(model, hf_config, generation_config, tokenizer, out_dir, config.model.trust_remote_code)
    finally:
        if tracking is not None:  # files flushed and the wandb run ended here, not left to the interpreter's exit
            tracking.finish()
    return out_dir


def run_sft(config: DictConfig, keep_group: bool = False) -> str:
    """Fine-tune as the config says and return the directory of the final HF model (on every rank). The group this
    call joins is torn down at the end, unless `keep_group` (the CLI's process then ends it: `_end_rank`)."""
    device = resolve_device(config.trainer.device)
    created = init_distributed(device)
    try:
        out_dir = _train(config, device)
        if created:  # no rank tears its group down while another still writes the model (a gloo abort at exit)
            dist.barrier()
        return out_dir
    finally:
        if created and not keep_group:
            dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------- CLI
def _run_and_report(config: DictConfig, keep_group: bool = False) -> None:
    out_dir = run_sft(config, keep_group=keep_group)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[sft] saved the fine-tuned HF model to {out_dir}", flush=True)


def main(argv: list[str] | None = None) -> int:
    return run_cli(CONFIG_NAME, _run_and_report, argv)


def _end_rank(code: int) -> None:
    """The end of a `python -m verl.trainer.fsdp_sft_trainer` process. A rank of a gloo group (torchrun on CPUs)
    meets the others and ends without gloo's C++ teardown: under load, `destroy_process_group` or the interpreter's
    exit after it now and then aborted one rank after a successful run (SIGABRT, "terminate called without an active
    exception"), and torchrun then reports the whole run failed. Everything is written by then (the model, the
    trackers' files). Another backend (NCCL) tears its group down as usual."""
    if dist.is_initialized() and dist.get_backend() == "gloo":
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            dist.barrier()
        except Exception:  # another rank failed and left: this one leaves all the same
            pass
        os._exit(code)
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(code)


if __name__ == "__main__":
    _end_rank(run_cli(CONFIG_NAME, functools.partial(_run_and_report, keep_group=True)))
