"""The memory-latency probe `colibri bench` reports beside the bandwidth probe: one chain of
dependent loads through a buffer in random order (col_measure_read_latency)."""

from __future__ import annotations

import pytest

from colibri.engine import ColibriError, lib, measure_read_latency


def test_latency_probe_waits_on_memory_for_a_buffer_beyond_the_caches() -> None:
    """A chain over 16 KiB stays in L1, one over 256 MiB goes to memory at every load: a chain
    that broke into a short loop, or loads the CPU could overlap, would read both alike."""
    in_l1 = measure_read_latency(16 << 10)
    in_memory = measure_read_latency(256 << 20)
    assert 0 < in_l1 < in_memory / 5


def test_latency_probe_refuses_what_it_cannot_measure() -> None:
    assert lib.col_measure_read_latency(64, 1) == 0.0        # one line: no chain
    assert lib.col_measure_read_latency(1 << 20, 0) == 0.0   # no pass
    with pytest.raises(ColibriError, match="latency probe failed"):
        measure_read_latency(64)
