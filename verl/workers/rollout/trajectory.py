"""One trajectory under construction, in either tool loop (the seeds' rounds, tool_rounds.py; verl's tool_agent loop,
tool_agent.py): its response so far with the loss mask (1 on sampled tokens, 0 on tool results), the engine's
log-probs and entropies, and what the loops count and the branching reads."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class Trajectory:
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    # Per response token, the policy version that sampled it (-1: a tool result, or weights no one counts).
    versions: list[int] = field(default_factory=list)
    calls: int = 0  # tool calls made
    h_init: float | None = None  # its first segment's entropy (ARPO, branching.py); branches inherit it
    after_tool: bool = False  # the next segment starts right after a tool result: a branch point
    # The round loop's: its prompt's index in the call, how it started ("initial" | "branch" | "refill" | "probe",
    # AEPO's pre-monitoring trajectory, kept), its segments' entropies and why it ended ("running" while active).
    prompt: int = 0
    origin: str = "initial"
    segment_entropies: list[float] = field(default_factory=list)
    finish_reason: str = "length"
    # verl's tool_agent loop's: the turns it took and the tools' rewards.
    assistant_turns: int = 0
    user_turns: int = 0
    reward: float = 0.0

    def branch(self, prefix_len: int | None = None, origin: str = "branch") -> Trajectory:
        """A new trajectory sharing this one's first `prefix_len` response tokens (None: all of them), up to a tool
        result, with its counters; it does not branch again at the point it starts from (after_tool false)."""
        cut = len(self.response) if prefix_len is None else prefix_len
        return replace(self, origin=origin, response=self.response[:cut], mask=self.mask[:cut],
                       log_probs=self.log_probs[:cut], entropies=self.entropies[:cut], versions=self.versions[:cut],
                       segment_entropies=list(self.segment_entropies), after_tool=False, finish_reason="length")

    def extend(self, tokens: list[int], log_probs: list[float], entropies: list[float], mask: int,
               version: int | None = None) -> None:
        self.response.extend(tokens)
        self.mask.extend([mask] * len(tokens))
        self.log_probs.extend(log_probs)
        self.entropies.extend(entropies)
        self.versions.extend([-1 if version is None else version] * len(tokens))
