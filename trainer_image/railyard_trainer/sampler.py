"""Which window of the token stream each global sample reads: deterministic, shuffled, resumable.

The stream of ``N`` tokens holds ``W = (N - 1) // seq_len`` non-overlapping windows of
``seq_len + 1`` tokens (inputs and the labels shifted by one). Global sample ``g`` belongs to
epoch ``g // W`` and reads window ``perm_epoch(g % W)``, where ``perm_epoch`` is a pseudo-random
permutation of ``[0, W)`` keyed by ``(seed, epoch)``: every window once per epoch, a new order
each epoch. The permutation is a 4-round Feistel network over the next power of four with
cycle-walking, so it costs O(1) memory and a few vector operations per sample whatever the
size of the dataset (no index array of W entries is ever built, nor shuffled).

The sampler's whole state is the number of global samples consumed, so a run resumed from a
checkpoint, on any data-parallel degree, reads exactly the samples the uninterrupted run would
have read; the global batch size may even change (samples are neither skipped nor repeated).
"""

from __future__ import annotations

import numpy as np

_M64 = (1 << 64) - 1


def _mix64_int(x: int) -> int:
    """splitmix64's finaliser on a Python int (for keys)."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class FeistelPermutation:
    """A bijection of ``[0, n)`` determined by ``key``; ``perm(indices)`` maps an array of them."""

    ROUNDS = 4

    def __init__(self, n: int, key: int) -> None:
        if n < 1:
            raise ValueError("a permutation needs n >= 1")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)
        self.keys = [np.uint64(_mix64_int(key * 0x9E3779B97F4A7C15 + r + 1)) for r in range(self.ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        h = np.uint64(self.half)
        left, right = x >> h, x & self.mask
        for k in self.keys:
            left, right = right, left ^ (_mix64(right ^ k) & self.mask)
        out: np.ndarray = (left << h) | right
        return out

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        x = np.asarray(indices, dtype=np.uint64)
        if x.size and int(x.max()) >= self.n:
            raise IndexError(f"index {int(x.max())} outside [0, {self.n})")
        y = self._encrypt(x)
        # Cycle-walking: the domain is at most 4n, so a few rounds bring every value below n.
        out_of_range = y >= np.uint64(self.n)
        while out_of_range.any():
            y[out_of_range] = self._encrypt(y[out_of_range])
            out_of_range = y >= np.uint64(self.n)
        return y.astype(np.int64)


class WindowSampler:
    """Global sample index -> start offset (in tokens) of its window in the stream."""

    def __init__(self, n_tokens: int, seq_len: int, *, seed: int, shuffle: bool) -> None:
        self.seq_len = seq_len
        self.windows = (n_tokens - 1) // seq_len
        if self.windows < 1:
            raise ValueError(f"{n_tokens} tokens hold no sequence of seqLen + 1 = {seq_len + 1} tokens")
        self.seed = seed
        self.shuffle = shuffle
        self._perms: dict[int, FeistelPermutation] = {}

    def _perm(self, epoch: int) -> FeistelPermutation:
        p = self._perms.get(epoch)
        if p is None:
            self._perms = {epoch: FeistelPermutation(self.windows, _mix64_int(self.seed * 1_000_003 + epoch))}
            p = self._perms[epoch]
        return p

    def starts(self, samples: np.ndarray) -> np.ndarray:
        """Token offsets of the windows of global samples ``samples`` (int64 array)."""
        g = np.asarray(samples, dtype=np.int64)
        epochs, within = np.divmod(g, self.windows)
        if not self.shuffle:
            return within * self.seq_len
        out = np.empty_like(within)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._perm(int(e))(within[sel])
        return out * self.seq_len
