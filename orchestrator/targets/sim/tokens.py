"""Fake tokenizer, deterministic output tokens, and a radix-style prefix cache.

Only counts and determinism matter: prompt length drives prefill time, output length must be
exactly `max_new_tokens` under `ignore_eos`, and the same prompt always yields the same text.
The prefix cache makes `cached_tokens` and `/flush_cache` behave like SGLang's radix cache.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence

VOCAB_SIZE = 163840  # Kimi-K2's vocabulary size
_WORDS = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has",
    "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "model", "token",
    "server", "graph", "verify", "draft", "decode", "kernel", "clock", "power", "node", "batch",
    "cache", "stream", "latency", "speed", "accept", "cycle", "layer", "expert", "weight",
)  # fmt: skip
_WORD_RE = re.compile(r"\w+|[^\w\s]")


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def tokenize(text: str) -> list[int]:
    """~1 token per word or punctuation mark, long words split every 6 characters."""
    out = []
    for piece in _WORD_RE.findall(text):
        for i in range(0, len(piece), 6):
            out.append(_stable_hash(piece[i : i + 6]) % VOCAB_SIZE)
    return out or [1]


def output_token(seed: int, position: int) -> int:
    return (seed * 1_000_003 + position * 7919 + 12345) % VOCAB_SIZE


def token_text(token_id: int) -> str:
    return " " + _WORDS[token_id % len(_WORDS)]


def detokenize(token_ids: Sequence[int]) -> str:
    return "".join(token_text(t) for t in token_ids)


def prompt_seed(input_ids: Sequence[int]) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(",".join(map(str, input_ids[:4096])).encode())
    return int.from_bytes(h.digest(), "little")


class PrefixCache:
    """Longest cached prefix of a token sequence (block-hashed, like a radix tree's pages)."""

    BLOCK = 16

    def __init__(self) -> None:
        self._blocks: set[int] = set()
        self._lock = threading.Lock()

    def _hashes(self, ids: Sequence[int]) -> list[int]:
        out, h = [], 0
        for end in range(self.BLOCK, len(ids) + 1, self.BLOCK):
            h = hash((h, tuple(ids[end - self.BLOCK : end])))
            out.append(h)
        return out

    def match_and_insert(self, ids: Sequence[int]) -> int:
        """Tokens of `ids` already cached (never the whole prompt: one token is always new)."""
        hashes = self._hashes(ids)
        with self._lock:
            matched = 0
            for h in hashes:
                if h not in self._blocks:
                    break
                matched += self.BLOCK
            self._blocks.update(hashes)
        return min(matched, max(len(ids) - 1, 0))

    def flush(self) -> None:
        with self._lock:
            self._blocks.clear()
