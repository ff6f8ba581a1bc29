"""The weight files vLLM's loader reads (vllm_releases/weight_files.py) and the tensor bytes kvwatch
counts from them (boundary/model_source.py): the selection as a table, the bytes from real
safetensors headers."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kvwatch.boundary.model_source import load_model_source
from kvwatch.vllm_releases.weight_files import index_name, index_weight_files, loaded_files

SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


@pytest.mark.parametrize("names, index, loaded", [
    (SHARDS, None, SHARDS),
    # Mistral-7B-Instruct-v0.3 ships sharded and consolidated copies: "auto" reads the consolidated one
    ([*SHARDS, "consolidated.safetensors"], ["consolidated.safetensors"], ["consolidated.safetensors"]),
    # an index keeps the files it names
    ([*SHARDS, "model.safetensors"], SHARDS, SHARDS),
    # safetensors first; .bin only without them
    (["model.safetensors", "pytorch_model.bin"], None, ["model.safetensors"]),
    (["pytorch_model.bin", "training_args.bin", "optimizer.pt"], None, ["pytorch_model.bin"]),
    (["model.pt"], None, ["model.pt"]),
    ([], None, []),
])
def test_the_files_vllm_loads(names: list[str], index: list[str] | None, loaded: list[str]) -> None:
    assert loaded_files(names, index) == loaded


@pytest.mark.parametrize("names, index", [
    (SHARDS, "model.safetensors.index.json"),
    ([*SHARDS, "consolidated.safetensors"], "consolidated.safetensors.index.json"),
])
def test_the_index_follows_the_format(names: list[str], index: str) -> None:
    assert index_name(names) == index


@pytest.mark.parametrize("parsed, files", [
    ({"weight_map": {"a": "x.safetensors", "b": "x.safetensors", "c": "y.safetensors"}}, ["x.safetensors", "y.safetensors"]),
    ({"weight_map": "nope"}, None),
    ([1, 2], None),
])
def test_the_index_names_its_files(parsed: object, files: list[str] | None) -> None:
    assert index_weight_files(parsed) == files


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> int:
    """A file in the safetensors format (an 8-byte little-endian header length, the JSON header,
    the tensors' bytes); returns the tensors' bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape, itemsize) in tensors.items():
        size = itemsize
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return offset


def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return tmp_path


def test_safetensors_count_their_tensors_and_a_duplicate_copy_none(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    a = write_safetensors(d / SHARDS[0], {"embed": ("BF16", [1000, 64], 2), "q": ("F8_E4M3", [64, 64], 1)})
    b = write_safetensors(d / SHARDS[1], {"lm_head": ("BF16", [1000, 64], 2)})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"embed": SHARDS[0], "q": SHARDS[0], "lm_head": SHARDS[1]}}))
    write_safetensors(d / "model.safetensors", {"all": ("BF16", [2000, 64], 2)})   # not in the index
    (d / "training_args.bin").write_bytes(b"\0" * 100)
    assert load_model_source(str(d)).weights_bytes == a + b == (1000 * 64 * 2) * 2 + 64 * 64


def test_a_header_that_does_not_parse_counts_as_the_file(tmp_path: Path) -> None:
    d = model_dir(tmp_path)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 12) + b"{not json!!}" + b"\0" * 40)
    assert load_model_source(str(d)).weights_bytes == 8 + 12 + 40
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 10**12) + b"{}")   # a length past the file
    assert load_model_source(str(d)).weights_bytes == 10


def test_a_file_the_real_library_writes_is_read_to_the_byte(tmp_path: Path) -> None:
    numpy = pytest.importorskip("numpy")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    d = model_dir(tmp_path)
    tensors = {"w": numpy.zeros((300, 128), dtype=numpy.float16), "b": numpy.zeros((77,), dtype=numpy.float32)}
    safetensors_numpy.save_file(tensors, str(d / "model.safetensors"))
    assert load_model_source(str(d)).weights_bytes == 300 * 128 * 2 + 77 * 4
