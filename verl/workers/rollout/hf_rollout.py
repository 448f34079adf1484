"""A rollout engine on a plain Hugging Face causal LM: batched KV-cache decoding written out step by step.

It does not call `model.generate`, so that each sampled token's log-prob and entropy come straight from the
distribution it was sampled from. Definitions, per step with logits z and temperature T:

    p = softmax(z / T)                 (T = 1 when greedy)
    log_prob = log p[token]            entropy = -sum_v p_v log p_v

both taken *before* top-k / top-p filtering: that is the distribution the actor recomputes from its own forward pass
(`logits / temperature`, then log-softmax), so `rollout_log_probs` and `old_log_probs` agree up to numerics.
Top-k / top-p only restrict which token is drawn (the filters and the draw itself: sampling.py).

Two decode loops sample from the same distributions (greedy: the same tokens; sampled, on the CPU: the same draws
from the engine's generator until a row finishes, since the eager loop then draws for fewer rows):
- eager: a growing KV cache; rows leave the batch as they finish; the host reads each step's tokens to stop them.
- static (`rollout.static_decode`; by default on CUDA, for plain sampling): a preallocated KV cache for the whole
  batch, finished rows masked on the device and decoded on (their tokens are dropped), the host reading the tokens
  once at the end and whether every row is done once every `STATIC_DONE_CHECK` steps. A decode step runs wholly on
  the device over buffers kept per batch shape (`StaticState`): the model's step, the sampling from its logits
  (with random numbers drawn for every step in one draw before the loop), writing the token and ending the rows it
  finishes. On CUDA it is compiled into one CUDA graph (`torch.compile(mode="reduce-overhead")`) that reads and
  writes only fixed addresses: one launch per token instead of one per kernel, and nothing copied in.
  Stop strings and top log-probs need the decoded text or extra outputs per step: those requests take the eager
  loop.

Both loops attend, for a grouped-query model on SDPA, with `decode_attention.grouped_decode_attention`: a decode step
reads each cached KV head once for its group of query heads instead of a copy per query head.

Stopping follows vLLM: a completion ends at an EOS id (tokenizer and generation config; `stop_reason` None), at a
`stop_token_ids` id (`stop_reason` = that id), when a stop string appears in the decoded completion (`stop_reason` =
the string), all three with `finish_reason` "stop" and the finishing token kept in `token_ids`; or after
`max_tokens` tokens (`finish_reason` "length"). For stop strings, `token_ids` run up to and including the token that
completed the string whatever `include_stop_str_in_output` says -- as in vLLM, that flag trims only decoded text,
which this engine does not return.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F

from verl.utils.exact_kernels import is_exact
from verl.utils.memory import DTYPE_BYTES, FLOAT32_BYTES, EngineClaim, EngineContext
from verl.utils.torch_functional import (
    STATIC_PROMPT_BUCKET,
    compute_position_id_with_mask,
    entropy_from_logits,
    logprobs_from_logits,
    pad_2d_list_to_tensor,
    tensor_checksum,
)
from verl.workers.rollout.base import CompletionOutput, RolloutEngine, SamplingParams, ScoredTokens, params_per_prompt
from verl.workers.rollout.decode_attention import use_grouped_decode_attention
from verl.workers.rollout.registry import register_rollout
from verl.workers.rollout.sampling import draw_uniforms, sample_from_probs, scaled_logits, top_k_top_p_filter
from verl.workers.rollout.served import config_value
from verl.workers.rollout.static_decode import (
    EOS,
    LENGTH,
    RUNNING,
    STATIC_CACHES_KEPT,
    STATIC_DONE_CHECK,
    STOP_TOKEN,
    GraphedStep,
    StaticSlot,
    StaticState,
    uses_static_decode,
)

# The sampling temporaries of one decoding step (float logits, / T, filtered, softmax, log-softmax, entropy) per
# sequence and vocabulary entry, as the memory estimate counts them.
SAMPLING_COPIES = 6
def diverged_weights() -> FloatingPointError:
    """The error a rollout raises when the model's next-token logits are NaN or inf."""
    return FloatingPointError(
        "the rollout model's next-token logits are NaN or inf, so no token can be sampled: its weights have diverged. "
        "Look at the steps before (actor/grad_norm, actor/skipped_steps, actor/pg_loss) and lower "
        "actor_rollout_ref.actor.optim.lr or set actor_rollout_ref.actor.grad_clip")


@dataclass
class _Completion:
    """A completion while it is being decoded."""

    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    top_log_probs: list[list[float]] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def to_output(self) -> CompletionOutput:
        return CompletionOutput(self.token_ids, self.log_probs, self.entropies, self.finish_reason, self.stop_reason,
                                self.top_log_probs)


@register_rollout("hf")
class HFRollout(RolloutEngine):
    """Batched sampling on the engine's own (non-FSDP) copy of the policy.

    module: a HF causal LM that only this engine uses (weights arrive through `update_weights`).
    config: optional rollout config; `micro_batch_size` = how many sequences decode together (default: all).
    seed: seeds the engine's own torch.Generator, so the same seed and weights give the same samples.
    weights_follow: the caller pushes the actor's full weights after every update, so on CPU `sleep` may free them.
    """

    takes_weights_in_place = True  # `weight_targets`: the module's own parameters and buffers

    def __init__(
        self,
        module: torch.nn.Module,
        tokenizer,
        config=None,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        weights_follow: bool = False,
        static_decode: bool | None = None,
    ):
        self.device = torch.device(device)
        self.module = module.to(self.device)
        # Decode steps attend with each KV head read once for its group of query heads (decode_attention.py).
        self.grouped_decode_attention = use_grouped_decode_attention(self.module)
        self.weights_follow = weights_follow
        self.weights_released = False
        self._param_shapes = {param: param.shape for param in self.module.parameters()}
        self.tokenizer = tokenizer
        self.micro_batch_size = config_value(config, "micro_batch_size")
        if static_decode is None:  # an engine built on its own (no run plan): its config's setting on its device
            static_decode = uses_static_decode(config_value(config, "static_decode", default=None), self.device.type)
        self.static_decode = bool(static_decode)
        # The compiled CUDA graphs read the weights at the addresses they were captured with: freeing the weights
        # between rollouts would re-record the graphs every step (and after torch's re-record limit, 128, run the
        # decode step uncompiled), so such an engine keeps them on the GPU and the push writes into them in place.
        self.weights_resident = self.static_decode and self.device.type == "cuda"
        # (rows, length) -> the KV cache and loop state kept for reuse, the most recently used last; at most
        # STATIC_CACHES_KEPT.
        self._static_caches: dict[tuple[int, int], StaticSlot] = {}
        # The static loop's cache spans at least these (rollout.prompt_length / response_length), so that a run's
        # rollouts share one shape, hence one compiled graph, whatever their longest prompt.
        self._prompt_length = int(config_value(config, "prompt_length", default=None) or 0)
        self._response_length = int(config_value(config, "response_length", default=None) or 0)
        self._decode_step = self._decode_and_sample
        # Where each batch shape is a compiled graph (CUDA), a smaller batch takes a kept cache's shape.
        self.pad_to_kept_rows = self.static_decode and self.device.type == "cuda"
        if self.static_decode and self.device.type == "cuda":
            # One CUDA graph per (rows, length, sampling settings): the static cache's tensors keep their addresses
            # across calls; the graph runs the model's step and the sampling from its logits. In exact mode the graph
            # is captured from the eager step (GraphedStep), so that it runs the actor's kernels.
            if is_exact(self.module):
                self._decode_step = GraphedStep(self._decode_and_sample)
            else:
                self._decode_step = torch.compile(self._decode_and_sample, dynamic=False, mode="reduce-overhead")
        self.generator = None
        if seed is not None:
            self.generator = torch.Generator(device=self.device)
            self.generator.manual_seed(seed)

        generation_config = getattr(module, "generation_config", None)
        self.eos_token_ids: set[int] = set()
        for ids in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
            if ids is not None:
                self.eos_token_ids.update([ids] if isinstance(ids, int) else ids)
        # Left padding of prompts is masked out, so any valid id will do when the tokenizer has no pad token.
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else next(iter(self.eos_token_ids), 0)

    @classmethod
    def build(cls, *, model_path, tokenizer, config, device, seed, load_module, weights_follow, tokenizer_path=None,
              trust_remote_code=False, hf_overrides=None, static_decode: bool | None = None) -> HFRollout:
        """See `RolloutEngine.build`: this engine runs the module `load_module()` returns. `static_decode`: the run
        plan's choice of decode loop (`RunPlan.rollout.static_decode`), which the worker passes."""
        return cls(module=load_module(), tokenizer=tokenizer, config=config, device=device, seed=seed,
                   weights_follow=weights_follow, static_decode=static_decode)

    # ---- generation -------------------------------------------------------------------------------------------

    def generate(
        self, prompt_token_ids: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[CompletionOutput]]:
        """See `RolloutEngine.generate`. With a list of params, they may differ only in `max_tokens` (one sampler
        serves the whole batch)."""
        for i, ids in enumerate(prompt_token_ids):
            if len(ids) == 0:
                raise ValueError(f"prompt {i} is empty; HFRollout needs at least one prompt token")
        per_prompt = params_per_prompt(params, len(prompt_token_ids))
        shared = per_prompt[0] if per_prompt else params
        if any(replace(p, max_tokens=shared.max_tokens) != shared for p in per_prompt):
            raise ValueError("HFRollout.generate: per-prompt sampling params may differ only in max_tokens")
        requests = [list(ids) for ids in prompt_token_ids for _ in range(shared.n)]
        max_tokens = [p.max_tokens for p in per_prompt for _ in range(shared.n)]
        micro_batch_size = self.micro_batch_size or max(len(requests), 1)
        if self.weights_released:
            raise RuntimeError("HFRollout.generate: the weights were released by sleep(); push them first "
                               "(update_weights)")
        self.module.eval()
        completions: list[CompletionOutput] = []
        with torch.no_grad():
            for start in range(0, len(requests), micro_batch_size):
                end = start + micro_batch_size
                completions.extend(self._generate_batch(requests[start:end], shared, max_tokens[start:end]))
        return [completions[i * shared.n : (i + 1) * shared.n] for i in range(len(prompt_token_ids))]

    def score(self, sequences: list[list[int]], temperature: float = 1.0, topk: int = 0) -> list[ScoredTokens]:
        """See `RolloutEngine.score`: one forward of the engine's module per micro-batch of right-padded sequences
        (`micro_batch_size`, default all), float32 log-softmax of logits / temperature."""
        if self.weights_released:
            raise RuntimeError("HFRollout.score: the weights were released by sleep(); push them first")
        for i, ids in enumerate(sequences):
            if len(ids) < 2:
                raise ValueError(f"sequence {i} has {len(ids)} tokens; scoring needs at least 2")
        self.module.eval()
        scored: list[ScoredTokens] = []
        size = self.micro_batch_size or max(len(sequences), 1)
        with torch.no_grad():
            for start in range(0, len(sequences), size):
                batch = sequences[start:start + size]
                width = max(len(ids) for ids in batch)
                ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
                mask = torch.zeros(len(batch), width, dtype=torch.long)
                for row, tokens in enumerate(batch):
                    ids[row, :len(tokens)] = torch.tensor(tokens)
                    mask[row, :len(tokens)] = 1
                ids, mask = ids.to(self.device), mask.to(self.device)
                logits = self.module(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]
                log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
                taken = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
                top = log_probs.topk(topk, dim=-1) if topk else None
                for row, tokens in enumerate(batch):
                    n = len(tokens) - 1
                    scored.append(ScoredTokens(taken[row, :n].cpu(),
                                               None if top is None else top.values[row, :n].cpu(),
                                               None if top is None else top.indices[row, :n].cpu()))
        return scored

    def _generate_batch(
        self, requests: list[list[int]], params: SamplingParams, max_tokens: list[int]
    ) -> list[CompletionOutput]:
        """Decode one micro-batch: prefill the left-padded prompts, then one token per step from the KV cache.

        Rows leave the batch (and the cache) as soon as they finish (row i after `max_tokens[i]` tokens at most),
        so finished rows cost no more compute. Plain sampling with `static_decode` takes `_generate_batch_static`.
        """
        if self.static_decode and not params.stop and not params.logprobs:
            return self._generate_batch_static(requests, params, max_tokens)
        input_ids = pad_2d_list_to_tensor(requests, self.pad_token_id, left=True).to(self.device)
        attention_mask = pad_2d_list_to_tensor([[1] * len(r) for r in requests], 0, left=True).to(self.device)
        position_ids = compute_position_id_with_mask(attention_mask)
        out = self.module(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
        )
        cache, logits = out.past_key_values, out.logits[:, -1]

        completions = [_Completion(top_log_probs=[] if params.logprobs else None) for _ in requests]
        active = list(range(len(requests)))  # completions[active[j]] is row j of the current batch
        stop_window = self._stop_window(params)
        for _ in range(max(max_tokens)):
            tokens, log_probs, entropies, top = self._sample(logits, params)
            # The step's results reach the host in one read (each read of a CUDA tensor is a sync), packed as float64:
            # exact for the float32 values and for token ids.
            columns = [tokens[:, None], log_probs[:, None], entropies[:, None]]
            if top is not None:
                columns += [top.values, top.indices]
            host = torch.cat([c.double() for c in columns], dim=1).tolist()
            k = top.values.shape[-1] if top is not None else 0
            if any(math.isnan(row[1]) for row in host):
                raise diverged_weights()
            keep = []
            for j, row in enumerate(host):
                token, log_prob, entropy = int(row[0]), row[1], row[2]
                completion = completions[active[j]]
                completion.token_ids.append(token)
                completion.log_probs.append(log_prob)
                completion.entropies.append(entropy)
                if top is not None:
                    completion.top_log_probs.append(
                        self._top_entry(row[3 : 3 + k], [int(i) for i in row[3 + k :]], token, log_prob))
                if not self._finished(completion, params, stop_window, max_tokens[active[j]]):
                    keep.append(j)
            if not keep:
                break
            if len(keep) < len(active):
                rows = torch.tensor(keep, device=self.device)
                cache.reorder_cache(rows)
                attention_mask, position_ids, tokens = attention_mask[rows], position_ids[rows], tokens[rows]
                active = [active[j] for j in keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(active), 1)], dim=1)
            position_ids = position_ids[:, -1:] + 1
            out = self.module(
                input_ids=tokens[:, None],
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits = out.past_key_values, out.logits[:, -1]
        return [c.to_output() for c in completions]

    def _generate_batch_static(
        self, requests: list[list[int]], params: SamplingParams, max_tokens: list[int]
    ) -> list[CompletionOutput]:
        """The static loop (module docstring): the same completions as the eager loop for requests without stop
        strings or top log-probs. Row i's tokens, log-probs and entropies are columns [0, end_i] of the slot's device
        buffers (`StaticState`); `reason` says why it ended (EOS, a stop token id, max_tokens)."""
        rows, steps = len(requests), max(max_tokens)
        longest = max(self._prompt_length, *(len(r) for r in requests))
        prompt_len = -(-longest // STATIC_PROMPT_BUCKET) * STATIC_PROMPT_BUCKET
        length = prompt_len + max(steps, self._response_length)
        if self.pad_to_kept_rows and (rows, length) not in self._static_caches:
            # A smaller batch (a last partial validation batch, a micro-batch remainder) decodes in a kept cache's
            # rows, beside copies of its last request that stop after one token, instead of compiling and
            # recording a graph for its own shape (and evicting one that the next rollout needs).
            wider = [r for r, n in self._static_caches if n == length and rows < r <= 2 * rows]
            if wider:
                spare = min(wider) - rows
                padded = self._generate_batch_static(requests + [requests[-1]] * spare, params,
                                                     max_tokens + [1] * spare)
                return padded[:rows]
        input_ids = pad_2d_list_to_tensor(requests, self.pad_token_id, prompt_len, left=True).to(self.device)
        prompt_mask = pad_2d_list_to_tensor([[1] * len(r) for r in requests], 0, prompt_len, left=True).to(self.device)
        slot = self._static_slot(rows, length)
        state, cache = slot.state, slot.cache
        state.mask.zero_()
        state.mask[:, :prompt_len] = prompt_mask
        position_ids = compute_position_id_with_mask(prompt_mask)
        logits = self.module(input_ids=input_ids, attention_mask=state.mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        state.start(prompt_len, position_ids[:, -1:], max_tokens, self._stop_kinds(params, logits.shape[-1]))
        if not params.greedy:  # every step's random numbers in one draw, as the eager loop draws them step by step
            state.uniforms[:steps].copy_(torch.rand(steps, rows, 1, generator=self.generator, device=self.device))
        tokens, log_probs, entropies, _ = self._sample(logits, params, None if params.greedy else state.uniforms[0])
        self._record(state, tokens, log_probs, entropies)
        for t in range(1, steps):
            if t % STATIC_DONE_CHECK == 0:
                done, nan = torch.stack([(state.reason != RUNNING).all(), state.diverged]).tolist()
                if nan:
                    raise diverged_weights()
                if done:
                    break
            self._decode_step(state, cache, params.greedy, params.temperature, params.top_k, params.top_p)

        if bool(state.diverged):
            raise diverged_weights()
        # The one read of the results on the host.
        tokens_host, log_probs_host, entropies_host = (x[:, :steps].cpu().numpy() for x in (
            state.tokens, state.log_probs, state.entropies))
        reason_host, end_host = state.reason.tolist(), state.end.tolist()
        completions = []
        for i in range(rows):
            n = end_host[i] + 1
            token_ids = tokens_host[i, :n].tolist()
            finish, stop = ("length", None) if reason_host[i] == LENGTH else ("stop", None)
            if reason_host[i] == STOP_TOKEN:
                stop = token_ids[-1]
            completions.append(CompletionOutput(token_ids, log_probs_host[i, :n].astype(np.float64).tolist(),
                                                entropies_host[i, :n].astype(np.float64).tolist(), finish, stop,
                                                None))
        return completions

    def _static_slot(self, rows: int, length: int) -> StaticSlot:
        """The kept KV cache and loop state of this batch shape (reset for a new batch), or new ones; the least
        recently used shape goes past STATIC_CACHES_KEPT."""
        from transformers import StaticCache

        slot = self._static_caches.pop((rows, length), None)
        if slot is None:
            while len(self._static_caches) >= STATIC_CACHES_KEPT:
                del self._static_caches[next(iter(self._static_caches))]
            slot = StaticSlot(StaticCache(config=self.module.config, max_cache_len=length),
                               StaticState.allocate(rows, length, self.device))
        else:
            slot.cache.reset()
        self._static_caches[(rows, length)] = slot
        return slot

    def _stop_kinds(self, params: SamplingParams, vocab: int) -> torch.Tensor:
        """`(vocab,)` long: per token id, EOS for the end-of-sequence ids, else STOP_TOKEN for `stop_token_ids`,
        else RUNNING (ids outside the model's vocabulary cannot be sampled and are left out)."""
        kinds = torch.full((vocab,), RUNNING, dtype=torch.long)
        for ids, kind in ((params.stop_token_ids or (), STOP_TOKEN), (self.eos_token_ids, EOS)):
            ids = [i for i in ids if 0 <= i < vocab]
            kinds[ids] = kind
        return kinds.to(self.device)

    @staticmethod
    def _record(state: StaticState, tokens: torch.Tensor, log_probs: torch.Tensor, entropies: torch.Tensor) -> None:
        """Write a step's sampled tokens, log-probs and entropies `(rows,)` at column `state.step`, and end the rows
        they finish: by EOS, else a stop token id, else their max_tokens (a row's first reason is kept)."""
        column = state.step.view(1)
        state.tokens.index_copy_(1, column, tokens[:, None])
        state.log_probs.index_copy_(1, column, log_probs[:, None].float())
        state.entropies.index_copy_(1, column, entropies[:, None].float())
        state.diverged.logical_or_(log_probs.isnan().any())
        kind = state.stop_kinds[tokens]
        why = torch.where(kind != RUNNING, kind, torch.where(state.last <= state.step, LENGTH, RUNNING))
        ends_now = (state.reason == RUNNING) & (why != RUNNING)
        state.end.copy_(torch.where(ends_now, state.step, state.end))
        state.reason.copy_(torch.where(ends_now, why, state.reason))

    def _decode_and_sample(self, state: StaticState, cache, greedy: bool, temperature: float, top_k: int,
                           top_p: float) -> None:
        """The static loop's step, all on the device: the newest tokens through the model (attending to the cache
        under the mask, their column now set), the next token of each row picked from the logits (`_pick`, with the
        step's pre-drawn uniform numbers when sampling) and recorded (`_record`). On CUDA this is the compiled graph:
        it reads and writes only buffers at fixed addresses (the weights, the cache, `state`), so its replay copies
        nothing in and the host launches one graph per token; it takes the sampling settings as plain values."""
        newest = state.tokens.index_select(1, state.step.view(1))
        state.mask.index_fill_(1, (state.prompt_len + state.step).view(1), 1)
        state.position_ids.add_(1)
        logits = self.module(input_ids=newest, attention_mask=state.mask, position_ids=state.position_ids,
                             past_key_values=cache, use_cache=True).logits[:, -1]
        state.step.add_(1)
        uniform = None if greedy else state.uniforms.index_select(0, state.step.view(1))[0]
        _, picked, log_probs, entropies = self._draw(logits, greedy, temperature, top_k, top_p, uniform)
        self._record(state, picked, log_probs, entropies)

    def _pick(self, scaled: torch.Tensor, greedy: bool, top_k: int, top_p: float,
              uniform: torch.Tensor | None) -> torch.Tensor:
        """The next token of each row from its `scaled_logits`: the largest when greedy, else drawn after top-k /
        top-p with the `uniform` numbers (drawn here from the engine's generator when None)."""
        if greedy:
            return scaled.argmax(dim=-1)
        probs = F.softmax(top_k_top_p_filter(scaled, top_k, top_p), dim=-1)
        # Free on the CPU; not on CUDA (a sync) or in a compiled graph: the loops see it there by the sampled token's
        # log-prob, NaN.
        if probs.device.type == "cpu" and not torch.compiler.is_compiling() and not bool(torch.isfinite(probs).all()):
            raise diverged_weights()
        if uniform is None:
            uniform = draw_uniforms(probs.shape[0], probs.device, self.generator)
        return sample_from_probs(probs, uniform=uniform)

    def _sample(self, logits: torch.Tensor, params: SamplingParams, uniform: torch.Tensor | None = None):
        """Next token, its log-prob, the distribution's entropy for each row and, with `params.logprobs=k`, the
        top-k (log-probs, token ids) `(batch, k)` of the same distribution (else None). logits `(batch, vocab)`;
        `uniform`: the step's random numbers drawn beforehand (else drawn here from the engine's generator)."""
        scaled, tokens, log_probs, entropies = self._draw(logits, params.greedy, params.temperature, params.top_k,
                                                          params.top_p, uniform)
        top = None
        if params.logprobs:
            top = torch.topk(scaled.log_softmax(dim=-1), min(params.logprobs, scaled.shape[-1]), dim=-1)
        return tokens, log_probs, entropies, top

    def _draw(self, logits: torch.Tensor, greedy: bool, temperature: float, top_k: int, top_p: float,
              uniform: torch.Tensor | None):
        """The module docstring's definitions for one step of logits `(batch, vocab)`, from plain sampling values
        (so that the compiled step can take them): the `scaled_logits`, the next tokens (`_pick`), their log-probs
        and the distribution's entropy."""
        scaled = scaled_logits(logits, greedy, temperature)
        tokens = self._pick(scaled, greedy, top_k, top_p, uniform)
        return scaled, tokens, logprobs_from_logits(scaled, tokens), entropy_from_logits(scaled)

    @staticmethod
    def _top_entry(values: list[float], ids: list[int], token: int, log_prob: float) -> list[float]:
        """The top-k log-probs of one row (`values` of the tokens `ids`), plus the sampled token's when it is not among
        them (as vLLM returns)."""
        return values + [log_prob] if token not in ids else values

    # ---- stopping ---------------------------------------------------------------------------------------------

    @staticmethod
    def _stop_window(params: SamplingParams) -> int:
        """How many trailing tokens to decode to see any stop string the newest token could have completed.

        Every token adds at least one byte of text, so a stop string of b UTF-8 bytes spans at most b tokens; one
        more token covers tokenizers that change the first decoded token's leading space.
        """
        return max((len(s.encode("utf-8")) for s in params.stop or ()), default=0) + 1

    def _finished(self, completion: _Completion, params: SamplingParams, stop_window: int, max_tokens: int) -> bool:
        """Set the finish and stop reasons if the newest token ends the completion; return whether it did."""
        token = completion.token_ids[-1]
        if token in self.eos_token_ids:
            completion.finish_reason = "stop"
        elif token in (params.stop_token_ids or ()):
            completion.finish_reason, completion.stop_reason = "stop", token
        elif params.stop:
            tail = self.tokenizer.decode(completion.token_ids[-stop_window:], skip_special_tokens=True)
            matched = next((s for s in params.stop if s in tail), None)
            if matched is not None:
                completion.finish_reason, completion.stop_reason = "stop", matched
        if completion.finish_reason is None and len(completion.token_ids) >= max_tokens:
            completion.finish_reason = "length"
        return completion.finish_reason is not None

    # ---- weights and memory -----------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy each (name, tensor) into the parameter or buffer of that name.

        Tied weights (e.g. `lm_head.weight` and `model.embed_tokens.weight`) share storage, so either name updates
        both. Sharded tensors (FSDP2 DTensors) are gathered first.
        """
        released = self.weights_released
        targets = self.weight_targets()
        written = set()
        with torch.no_grad():
            for name, tensor in named_tensors:
                written.add(name)
                if name not in targets:
                    raise KeyError(
                        f"update_weights: {name!r} is not a parameter or buffer of the rollout model "
                        f"({type(self.module).__name__})"
                    )
                if hasattr(tensor, "full_tensor"):
                    tensor = tensor.full_tensor()
                target = targets[name]
                if target.shape != tensor.shape:
                    raise ValueError(
                        f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the rollout model "
                        f"expects {tuple(target.shape)}"
                    )
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        if released:
            self.check_all_written(written)

    def check_all_written(self, written: set[str]) -> None:
        """After a push into released weights, every parameter must have been written (else it holds garbage)."""
        written_ids = {id(p) for n, p in self.module.named_parameters(remove_duplicate=False) if n in written}
        missing = [n for n, p in self.module.named_parameters() if id(p) not in written_ids]
        if missing:
            raise ValueError(f"update_weights: the engine's weights were released while the actor trained, and the "
                             f"push did not bring {missing[:5]}; push every parameter (or set "
                             f"actor_rollout_ref.rollout.free_cache_engine=false)")

    def weights_checksum(self) -> float:
        if self.weights_released:
            return float("nan")
        return sum(float(tensor_checksum(t)) for t in self.module.state_dict().values())

    def sleep(self) -> None:
        """While the actor trains. When the actor pushes its full weights after every update (`weights_follow`), free
        them, on any device: the full model per rank is the largest thing the update does not need, and the next push
        allocates them again (`weight_targets`, `update_weights`). Otherwise, on a GPU, move them to host memory
        until `wake_up`. An engine whose compiled graphs read its weights (`weights_resident`) keeps them."""
        if self.weights_follow and not self.weights_resident:
            if not self.weights_released:
                for param in self.module.parameters():  # tied weights are one Parameter: freed once
                    param.data = param.data.new_empty(0)
                self.weights_released = True
        elif self.device.type != "cpu" and not self.weights_resident:
            self.module.to("cpu")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake_up(self) -> None:
        """Weights moved to host memory by `sleep` go back to the engine's device (released ones wait for a push)."""
        if self.device.type != "cpu" and not self.weights_released:
            self.module.to(self.device)

    def weight_targets(self) -> dict[str, torch.Tensor]:
        """The engine's parameters and buffers by name (tied weights under each of their names), allocated and
        contiguous: the caller may write the new weights straight into them and skip `update_weights`."""
        if self.weights_released:
            for param in self.module.parameters():
                param.data = torch.empty(self._param_shapes[param], dtype=param.dtype, device=self.device)
            self.weights_released = False
        self.wake_up()  # targets on the engine's device, where collectives write them (NCCL writes GPU memory only)
        targets = dict(self.module.named_parameters(remove_duplicate=False))
        targets.update(self.module.named_buffers(remove_duplicate=False))
        return targets

    @classmethod
    def memory_claim(cls, ctx: EngineContext) -> EngineClaim:
        """Its own copy of the model in hf_engine_dtype (float32 on CPU, rollout.dtype on CUDA) and a KV cache for the
        sequences it decodes at once; with free_cache_engine the copy is freed (or moved to host) between rollouts.
        On CUDA the static loop's compiled graphs read the weights and the cache where they were captured: both stay
        all step, and so does the graphs' private memory pool, which holds its step's sampling temporaries."""
        actor, plan = ctx.actor, ctx.plan
        prompt, response = ctx.prompt_length, ctx.response_length
        decoding = min(ctx.rollout.micro_batch_size or ctx.rows, ctx.rows)
        e = DTYPE_BYTES[plan.rollout.hf_engine_dtype]
        generate = {"hf engine weights": e * actor.parameters}
        if plan.rollout.static_decode:  # one preallocated cache of the bucketed prompt and the whole response
            bucketed = -(-prompt // STATIC_PROMPT_BUCKET) * STATIC_PROMPT_BUCKET
            generate["KV cache"] = decoding * 2 * actor.kv_dim * (bucketed + response) * e * actor.layers
        else:  # the cache grows by concatenation: the step's new tensors of a layer exist beside the old ones
            generate["KV cache"] = decoding * 2 * actor.kv_dim * (prompt + response) * e * (actor.layers + 1)
        sampling = decoding * actor.vocab * FLOAT32_BYTES * SAMPLING_COPIES  # the sampler's float32 logits
        generate["prefill"] = decoding * prompt * (2 * e * actor.hidden + actor.layer_temporaries(e)) + sampling
        resident = {}
        if ctx.cuda and plan.rollout.static_decode:
            resident = {"hf engine weights": generate.pop("hf engine weights"), "KV cache": generate.pop("KV cache"),
                        "decode graph pool": sampling}
        elif not ctx.rollout.free_cache_engine:
            resident["hf engine weights"] = generate.pop("hf engine weights")
        return EngineClaim(resident=resident, generate=generate, levers=(
            ("actor_rollout_ref.rollout.free_cache_engine", "flag"),
            ("actor_rollout_ref.rollout.micro_batch_size", "size")))
