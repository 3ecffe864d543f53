"""smartclient.allocator: the allocator's kept free memory handed back, once or every few seconds."""

from __future__ import annotations

import ctypes
import logging
import threading
import time

import pytest

from smartclient import ConfigurationError, allocator
from smartclient.allocator import MemoryTrimmer, return_free_memory, trim_free_memory
from smartclient.testing.footprint import heap_in_use
from tests.conftest import wait_until_sync

glibc = pytest.mark.skipif(allocator._MALLOC_TRIM is None, reason="no glibc malloc_trim in this C library")


@glibc
def test_a_trim_hands_the_free_memory_kept_in_the_middle_of_the_heap_back() -> None:
    # every other 4 KiB chunk freed, with a live one above it: glibc keeps those, malloc_trim(0) gives them back
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(4096) for _ in range(20_000)]
    try:
        for block in blocks[::2]:
            libc.free(block)
        kept = heap_in_use().get("malloc free kept kib", 0)
        assert kept >= 30_000, kept  # about 40 MiB free, below live chunks
        assert trim_free_memory() is True
    finally:
        for block in blocks[1::2]:
            libc.free(block)


@pytest.mark.parametrize("every", [0, -1.0, "60", True, None, float("nan"), float("inf"), 1e300])
def test_a_trimmer_wants_a_positive_number_of_seconds(every: object) -> None:
    with pytest.raises(ConfigurationError, match="positive number of seconds"):
        MemoryTrimmer(every)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="positive number of seconds"):
        return_free_memory(every)  # type: ignore[arg-type]


@glibc
def test_a_trimmer_trims_on_its_own_thread_until_it_is_closed() -> None:
    with MemoryTrimmer(0.01) as trimmer:
        assert trimmer.supported and trimmer.running
        assert any(t.name == "smartclient-malloc-trim" and t.daemon for t in threading.enumerate())
        wait_until_sync(lambda: trimmer.trims >= 3, 5.0, "three trims", interval=0.01)
    assert not trimmer.running
    done = trimmer.trims
    time.sleep(0.05)  # (a check that nothing more happens, not a wait for something)
    assert trimmer.trims == done


@glibc
def test_the_process_has_one_trimmer_replaced_only_for_another_interval() -> None:
    first = return_free_memory(30)
    try:
        assert return_free_memory(30.0) is first
        second = return_free_memory(45)
        assert second is not first and not first.running and second.running and second.every == 45.0
        assert return_free_memory(45) is second
    finally:
        allocator._TRIMMER.close()  # type: ignore[union-attr]
    assert sum(t.name == "smartclient-malloc-trim" for t in threading.enumerate()) == 0


def test_without_malloc_trim_a_trimmer_does_nothing_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(allocator, "_MALLOC_TRIM", None)
    with caplog.at_level(logging.WARNING, logger="smartclient.allocator"):
        trimmer = MemoryTrimmer(60)
    assert not trimmer.supported and not trimmer.running
    assert "no malloc_trim" in caplog.text
    assert trim_free_memory() is False
    trimmer.close()
    monkeypatch.setattr(allocator, "_TRIMMER", None)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="smartclient.allocator"):
        once = return_free_memory(60)
        assert return_free_memory(60) is once  # the process's one, said once
    assert caplog.text.count("no malloc_trim") == 1
