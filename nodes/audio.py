"""Decoding audio fields through soundfile (libsndfile): a float32 tensor and the sample rate.

``decode_audio(data)`` returns ``(waveform, sample_rate)``: ``waveform`` is a
``float32`` tensor shaped ``(channels, frames)``, integer PCM scaled to
``[-1, 1)``, and ``sample_rate`` an ``int``; the same form as
``torchaudio.load`` and webdataset's ``torch_audio`` handler, so code written
for either works unchanged. soundfile is an optional extra
(``pip install 'datapipes-torch[audio]'``), imported on the first audio field.
"""

from __future__ import annotations

import io

import torch

# Extensions whose files the libsndfile bundled with soundfile reads from memory (checked for
# every one in tests/test_audio.py). Not m4a/aac/wma: libsndfile has no decoder for them.
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


def decode_audio(data: bytes) -> tuple[torch.Tensor, int]:
    """``(waveform, sample_rate)`` of an audio file's bytes (any format libsndfile reads).

    ``waveform`` is ``float32``, shaped ``(channels, frames)`` (mono files
    too: ``(1, frames)``); the format is found from the bytes, not the
    field's extension.
    """
    try:
        import soundfile
    except ImportError as error:
        # An ImportError passes through decode(), so a missing extra is never a skipped record.
        raise ImportError(_MISSING.format(extensions=", ".join(AUDIO_EXTENSIONS))) from error
    frames, sample_rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    # soundfile gives (frames, channels); channels first, contiguous, as torchaudio does.
    return torch.from_numpy(frames.T.copy()), int(sample_rate)
