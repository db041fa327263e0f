"""Recipes with lambdas, local functions and closures under every start method.

``spawn`` (macOS's default) and ``forkserver`` (Linux's from Python 3.14) send the
recipe pickled; it goes by value (cloudpickle), so the stream and every state are the
ones ``fork`` gives. What cannot travel is refused when the Loader is made, naming the step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from subprocess_helpers import ROOT

import datapipes as dp

METHODS = ["fork", "spawn", "forkserver"]


def recipe() -> dp.DataPipe[Any]:
    offset = 1000  # a closure over a local value

    def tag(x: int) -> dict[str, int]:  # a local function
        return {"x": x, "tagged": x + offset}

    return dp.range(40).shuffle().map(lambda x: x * 3).map(tag).filter(lambda r: r["x"] % 2 == 0)


def run(method: str, stop_after: int) -> tuple[list[Any], dict[str, Any], list[Any]]:
    """The first ``stop_after`` items, the state then, and the rest after a resume in a
    new Loader (both with 2 workers started with ``method``)."""
    options: dict[str, Any] = {"num_workers": 2, "multiprocessing_context": method, "seed": 5}
    loader = dp.Loader(recipe(), **options)
    it = iter(loader)
    head = [next(it) for _ in range(stop_after)]
    state = loader.state_dict()
    loader.close()
    resumed = dp.Loader(recipe(), **options)
    resumed.load_state_dict(state)
    return head, state, list(resumed)


@pytest.mark.slow
def test_lambdas_and_closures_resume_exactly_under_every_start_method():
    by_method = {method: run(method, stop_after=7) for method in METHODS}
    head, state, rest = by_method["fork"]
    whole = list(dp.Loader(recipe(), num_workers=2, seed=5))
    assert head + rest == whole and len(whole) == 20
    for method in ("spawn", "forkserver"):
        assert by_method[method] == (head, state, rest), method


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_lock_in_a_step_is_refused_naming_the_step(method: str):
    lock = threading.Lock()
    pipe = dp.range(4).map(abs).filter(lambda x, held=lock: x >= 0).batch(2)
    with pytest.raises(TypeError, match=r"its step \.filter\(.*cannot be pickled.*lock"):
        dp.Loader(pipe, num_workers=1, multiprocessing_context=method)
    dp.Loader(pipe, num_workers=1, multiprocessing_context="fork")  # fork copies it instead


def test_an_open_file_in_a_step_is_refused_with_the_fix(tmp_path: Path):
    with open(tmp_path / "words.txt", "w") as file:
        pipe = dp.range(3).map(lambda x, out=file: x)
        with pytest.raises(TypeError, match=r"\.map\(.*create them inside the function"):
            dp.Loader(pipe, num_workers=2, multiprocessing_context="spawn")


def test_a_generator_in_a_step_is_refused():
    numbers = (n for n in range(3))
    pipe = dp.from_sequence([1, 2]).map(lambda x, extra=numbers: x)
    with pytest.raises(TypeError, match=r"'spawn' receive the recipe pickled.*\.map\("):
        dp.Loader(pipe, num_workers=1, multiprocessing_context="spawn")


def run_script(script: Path) -> subprocess.CompletedProcess[str]:
    """``python script`` as a user runs it (the script's folder first on its path)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env
    )


@pytest.mark.slow
def test_a_script_without_a_main_guard_is_told_what_to_add(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(
        "import datapipes as dp\n"
        "list(dp.Loader(dp.range(4), num_workers=1, multiprocessing_context='spawn'))\n"
    )
    done = run_script(script)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("nodes.workers.dataloader.WorkerDiedError"), done.stderr[-2000:]
    assert "run the Loader under `if __name__ == '__main__':`" in last


@pytest.mark.slow
def test_a_script_function_over_a_global_lock_still_goes_by_name(tmp_path: Path):
    """What the standard pickle takes goes as it always did: a function of the script by
    name (the workers import the script again), not by value with its unpicklable globals."""
    script = tmp_path / "train.py"
    script.write_text(
        "import threading\n"
        "import datapipes as dp\n"
        "LOCK = threading.Lock()\n"
        "def double(x):\n"
        "    with LOCK:\n"
        "        return 2 * x\n"
        "if __name__ == '__main__':\n"
        "    pipe = dp.range(6).map(double)\n"
        "    loader = dp.Loader(pipe, num_workers=2, multiprocessing_context='spawn')\n"
        "    print(sorted(loader))\n"
    )
    done = run_script(script)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str([0, 2, 4, 6, 8, 10])


@pytest.mark.skipif(
    not os.environ.get("DATAPIPES_TEST_START_METHOD"), reason="no start method forced"
)
def test_a_forced_start_method_is_what_the_workers_use():
    """DATAPIPES_TEST_START_METHOD (tests/conftest.py) reaches this process, and the Loader's
    workers (no multiprocessing_context given) start that way."""
    from nodes.workers.dataloader import start_method

    forced = os.environ["DATAPIPES_TEST_START_METHOD"]
    assert start_method(None) == forced
    lock = threading.Lock()
    with pytest.raises(TypeError, match=f"started with '{forced}'"):
        dp.Loader(dp.range(2).map(lambda x, held=lock: x), num_workers=1)
