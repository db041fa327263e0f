"""Decoding audio fields through soundfile (libsndfile): a float32 tensor and the sample rate.

``decode_audio(data)`` returns ``(waveform, sample_rate)``: ``waveform`` is a
``float32`` tensor shaped ``(channels, frames)``, integer PCM scaled to
``[-1, 1)``, and ``sample_rate`` an ``int``; the same form as
``torchaudio.load`` and webdataset's ``torch_audio`` handler, so code written
for either works unchanged. soundfile is an optional extra
(``pip install 'datapipes-torch[audio]'``), imported on the first audio field.

A cut file is an error, not a shorter clip: libsndfile reads what is there
of a truncated WAV, AIFF, AU, CAF, W64 or RF64 file (it notes the header's
larger sizes in its log), of an MP3 with a frame count in its header, and
finds no frames at all in an Ogg stream without its last page.
"""

from __future__ import annotations

import io
import re
from typing import Any

import torch

# Extensions whose files the libsndfile bundled with soundfile reads from memory (checked for
# every one in tests/media/test_audio.py). Not m4a/aac/wma: libsndfile has no decoder for them.
AUDIO_EXTENSIONS = (
    "wav",
    "flac",
    "ogg",
    "oga",
    "opus",
    "mp3",
    "aiff",
    "aif",
    "au",
    "caf",
    "w64",
    "rf64",
)

_MISSING = (
    "decoding audio fields ({extensions}) needs soundfile: "
    "pip install 'datapipes-torch[audio]' (or soundfile); or leave audio fields as bytes "
    "with .decode(decoders={{'wav': None, 'flac': None, ...}}) for the extensions you have"
)

# libsndfile's log line for a chunk whose header size exceeds the bytes there, e.g.
# "data : 32000 (should be 15978)" or "SSND : 32008 (should be 15981)".
_SIZE_MISMATCH = re.compile(r"^\s*(\S[^:\n]*?)\s*:\s*(\d+) \(should be (\d+)\)", re.MULTILINE)
_PAST_END = re.compile(r"Chunk size (\d+) > file length (\d+)")
# Sizes a writer that could not seek back (a pipe) leaves in the header: "unknown".
_UNKNOWN_SIZES = {0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF}


def decode_audio(data: bytes) -> tuple[torch.Tensor, int]:
    """``(waveform, sample_rate)`` of an audio file's bytes (any format libsndfile reads).

    ``waveform`` is ``float32``, shaped ``(channels, frames)`` (mono files
    too: ``(1, frames)``); the format is found from the bytes, not the
    field's extension. A truncated or damaged file raises ``ValueError``
    (soundfile's own errors for what it cannot open).
    """
    soundfile = _soundfile()
    if data[:4] == b"OggS":
        _check_ogg_pages(data)
    with soundfile.SoundFile(io.BytesIO(data)) as f:
        _check_log(f.extra_info)
        declared, sample_rate = f.frames, f.samplerate
        frames = f.read(dtype="float32", always_2d=True)
    if len(frames) < declared:
        raise ValueError(
            f"truncated audio: the header declares {declared} frames, the data holds {len(frames)}"
        )
    # soundfile gives (frames, channels); channels first, contiguous, as torchaudio does.
    return torch.from_numpy(frames.T.copy()), int(sample_rate)


def _soundfile() -> Any:
    try:
        import soundfile
    except ImportError as error:
        # An ImportError passes through decode(), so a missing extra is never a skipped record.
        raise ImportError(_MISSING.format(extensions=", ".join(AUDIO_EXTENSIONS))) from error
    return soundfile


def _check_log(log: str) -> None:
    """Refuse a file whose header promises more bytes than there are (libsndfile's log)."""
    for match in _SIZE_MISMATCH.finditer(log):
        declared, present = int(match[2]), int(match[3])
        # One byte of slack: a chunk of odd size may lack its pad byte at the very end.
        if declared not in _UNKNOWN_SIZES and declared > present + 1:
            raise ValueError(
                f"truncated audio: the header gives {match[1]!r} {declared} bytes, the file "
                f"holds {present}"
            )
    past_end = _PAST_END.search(log)
    if past_end:
        raise ValueError(
            f"truncated or damaged audio: a chunk of {past_end[1]} bytes in a file of {past_end[2]}"
        )


def _check_ogg_pages(data: bytes) -> None:
    """An Ogg stream must be whole pages to its end, the last one marked end-of-stream."""
    position, flags = 0, 0
    while position < len(data):
        header_end = position + 27
        if data[position : position + 4] != b"OggS" or header_end > len(data):
            raise ValueError(f"damaged or truncated Ogg stream: no page header at byte {position}")
        segments = data[position + 26]
        lacing = data[header_end : header_end + segments]
        flags = data[position + 5]
        position = header_end + segments + sum(lacing)
        if len(lacing) < segments or position > len(data):
            raise ValueError(
                f"truncated Ogg stream: its last page needs {position} bytes, the file has "
                f"{len(data)}"
            )
    if not flags & 0x04:
        raise ValueError(
            "truncated Ogg stream: the last page is not marked end-of-stream (pages are missing)"
        )
