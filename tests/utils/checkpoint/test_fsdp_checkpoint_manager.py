"""Re-sharding on load: a checkpoint saved by 3 FSDP2 ranks (rows that do not split evenly) loads on 2, with every
weight and Adam state equal to the full tensors of the saving run, the lr schedule carried over and each rank's RNG
stream kept. (2 -> 1 and 1 -> 2 run end to end in tests/e2e/test_run_dir_and_resume.py.)"""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import leave_group, spawn


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _model_and_optimizer(world: int, seed: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    # 50 embedding rows and 4 rows of the middle layer do not split evenly over 3 ranks.
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 4), torch.nn.Linear(4, 50))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return model, optimizer, scheduler


def _full(model, optimizer) -> dict[str, torch.Tensor]:
    """Every weight and Adam state as a full tensor (a collective)."""
    full = {name: t.full_tensor() for name, t in model.state_dict().items()}
    for name, param in model.named_parameters():
        for key, value in optimizer.state[param].items():
            full[f"{name}.{key}"] = value.full_tensor() if value.dim() else value
    return full


def _rank(rank: int, world: int, port: int, checkpoint: str, load: bool, results):
    """Save (load=False): one real step on `world` ranks, then the checkpoint plus the full tensors as expected.pt.
    Load: into a differently initialised model on `world` ranks, compared with expected.pt."""
    from verl.utils.checkpoint.fsdp_checkpoint_manager import load_rank_checkpoint, save_rank_checkpoint

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model, optimizer, scheduler = _model_and_optimizer(world, seed=rank + world)
        if not load:
            tokens = torch.tensor([1, 7, 3, 9, 42])
            torch.nn.functional.cross_entropy(model(tokens[:-1]), tokens[1:]).backward()
            optimizer.step()  # so that the Adam states hold something
            scheduler.step()
            full = _full(model, optimizer)
            if rank == 0:
                torch.save(full, f"{checkpoint}/expected.pt")
            torch.manual_seed(100 + rank)  # each rank's stream, which the checkpoint keeps
            save_rank_checkpoint(checkpoint, rank, world, model, optimizer, scheduler)
        else:
            load_rank_checkpoint(checkpoint, rank, world, model, optimizer, scheduler)
            restored = torch.get_rng_state()
            expected = torch.load(f"{checkpoint}/expected.pt")
            for name, tensor in _full(model, optimizer).items():
                torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)
            assert scheduler.last_epoch == 1 and optimizer.param_groups[0]["lr"] == 1e-2 / 2
            torch.manual_seed(100 + rank)  # the stream saved rank `rank` left, not this process's seed + world
            assert torch.equal(restored, torch.get_rng_state())
        results[rank] = "ok"
    except Exception as err:  # reported to the parent
        results[rank] = repr(err)
        dist.destroy_process_group()
        return
    leave_group()


def test_a_checkpoint_of_3_ranks_loads_on_2(tmp_path):
    for world, load in ((3, False), (2, True)):
        results = mp.Manager().dict()
        spawn(_rank, args=(world, _free_port(), str(tmp_path), load, results), nprocs=world)
        assert dict(results) == {rank: "ok" for rank in range(world)}, (world, load)
