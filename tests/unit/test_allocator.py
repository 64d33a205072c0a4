"""The process-wide malloc tuning `relay run` applies (relay.app.keep_freed_memory)."""

from __future__ import annotations

import platform

import pytest

from relay.app import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc tuning")
def test_glibc_takes_the_thresholds() -> None:
    assert keep_freed_memory(4 << 20, 8 << 20) is True

