"""How many EAGLE-3 draft tokens the target accepts per verify. Pure.

Position k (1-based) of the draft is accepted, given all earlier ones were, with probability
P0 * DECAY**(k-1); tree drafting (topk > 1) widens each position's chance. The accept length
SGLang reports counts the bonus token: 1 + accepted drafts, at most num_draft_tokens.

With noise off the scheduler hands out tokens deterministically (`tokens_after_cycles`) so the
realised mean equals the expectation and tests can count cycles exactly; with request noise on
it draws the chain of Bernoulli trials from `scaled_position_probabilities`.
"""

from __future__ import annotations

import math

ACCEPT_P0 = 0.81
ACCEPT_DECAY = 0.9
_EPS = 1e-9


def max_accepted_drafts(steps: int, draft_tokens: int) -> int:
    return max(0, min(steps, draft_tokens - 1))


def position_probabilities(steps: int, topk: int, draft_tokens: int) -> tuple[float, ...]:
    """P(draft position k accepted | all earlier accepted), k = 1..max accepted drafts."""
    widen = max(1, topk) ** 0.6
    out = []
    for k in range(1, max_accepted_drafts(steps, draft_tokens) + 1):
        p = ACCEPT_P0 * ACCEPT_DECAY ** (k - 1)
        out.append(1.0 - (1.0 - p) ** widen)
    return tuple(out)


def _expected_drafts(probs: tuple[float, ...], scale: float = 1.0) -> float:
    total, chain = 0.0, 1.0
    for p in probs:
        chain *= min(1.0, p * scale)
        total += chain
    return total


def scaled_position_probabilities(
    steps: int, topk: int, draft_tokens: int, accept_len_mult: float
) -> tuple[float, ...]:
    """Per-position probabilities whose expected accepted drafts is scaled by the multiplier.

    `accept_len_mult` multiplies the expected number of accepted draft tokens (the part of the
    accept length above the bonus token), clamped to what the draft can deliver.
    """
    probs = position_probabilities(steps, topk, draft_tokens)
    if not probs or accept_len_mult == 1.0:
        return probs
    target = min(len(probs), max(0.0, _expected_drafts(probs) * accept_len_mult))
    lo, hi = 0.0, 1.0 / min(probs)
    for _ in range(60):  # bisection on a common scale of the per-position probabilities
        mid = (lo + hi) / 2
        if _expected_drafts(probs, mid) < target:
            lo = mid
        else:
            hi = mid
    return tuple(min(1.0, p * hi) for p in probs)


def expected_accept_len(
    steps: int, topk: int, draft_tokens: int, accept_len_mult: float = 1.0
) -> float:
    """Expected tokens per verify per request, bonus token included (SGLang's accept len)."""
    probs = scaled_position_probabilities(steps, topk, draft_tokens, accept_len_mult)
    return 1.0 + _expected_drafts(probs)


def tokens_after_cycles(cycles: int, accept_len: float) -> int:
    """Tokens a request has after `cycles` cycles with deterministic (noise-free) acceptance.

    The scheduler hands out floor(k * a) - floor((k-1) * a) tokens on cycle k, so the running
    mean equals the expected accept length exactly and predictions can count cycles.
    """
    return int(math.floor(cycles * accept_len + _EPS))


def cycles_for_tokens(tokens: int, accept_len: float) -> int:
    if tokens <= 0:
        return 0
    k = max(1, math.ceil((tokens - _EPS) / accept_len) - 1)
    while tokens_after_cycles(k, accept_len) < tokens:
        k += 1
    return k
