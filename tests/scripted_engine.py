"""A character-level tokenizer and a scripted rollout engine for the agent-loop tests (tests/workers/rollout/).

`CharTokenizer`: one token per character (code point + 1), 0 is EOS. `ScriptedEngine(script)`: for each request the
text after the prompt's "|" is the response so far, and `script(prompt, response)` returns the next segment, or
(segment, per-token entropy); a segment ending in "$" finishes with EOS, one ending in one of the request's stop
strings stops there, `max_tokens` truncates; `n` gives that completion n times. With `logprobs=k` every token gets
two top log-probs of log(1/2). It records every request (`requests`: (ids, params)) and the size of every engine call
(`calls`). Tests import it as `from scripted_engine import ...` (pytest puts tests/ on sys.path through its
conftest).
"""

from __future__ import annotations

import math
import threading

from verl.workers.rollout.base import CompletionOutput, RolloutEngine

EOS = 0


class CharTokenizer:
    """One token per character (code point + 1); 0 is EOS."""

    eos_token_id = EOS
    pad_token_id = EOS

    def __len__(self):
        return 300

    def encode(self, text, add_special_tokens=False):
        return [ord(c) + 1 for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i - 1) for i in ids if i != EOS)


TOK = CharTokenizer()


class ScriptedEngine(RolloutEngine):
    """See the module docstring."""

    def __init__(self, script):
        self.script = script
        self.requests, self.calls = [], []
        self.lock = threading.Lock()  # the agent loops' server calls from its own thread

    def generate(self, prompt_token_ids, params):
        params = params if isinstance(params, list) else [params] * len(prompt_token_ids)
        with self.lock:
            self.calls.append(len(prompt_token_ids))
        outputs = []
        for ids, p in zip(prompt_token_ids, params):
            with self.lock:
                self.requests.append((list(ids), p))
            prompt, _, response = TOK.decode(ids).partition("|")
            segment = self.script(prompt, response)
            segment, entropy = segment if isinstance(segment, tuple) else (segment, 0.25)
            finish, stop = "stop", None
            if segment.endswith("$"):
                tokens = TOK.encode(segment[:-1]) + [EOS]
            else:
                tokens = TOK.encode(segment)
                stop = next((s for s in p.stop or () if segment.endswith(s)), None)
                finish = "stop" if stop else "length"
            if len(tokens) > p.max_tokens:
                tokens, finish, stop = tokens[: p.max_tokens], "length", None
            top = [[math.log(0.5), math.log(0.5)]] * len(tokens) if p.logprobs else None
            outputs.append([CompletionOutput(list(tokens), [-0.5] * len(tokens), [entropy] * len(tokens), finish,
                                             stop, top) for _ in range(p.n)])
        return outputs

    def update_weights(self, named_tensors):
        pass

    def sleep(self):
        pass

    def wake_up(self):
        pass


class StreamingScriptedEngine(ScriptedEngine):
    """The scripted engine with continuous batching (`streams`, as the vLLM engine of one rank): `add_request`
    queues a request, and each `step` finishes the requests that have run `steps_per_request` steps, in the order
    they came. `running` records how many requests each step ran."""

    streams = True

    def __init__(self, script, steps_per_request: int = 3):
        super().__init__(script)
        self.steps_per_request = steps_per_request
        self.queue: dict[str, list] = {}  # request id -> [ids, params, steps left]
        self.running: list[int] = []
        self.next_id = 0

    def add_request(self, prompt_ids, params):
        request_id = f"r{self.next_id}"
        self.next_id += 1
        self.queue[request_id] = [list(prompt_ids), params, self.steps_per_request]
        return request_id

    def step(self):
        self.running.append(len(self.queue))
        done = []
        for request_id, entry in list(self.queue.items()):
            entry[2] -= 1
            if entry[2] == 0:
                del self.queue[request_id]
                done.append((request_id, self.generate([entry[0]], [entry[1]])[0][0]))
        return done
