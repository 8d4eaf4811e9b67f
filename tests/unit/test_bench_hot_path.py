"""The bench's in-process measurement runs against the package as it is (a renamed internal
once broke it silently: the bench is not run by CI), and what it measures is recorded."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_hot_path_measurement_runs_and_records_every_call() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("ddpdoctor_bench_overhead",
                                                      BENCH / "overhead.py")
        assert spec is not None and spec.loader is not None
        overhead = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = overhead  # its dataclasses look their module up
        spec.loader.exec_module(overhead)
    finally:
        sys.path.remove(str(BENCH))
    result = overhead.hot_path_us(n=400)
    # Recording does work the bare backend call does not: the wrapper is really in the path.
    assert 0 < result.plain_us < result.recorded_us
    assert result.cpu_us > 0 and result.recorded_wall_us > 0 and result.module_loop_us > 0
