"""A threaded decode imports its image libraries once, before its threads start.

Two pool threads importing Pillow (and its plugins) or simplejpeg at once
race; the build, in the thread that builds the pipeline, imports them first.
Checked in a fresh interpreter, where nothing has imported them yet.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from jpeg_fixtures import jpeg_bytes, natural_image
from subprocess_helpers import run_python

CODE = """
import json, sys, threading

import datapipes as dp

before = [m for m in ("PIL.Image", "simplejpeg") if m in sys.modules]
seen = {}  # what was imported when the first pool thread started
start = threading.Thread.start

def recording_start(thread):
    if thread.name.startswith("datapipes-map") and not seen:
        seen.update(
            pil="PIL.Image" in sys.modules,
            jpeg_plugin="PIL.JpegImagePlugin" in sys.modules,
            simplejpeg="simplejpeg" in sys.modules,
        )
    return start(thread)

threading.Thread.start = recording_start
pipe = dp.files(sys.argv[1]).read_tar().decode(image_backend=sys.argv[2])
pipe = pipe.random_resized_crop(16, num_threads=2)
items = list(dp.Loader(pipe))
print(json.dumps({"items": len(items), "before": before, "seen": seen}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pillow", "simplejpeg"])
def test_threaded_decode_imports_its_backend_before_its_threads_start(tmp_path: Path, backend: str):
    if backend == "simplejpeg":
        pytest.importorskip("simplejpeg")
    path = tmp_path / "images.tar"
    image = jpeg_bytes(natural_image(48, 64))
    with tarfile.open(path, "w") as tar:
        for j in range(8):
            info = tarfile.TarInfo(f"s{j}.jpg")
            info.size = len(image)
            tar.addfile(info, io.BytesIO(image))
    out = json.loads(run_python(CODE, str(path), backend).splitlines()[-1])
    assert out["items"] == 8
    assert out["before"] == []  # a fresh interpreter: the decode's build imports them
    expected = {"pil": True, "jpeg_plugin": True, "simplejpeg": backend == "simplejpeg"}
    assert out["seen"] == expected
