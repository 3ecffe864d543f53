"""Super-stream hash routing, compatible with the Java, Go and JS clients.

murmur3 (32-bit, x86) with seed 104729 over the UTF-8 bytes of the routing key, read as an unsigned
32-bit integer, modulo the number of partitions, in the order the broker lists them.  rstream hashes
the UTF-16 bytes (with a byte-order mark) through the 128-bit variant instead, so a Python service on
rstream and a Java service sharing a super stream put about two keys in three on different partitions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from smartclient._errors import ConfigurationError
from smartclient.core.validation import refuse, texts

__all__ = ["HASH_SEED", "hash_partition", "murmur3_32"]

HASH_SEED = 104729


def murmur3_32(data: bytes, seed: int = HASH_SEED) -> int:
    """murmur3 x86 32-bit of ``data``, unsigned (uses mmh3 when installed, else pure Python)."""
    try:
        import mmh3
    except ImportError:  # pragma: no cover - mmh3 comes with rstream
        return _murmur3_32_py(data, seed)
    return int(mmh3.hash(data, seed, signed=False))


def hash_partition(key: str, partitions: Sequence[str]) -> str:
    """The partition of ``partitions`` that ``key`` routes to."""
    if not isinstance(key, str):
        refuse("the routing key", "a str", key)
    if isinstance(partitions, str | Mapping) or not isinstance(partitions, Sequence):
        texts("partitions", partitions)
    if not partitions:
        raise ConfigurationError("a super stream with no partitions cannot route")
    chosen = partitions[murmur3_32(key.encode("utf-8")) % len(partitions)]
    if not isinstance(chosen, str):  # (only the one chosen is looked at: this runs for every message)
        texts("partitions", partitions)
    return chosen


def _murmur3_32_py(data: bytes, seed: int) -> int:
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed & mask
    rounded = len(data) & ~3
    for i in range(0, rounded, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    k = 0
    tail = data[rounded:]
    for shift, byte in enumerate(tail):
        k |= byte << (8 * shift)
    if tail:
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h
