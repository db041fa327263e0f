"""The images_large benchmark skips a peer that cannot run once, with the reason: SPDL
without FFmpeg's libraries (or without SPDL) is one row, skipped before it runs, never a
traceback per sample."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "benchmarks"))  # appended: shadows nothing the other tests import
import images_large_bench  # noqa: E402
import images_large_peers as peers  # noqa: E402


def spdl_without_ffmpeg() -> dict[str, Any]:
    """Modules shaped like SPDL 0.8 on a machine without FFmpeg: importing works, the first
    decode raises what SPDL raises then (its message, shortened)."""

    def load_image(data: bytes) -> Any:
        raise RuntimeError(
            'Failed to import libspdl. "spdl.io.lib._spdl_ffmpeg9: libavutil.so.60: cannot '
            'open shared object file: No such file or directory", ... Enable DEBUG logging.'
        )

    io = types.ModuleType("spdl.io")
    io.load_image = load_image  # type: ignore[attr-defined]
    io.to_numpy = lambda frames: frames  # type: ignore[attr-defined]
    pipeline = types.ModuleType("spdl.pipeline")
    pipeline.PipelineBuilder = object  # type: ignore[attr-defined]
    spdl = types.ModuleType("spdl")
    spdl.io, spdl.pipeline = io, pipeline  # type: ignore[attr-defined]
    return {"spdl": spdl, "spdl.io": io, "spdl.pipeline": pipeline}


@pytest.fixture
def fresh_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "_SPDL_PROBED", [])


def test_spdl_without_ffmpeg_is_one_row_skipped_with_the_reason(monkeypatch, fresh_probe):
    for name, module in spdl_without_ffmpeg().items():
        monkeypatch.setitem(sys.modules, name, module)
    reason = peers.spdl_unavailable()
    assert reason is not None
    assert reason.startswith("SPDL cannot decode: RuntimeError: Failed to import libspdl")
    assert "apt-get install ffmpeg" in reason and "docs/benchmarks.md" in reason
    for quick in (True, False):
        rows = [name for name, _, _ in images_large_bench.contenders(quick)]
        assert [name for name in rows if name.startswith("SPDL")] == ["SPDL thread pipeline"]
    with pytest.raises(RuntimeError, match="SPDL cannot decode") as raised:
        peers.spdl_pipeline(["unused.tar"], 2, 8)  # raises at once: nothing is read
    assert "\n" not in str(raised.value)  # one line in the report


def test_spdl_not_installed_says_so(monkeypatch, fresh_probe):
    monkeypatch.setitem(sys.modules, "spdl", None)  # what an absent package imports as
    monkeypatch.setitem(sys.modules, "spdl.io", None)
    reason = peers.spdl_unavailable()
    assert reason is not None and reason.startswith("spdl"), reason
    assert "not installed" in reason and "pip install spdl" in reason
