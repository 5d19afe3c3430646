"""GGUF headers are walked within the file's size before any reader allocates
(docs/reliability.md#bounded-readers): a header claiming more than the file holds is one line naming
the file, and the `gguf` reader is never reached; any damage to a real header is a UserError or a
clean pass, never another exception."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioareal.errors import UserError
from aioareal.models import gguf_convert, named
from aioareal.models.gguf_header import check_gguf_header
from aioareal.models.load_policy import resolve_source

pytest.importorskip("gguf")
from gguf_tiny import write_tiny_gguf  # noqa: E402

HEAD = b"GGUF" + struct.pack("<I", 3)


def string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


HOSTILE = {
    "uint8 array of 2^60": HEAD + struct.pack("<QQ", 0, 1) + string(b"a") + struct.pack("<IIQ", 9, 0, 1 << 60),
    "string array of 2^60": HEAD + struct.pack("<QQ", 0, 1) + string(b"a") + struct.pack("<IIQ", 9, 8, 1 << 60),
    "2^60 metadata entries": HEAD + struct.pack("<QQ", 0, 1 << 60),
    "2^60 tensors": HEAD + struct.pack("<QQ", 1 << 60, 0),
    "a 2^60-byte key": HEAD + struct.pack("<QQ", 0, 1) + struct.pack("<Q", 1 << 60),
    "nested arrays": HEAD + struct.pack("<QQ", 0, 1) + string(b"a") + struct.pack("<IIQ", 9, 9, 1) * 6 + b"\0" * 64,
    "a tensor past the end": HEAD + struct.pack("<QQ", 1, 0) + string(b"w") + struct.pack("<IQQIQ", 2, 1 << 30, 1 << 30,
                                                                                            0, 0),
}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("AIOAREAL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_header_claiming_more_than_the_file_holds_never_reaches_the_reader(case, tmp_path, cache_dir,
                                                                             monkeypatch):
    def reader_reached(path):
        raise AssertionError("the gguf reader was handed an unchecked header")

    monkeypatch.setattr(gguf_convert, "check_readable", reader_reached)
    path = tmp_path / "hostile.gguf"
    path.write_bytes(HOSTILE[case])
    with pytest.raises(UserError) as e:
        resolve_source(str(path))
    message = str(e.value)
    assert message.startswith(f"{path}: not a readable GGUF file (") and "\n" not in message
    assert len(message) < 300


def test_the_error_names_the_claim_and_where(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(HOSTILE["uint8 array of 2^60"])
    with pytest.raises(UserError, match=f"an array of {1 << 60} items claims {1 << 60} bytes, 0 left in the "
                                        "file at byte 49"):
        check_gguf_header(path)


def test_real_headers_pass(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    check_gguf_header(path)
    try:
        smollm2 = named.named_gguf("smollm2-135m-instruct")
    except UserError:
        smollm2 = None
    if smollm2 is not None:
        check_gguf_header(smollm2)  # 49k-token vocabulary, merges, a quantized tensor table


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path.read_bytes()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 4095), st.binary(min_size=1, max_size=8)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 5000)))
def test_damaged_headers_are_one_line_errors_or_pass(tiny_bytes, tmp_path, edits, cut):
    data = bytearray(tiny_bytes)
    for at, chunk in edits:
        data[at:at + len(chunk)] = chunk
    path = tmp_path / "damaged.gguf"
    path.write_bytes(bytes(data[:cut] if cut is not None else data))
    try:
        check_gguf_header(path)
    except UserError as e:
        assert "\n" not in str(e) and str(e).startswith(f"{path}: ")
