"""The HF engine's prefix cache: the keys and values of finished requests, kept so that a later request
whose prompt begins with the same tokens prefills only the rest of it.

In a multi-turn episode each turn's prompt is the last turn's prompt, its reply and a new observation
(docs/tokens.md), so without a cache every turn runs the whole history through the model again, its images
included. SGLang keeps each conversation's cache between turns in a radix tree; here each entry is one
finished request: its prompt and its reply but the last token (no decode step ran that token through the
model), their keys and values copied out of the batch's cache when the request finished.

A request matches on its `PromptKey`: its token ids with each image's pads replaced by a key of the image's
pixels (negative, so it is never a token id), as SGLang replaces them with a hash of the image's features, so
two prompts with the same text and different images differ from the first pad on. A match ends at a whole
image: keys and values reused at an image's pads came from that image's features. The last prompt token is
always computed, since the first new token is drawn from its logits. Positions need nothing: a prompt's
mRoPE positions are found over the whole prompt (`prompts.py`), and the cached part's were the same.

Entries are found through a hash of every whole block of `BLOCK` tokens chained over the blocks before it
(as vLLM finds its cached blocks): a request's deepest block whose hash an entry holds is found by
bisection, and the few most recent entries holding it are compared token by token, so a lookup costs the
same with ten entries or ten thousand. The cache holds at most `capacity_bytes` of keys and values,
dropping the least recently used entries first; an entry that a newer one extends (the last turn of the
same episode) is dropped when the newer one is stored. Everything here runs on the engine's model thread.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 32
"""Tokens a block hash covers: a prompt shares fewer than this with every entry prefills whole."""

COMPARED = 8
"""The most recent entries holding a request's deepest matched block that are compared with it."""


@dataclass(frozen=True)
class PromptKey:
    """What a prompt is matched on: its tokens (int64, each image's pads its content key) and the chained
    hash of each whole block of them."""

    tokens: np.ndarray
    blocks: tuple[int, ...]

    @classmethod
    def of(
        cls, ids: Sequence[int], pad: int, image_keys: Sequence[int], pads_per_image: Sequence[int]
    ) -> PromptKey:
        """The key of expanded `ids`: image i's `pads_per_image[i]` pads (`pad`) replaced by
        `-1 - image_keys[i]`."""
        tokens = np.asarray(ids, dtype=np.int64)
        pads = np.flatnonzero(tokens == pad)
        if len(pads) != sum(pads_per_image):
            raise ValueError(f"{len(pads)} image pads for images of {sum(pads_per_image)} pads")
        tokens[pads] = np.repeat(-1 - np.asarray(image_keys, dtype=np.int64), pads_per_image)
        return cls(tokens, _chained(tokens, ()))

    def extended(self, ids: Sequence[int]) -> PromptKey:
        """This key followed by `ids` (generated tokens, which are never image pads of an image)."""
        tokens = np.concatenate([self.tokens, np.asarray(ids, dtype=np.int64)])
        return PromptKey(tokens, _chained(tokens, self.blocks))

    def __len__(self) -> int:
        return len(self.tokens)


def _chained(tokens: np.ndarray, known: tuple[int, ...]) -> tuple[int, ...]:
    """The chained hashes of `tokens`' whole blocks, the first `len(known)` of them already `known`."""
    hashes = list(known)
    chained = hashes[-1] if hashes else 0
    for start in range(len(hashes) * BLOCK, len(tokens) - BLOCK + 1, BLOCK):
        chained = hash((chained, tokens[start : start + BLOCK].tobytes()))
        hashes.append(chained)
    return tuple(hashes)


@dataclass(eq=False)
class Entry:
    """A finished request's tokens and their keys and values, `[layers, 2, kv_heads, tokens, head_dim]`,
    under an id no other entry of its cache ever has."""

    id: int
    key: PromptKey
    kv: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


@dataclass(frozen=True)
class Hit:
    """The entry a prompt begins with, and how many of the prompt's tokens it gives."""

    entry: Entry
    length: int

    @property
    def kv(self) -> torch.Tensor:
        """The keys and values of the prompt's first `length` tokens (a view)."""
        return self.entry.kv[:, :, :, : self.length]


class PrefixCache:
    """Finished requests' keys and values, at most `capacity_bytes` of them, the least recently used
    dropped first."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 1:
            raise ValueError(f"a prefix cache holds at least 1 byte, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.bytes = 0
        self._entries: collections.OrderedDict[int, Entry] = collections.OrderedDict()  # oldest use first
        self._holders: dict[int, dict[int, None]] = {}  # block hash -> the entries holding it, in store order
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, key: PromptKey) -> Hit | None:
        """The entry that gives the most of `key`'s tokens (whole images, all but the last token), now the
        most recently used; None when none gives a whole block."""
        depth = self._deepest(key.blocks)
        if depth == 0:
            return None
        holders = itertools.islice(reversed(self._holders[key.blocks[depth - 1]]), COMPARED)
        shared = {id_: _shared(self._entries[id_].key.tokens, key.tokens) for id_ in holders}
        best = max(shared, key=shared.__getitem__)
        length = _reusable(key.tokens, shared[best])
        if length == 0:
            return None
        self._entries.move_to_end(best)
        return Hit(self._entries[best], length)

    def store(self, key: PromptKey, kv: torch.Tensor, extends: int | None = None) -> None:
        """Keep `kv`, the keys and values of `key`'s tokens, dropping the entries `key` extends (entry
        `extends`, the one its prompt began with, and those holding its deepest block: anything that matched
        them matches this one as far), then the least recently used ones while it does not fit. An entry
        that holds all of `key`'s tokens already is kept instead."""
        nbytes = kv.numel() * kv.element_size()
        if not key.blocks or nbytes > self.capacity_bytes:
            return
        related = [*([] if extends is None else [extends]), *self._holders.get(key.blocks[-1], {})]
        for id_ in related:
            held = self._entries.get(id_)
            if held is None:
                continue
            shared = _shared(held.key.tokens, key.tokens)
            if shared == len(key):
                self._entries.move_to_end(id_)
                return
            if shared == len(held.key):
                self._drop(id_)
        while self.bytes + nbytes > self.capacity_bytes:
            self._drop(next(iter(self._entries)))
        entry = Entry(next(self._ids), key, kv)
        self._entries[entry.id] = entry
        self.bytes += nbytes
        for block in key.blocks:
            self._holders.setdefault(block, {})[entry.id] = None

    def clear(self) -> None:
        """Drop every entry (the weights changed, or `/flush_cache`)."""
        self._entries.clear()
        self._holders.clear()
        self.bytes = 0

    def _deepest(self, blocks: tuple[int, ...]) -> int:
        """How many of `blocks` some entry holds: the held ones are a prefix of them (an entry holds every
        block of its own), so bisection finds its end."""
        low, high = 0, len(blocks)
        while low < high:
            middle = (low + high + 1) // 2
            if blocks[middle - 1] in self._holders:
                low = middle
            else:
                high = middle - 1
        return low

    def _drop(self, id_: int) -> None:
        """Forget entry `id_`."""
        entry = self._entries.pop(id_)
        self.bytes -= entry.nbytes
        for block in entry.key.blocks:
            holders = self._holders[block]
            holders.pop(id_, None)
            if not holders:
                del self._holders[block]


def _shared(a: np.ndarray, b: np.ndarray) -> int:
    """How many tokens `a` and `b` share from the start."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def _reusable(tokens: np.ndarray, shared: int) -> int:
    """Of `shared` leading tokens, those a prompt reuses: never its last one, and never part of an image
    (an image's pads share one key), whose features the rest's prompt pass computes whole."""
    length = min(shared, len(tokens) - 1)
    if length > 0 and tokens[length] < 0 and tokens[length] == tokens[length - 1]:
        before = np.flatnonzero(tokens[:length] != tokens[length])
        length = int(before[-1]) + 1 if before.size else 0
    return length
