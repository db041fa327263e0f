"""Audio fields through .decode(): soundfile's libsndfile, a float32 (channels, frames) tensor
and the sample rate, checked on generated sine waves in every registered format; lossless
formats exactly, lossy ones by correlation and frequency peak; corrupt audio is a bad record;
a missing soundfile names the extra and is never skipped as a bad record."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import datapipes as dp
from nodes.errors import BadRecordError
from nodes.media.audio import AUDIO_EXTENSIONS, decode_audio

sf = pytest.importorskip("soundfile", reason="audio decoding needs the [audio] extra")

RATE = 16_000
FREQ = 440.0


def sine(channels: int, frames: int = RATE // 4, rate: int = RATE) -> np.ndarray:
    """A (frames, channels) float32 sine wave, each channel at its own amplitude."""
    t = np.arange(frames) / rate
    wave = np.sin(2 * np.pi * FREQ * t)
    return np.stack([wave * (0.6 / (c + 1)) for c in range(channels)], axis=1).astype(np.float32)


def encode(samples: np.ndarray, fmt: str, subtype: str | None, rate: int = RATE) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def pcm16(samples: np.ndarray) -> np.ndarray:
    """``samples`` quantized to int16: written as such, a PCM_16 file holds exactly these."""
    return np.round(samples * 32767).astype(np.int16)


def as_read(quantized: np.ndarray) -> torch.Tensor:
    """int16 (frames, channels) as the decoder returns it: (channels, frames) / 32768."""
    return torch.from_numpy((quantized.astype(np.float32) / 32768).T.copy())


# (extension, libsndfile format, subtype, lossless); one row per registered extension.
FORMATS = [
    ("wav", "WAV", "PCM_16", True),
    ("flac", "FLAC", "PCM_16", True),
    ("ogg", "OGG", "VORBIS", False),
    ("oga", "OGG", "VORBIS", False),
    ("opus", "OGG", "OPUS", False),
    ("mp3", "MP3", "MPEG_LAYER_III", False),
    ("aiff", "AIFF", "PCM_16", True),
    ("aif", "AIFF", "PCM_16", True),
    ("au", "AU", "PCM_16", True),
    ("caf", "CAF", "PCM_16", True),
    ("w64", "W64", "PCM_16", True),
    ("rf64", "RF64", "PCM_16", True),
]


def test_every_registered_extension_is_covered_here():
    assert sorted(ext for ext, *_ in FORMATS) == sorted(AUDIO_EXTENSIONS)


def decode_one(field: str, data: bytes, **decode_options: Any) -> Any:
    sample = {"__key__": "s0", "__url__": "mem", field: data}
    (out,) = dp.Loader(dp.from_sequence([sample]).decode(**decode_options))
    return out[field]


@pytest.mark.parametrize(("ext", "fmt", "subtype", "lossless"), FORMATS)
@pytest.mark.parametrize("channels", [1, 2])
def test_sine_decodes_to_channels_by_frames_and_its_rate(ext, fmt, subtype, lossless, channels):
    rate = 48_000 if subtype == "OPUS" else RATE  # opus runs at 48 kHz (8-48 kHz inputs)
    written = sine(channels, frames=rate // 4, rate=rate)
    stored = pcm16(written) if lossless else written
    waveform, sample_rate = decode_one(ext, encode(stored, fmt, subtype, rate))
    assert isinstance(waveform, torch.Tensor) and waveform.dtype == torch.float32
    assert isinstance(sample_rate, int) and sample_rate == rate
    assert waveform.shape[0] == channels and waveform.is_contiguous()
    if lossless:
        assert waveform.shape == (channels, len(written))
        assert torch.equal(waveform, as_read(stored))
        return
    # Lossy: the codec may pad or trim a few ms; each channel must still be the same sine.
    got = waveform.numpy()
    frames = min(got.shape[1], len(written))
    assert abs(got.shape[1] - len(written)) < rate // 10
    for c in range(channels):
        expected = written[:, c]
        spectrum = np.abs(np.fft.rfft(got[c, :frames]))
        peak = np.fft.rfftfreq(frames, 1 / rate)[spectrum.argmax()]
        assert abs(peak - FREQ) <= 2 * rate / frames  # within two frequency bins
        # The best alignment over small lags (encoder delay), then a correlation close to 1.
        best = max(
            np.corrcoef(got[c, lag : lag + frames // 2], expected[: frames // 2])[0, 1]
            for lag in range(0, 1200, 1)
        )
        assert best > 0.95, (ext, c, best)
        rms = np.sqrt(np.mean(got[c, :frames] ** 2))
        assert abs(rms - np.sqrt(np.mean(expected**2))) < 0.1 * np.abs(expected).max()


def test_float_wav_is_exact():
    written = sine(2)
    waveform, rate = decode_audio(encode(written, "WAV", "FLOAT"))
    assert rate == RATE and torch.equal(waveform, torch.from_numpy(written.T.copy()))


def test_integer_pcm_is_scaled_as_torchaudio_scales_it():
    """int16 full scale: -32768 reads -1.0 and 32767 reads 32767/32768 (libsndfile's and
    torchaudio's normalisation), not a value rescaled to hit +1.0."""
    extremes = np.array([[-32768], [32767], [0], [1]], dtype=np.int16)
    buffer = io.BytesIO()
    sf.write(buffer, extremes, RATE, format="WAV", subtype="PCM_16")
    waveform, _ = decode_audio(buffer.getvalue())
    assert waveform.tolist() == [[-1.0, 32767 / 32768, 0.0, 1 / 32768]]


def test_audio_batches_collate_into_waveforms_and_rates():
    """The (waveform, rate) tuple collates field by field, as torchaudio-style code expects."""
    samples = [
        {"__key__": f"s{i}", "wav": encode(sine(2) * (i + 1) / 3, "WAV", "PCM_16")}
        for i in range(2)
    ]
    (batch,) = dp.Loader(dp.from_sequence(samples).decode().batch(2))
    waveforms, rates = batch["wav"]
    assert waveforms.shape == (2, 2, RATE // 4) and rates.tolist() == [RATE, RATE]


def test_audio_fields_read_from_a_tar_shard(tmp_path: Path):
    """Through read_tar, with the key/field rule, upper-case extensions and a compressed
    field (webdataset's ``wav.gz``) included."""
    import gzip

    stereo, mono = pcm16(sine(2)), pcm16(sine(1))
    path = tmp_path / "audio.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in [
            ("a.WAV", encode(stereo, "WAV", "PCM_16")),
            ("a.flac", encode(mono, "FLAC", "PCM_16")),
            ("b.speech.wav.gz", gzip.compress(encode(mono, "WAV", "PCM_16"))),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    a, b = dp.Loader(dp.files(str(path)).read_tar().decode())
    assert sorted(a) == ["__key__", "__url__", "flac", "wav"]
    assert torch.equal(a["wav"][0], as_read(stereo)) and a["wav"][1] == RATE
    assert torch.equal(a["flac"][0], as_read(mono))
    assert b["__key__"] == "b" and torch.equal(b["speech.wav.gz"][0], as_read(mono))


def test_audio_can_be_left_as_bytes():
    data = encode(sine(1), "WAV", "PCM_16")
    assert decode_one("wav", data, decoders={"wav": None}) == data


def corrupt_cases() -> dict[str, bytes]:
    good = encode(sine(1), "FLAC", "PCM_16")
    return {
        "garbage": b"this is no audio file at all" * 10,
        "empty": b"",
        "cut header": encode(sine(1), "WAV", "PCM_16")[:20],
        "flac without its stream info": good[:4] + bytes(len(good) - 4),
    }


@pytest.mark.parametrize("case", sorted(corrupt_cases()))
def test_corrupt_audio_is_a_bad_record_naming_url_key_and_field(case):
    data = corrupt_cases()[case]
    samples = [
        {"__key__": "good", "__url__": "shard.tar", "cls": b"1"},
        {"__key__": "broken", "__url__": "shard.tar", "cls": b"2", "voice.flac": data},
        {"__key__": "after", "__url__": "shard.tar", "cls": b"3"},
    ]
    with pytest.raises(BadRecordError) as raised:
        list(dp.Loader(dp.from_sequence(samples).decode()))
    message = str(raised.value)
    assert "shard.tar" in message and "'broken'" in message and "'voice.flac'" in message
    assert "cannot decode" in message

    loader = dp.Loader(dp.from_sequence(samples).decode(on_error="skip"))
    with pytest.warns(UserWarning):
        kept = [s["__key__"] for s in loader]
    assert kept == ["good", "after"]
    assert list(loader.skipped().values()) == [1]


@pytest.mark.parametrize(("ext", "fmt", "subtype", "lossless"), FORMATS)
@pytest.mark.parametrize("kept", [0.5, 0.99])
def test_a_cut_file_is_an_error_not_a_shorter_clip(ext, fmt, subtype, lossless, kept):
    """libsndfile alone reads a cut WAV/AIFF/AU/CAF/W64/RF64/MP3 as a shorter clip and a cut
    Ogg stream as no frames at all; the decoder refuses them."""
    rate = 48_000 if subtype == "OPUS" else RATE
    written = sine(2, frames=rate // 2, rate=rate)
    data = encode(pcm16(written) if lossless else written, fmt, subtype, rate)
    with pytest.raises(BadRecordError, match="cannot decode"):
        decode_one(ext, data[: int(len(data) * kept)])


def test_an_ogg_stream_cut_between_pages_is_refused():
    data = encode(sine(1, frames=RATE * 2), "OGG", "VORBIS")
    last_page = data.rfind(b"OggS")
    assert last_page > 0 and data[last_page + 5] & 0x04  # the end-of-stream page
    with pytest.raises(ValueError, match="not marked end-of-stream"):
        decode_audio(data[:last_page])


def test_complete_files_with_unusual_headers_still_decode():
    """A WAV streamed through a pipe (sizes left 0xFFFFFFFF: unknown), one with a chunk after
    its data, and empty files are whole files, not truncated ones."""
    quantized = pcm16(sine(1))
    wav = encode(quantized, "WAV", "PCM_16")
    assert wav[36:40] == b"data"
    unknown = 0xFFFFFFFF.to_bytes(4, "little")
    streamed = wav[:4] + unknown + wav[8:40] + unknown + wav[44:]
    trailing = wav + b"LIST" + (4).to_bytes(4, "little") + b"abcd"
    for data in (streamed, trailing):
        waveform, rate = decode_audio(data)
        assert rate == RATE and torch.equal(waveform, as_read(quantized))
    for fmt, subtype in (("WAV", "PCM_16"), ("OGG", "VORBIS")):  # (libsndfile: 0-byte FLAC)
        waveform, rate = decode_audio(encode(np.zeros((0, 2), np.int16), fmt, subtype))
        assert waveform.shape == (2, 0) and rate == RATE


def test_missing_soundfile_names_the_extra_and_is_not_skipped(monkeypatch):
    """A None in sys.modules makes ``import soundfile`` fail for real, as when it is absent."""
    monkeypatch.setitem(sys.modules, "soundfile", None)
    data = encode(sine(1), "WAV", "PCM_16")
    samples = [{"__key__": "a", "__url__": "shard.tar", "wav": data}]
    for on_error in ("raise", "skip"):  # a setup error, never a skipped record
        with pytest.raises(ImportError) as raised:
            list(dp.Loader(dp.from_sequence(samples).decode(on_error=on_error)))
        message = str(raised.value)
        assert "datapipes-torch[audio]" in message and "soundfile" in message
        assert "decoders={'wav': None" in message
    # Left as bytes, nothing needs soundfile; samples without audio never import it.
    assert decode_one("wav", data, decoders={"wav": None}) == data
    assert decode_one("cls", b"7") == 7
