"""The strict safetensors reader (numformer.safetensors_reader) and the checkpoint folder reader
(interop.hf.read_safetensors): every dtype through one path, and one line naming the file and what is wrong
for each kind of damage (header length, JSON, dtype, shape, aliased offsets, gaps, overlaps, trailing bytes,
shard names outside the folder), also from `numformer import-hf` (exit 2)."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from numformer.interop import hf
from numformer.safetensors_reader import read_safetensors_file

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def write_raw(path, header, data):
    """A safetensors file from a header dict and the data bytes, exactly as given (no checks)."""
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def two_tensors(path, **edits):
    """ln_f.weight (4 float32 at 0..16) and ln_f.bias (4 float32 at 16..32); ``edits`` replace header entries."""
    header = {"__metadata__": {"format": "pt"},
              "ln_f.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
              "ln_f.bias": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}
    data = edits.pop("data", np.arange(8, dtype="<f4").tobytes())
    for name, entry in edits.items():
        header[name.replace("__", ".")] = entry
    return write_raw(path, header, data)


@pytest.mark.parametrize("dtype", ["<f8", "<f4", "<f2", "<i8", "<i4", "<i2", "i1", "u1", "<u2", "<u4", "<u8", "?"])
def test_every_numpy_dtype_reads_as_the_library_writes_it(tmp_path, dtype):
    a = (np.arange(12).reshape(3, 4) % 2 if dtype == "?" else np.arange(12).reshape(3, 4)).astype(dtype)
    safetensors_numpy.save_file({"a": a, "empty": np.zeros((0, 5), dtype), "s": a[0, :1].copy()},
                                tmp_path / "m.safetensors")
    got = read_safetensors_file(tmp_path / "m.safetensors")
    assert set(got) == {"a", "empty", "s"}
    assert got["a"].dtype == np.dtype(dtype) and got["a"].dtype.isnative
    np.testing.assert_array_equal(got["a"], a)
    assert got["empty"].shape == (0, 5)


def test_bfloat16_is_read_as_float32_exactly(tmp_path):
    values = np.array([1.0, -2.5, 3.140625, 1e-3, 65280.0], np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")
    write_raw(tmp_path / "b.safetensors", {"x": {"dtype": "BF16", "shape": [5], "data_offsets": [0, 10]}},
              bf16.tobytes())
    got = read_safetensors_file(tmp_path / "b.safetensors")["x"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, (bf16.astype(np.uint32) << 16).view(np.float32))


DAMAGE = {
    "aliased offsets": (dict(ln_f__bias={"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                             data=np.arange(4, dtype="<f4").tobytes()),
                        r"tensor 'ln_f\.(bias|weight)' \(bytes 0\.\.16\) overlaps tensor 'ln_f\.(weight|bias)'"),
    "overlap": (dict(ln_f__bias={"dtype": "F32", "shape": [4], "data_offsets": [12, 28]},
                     data=np.arange(7, dtype="<f4").tobytes()),
                r"tensor 'ln_f\.bias' \(bytes 12\.\.28\) overlaps tensor 'ln_f\.weight'"),
    "gap": (dict(ln_f__bias={"dtype": "F32", "shape": [4], "data_offsets": [20, 36]},
                 data=np.arange(9, dtype="<f4").tobytes()), r"a gap of 4 bytes before tensor 'ln_f\.bias'"),
    "trailing bytes": (dict(data=np.arange(9, dtype="<f4").tobytes()), r"4 trailing bytes after the last tensor"),
    "truncated data": (dict(data=np.arange(7, dtype="<f4").tobytes()),
                       r"tensor 'ln_f\.bias' ends at byte 32 but the file holds 28 bytes of data"),
    "offsets vs shape": (dict(ln_f__bias={"dtype": "F32", "shape": [3], "data_offsets": [16, 32]}),
                         r"tensor 'ln_f\.bias' \(F32, shape \[3\]\) needs 12 bytes but data_offsets "
                         r"\[16, 32\] hold 16"),
    "reversed offsets": (dict(ln_f__bias={"dtype": "F32", "shape": [4], "data_offsets": [32, 16]}),
                         r"data_offsets \[32, 16\], not \[begin, end\]"),
    "negative shape": (dict(ln_f__bias={"dtype": "F32", "shape": [-4], "data_offsets": [16, 32]}),
                       r"shape \[-4\], not a list of non-negative integers"),
    "unknown dtype": (dict(ln_f__bias={"dtype": "F9_X", "shape": [16], "data_offsets": [16, 32]}),
                      r"dtype 'F9_X'; numformer reads"),
    # found by tests/test_fuzz_read_files.py at NUMFORMER_FUZZ_EXAMPLES=300: a TypeError (unhashable) before
    "dtype a list": (dict(ln_f__bias={"dtype": ["F32"], "shape": [4], "data_offsets": [16, 32]}),
                     r"dtype \['F32'\]; numformer reads"),
    "dtype an object": (dict(ln_f__bias={"dtype": {"F32": 1}, "shape": [4], "data_offsets": [16, 32]}),
                        r"dtype \{'F32': 1\}; numformer reads"),
    "missing field": (dict(ln_f__bias={"dtype": "F32", "shape": [4]}),
                      r"tensor 'ln_f\.bias' is not described by exactly dtype, shape and data_offsets"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_header_is_one_line_naming_the_file_and_the_damage(tmp_path, kind):
    edits, match = DAMAGE[kind]
    path = two_tensors(tmp_path / "model.safetensors", **edits)
    with pytest.raises(ValueError, match=match) as e:
        read_safetensors_file(path)
    assert str(e.value).startswith(f"{path} is damaged: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("dtype,kind", [("F8_E4M3", "an 8-bit float"), ("F8_E5M2", "an 8-bit float"),
                                        ("F4", "a 4-bit float"), ("C64", "a complex number")])
def test_a_dtype_safetensors_defines_but_numformer_does_not_read_is_named_unsupported(tmp_path, dtype, kind):
    """An FP8 tensor (as transformers saves a float8_e4m3fn weight) is no damage: one line naming the tensor, its
    dtype and what to use instead (before: "is damaged ... download it again")."""
    path = two_tensors(tmp_path / "model.safetensors",
                       ln_f__bias={"dtype": dtype, "shape": [16], "data_offsets": [16, 32]})
    with pytest.raises(ValueError) as e:
        read_safetensors_file(path)
    line = str(e.value)
    assert line.startswith(f"{path}: tensor 'ln_f.bias' has dtype '{dtype}' ({kind}), which numformer does not "
                           f"support: it reads F32, F64, F16 and BF16 weights; "), line
    assert "damaged" not in line and "download it again" not in line and "\n" not in line


@pytest.mark.parametrize("raw,match", [
    (b"\x10\x00\x00", r"3 bytes, shorter than the 8-byte header length"),
    (struct.pack("<Q", 1000) + b"{}", r"the header length 1000 exceeds the 2 bytes after it"),
    (struct.pack("<Q", 9) + b"{not json", r"the header is not JSON"),
    (struct.pack("<Q", 2) + b"[]", r"the header is not a JSON object"),
    (struct.pack("<Q", 2) + b"\xff\xfe", r"the header is not JSON"),
])
def test_damaged_header_length_or_json(tmp_path, raw, match):
    path = tmp_path / "model.safetensors"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=match):
        read_safetensors_file(path)


def test_repeated_tensor_name_in_the_header(tmp_path):
    entry = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    raw = f'{{"a": {entry}, "a": {entry}}}'.encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x00" * 4)
    with pytest.raises(ValueError, match=r"the header names \['a'\] more than once"):
        read_safetensors_file(path)


# -- folders and shards -------------------------------------------------------------------------------------------
def sharded_folder(tmp_path, weight_map=None):
    folder = tmp_path / "model"
    folder.mkdir()
    safetensors_numpy.save_file({"a": np.ones(3, np.float32)}, folder / "model-00001-of-00002.safetensors")
    safetensors_numpy.save_file({"b": np.zeros(2, np.float32)}, folder / "model-00002-of-00002.safetensors")
    weight_map = weight_map or {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def test_shards_are_read_through_the_index(tmp_path):
    got = hf.read_safetensors(sharded_folder(tmp_path))
    assert sorted(got) == ["a", "b"] and got["a"].tolist() == [1.0] * 3


@pytest.mark.parametrize("name", ["../other.safetensors", "/etc/passwd", "sub/../../x.safetensors",
                                  "C:\\x.safetensors", "..\\x.safetensors"])
def test_shard_path_outside_the_folder_is_refused(tmp_path, name):
    safetensors_numpy.save_file({"b": np.zeros(2, np.float32)}, tmp_path / "other.safetensors")
    folder = sharded_folder(tmp_path, {"a": "model-00001-of-00002.safetensors", "b": name})
    with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json names the shard .* outside the folder") as e:
        hf.read_safetensors(folder)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("weight_map,match", [
    ({"a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"},
     r"holds tensor 'a', but model\.safetensors\.index\.json places it in 'model-00002-of-00002"),
    ({"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}, r"lists tensors no shard holds: \['c'\]"),
    ({"a": "model-00001-of-00002.safetensors", "b": "model-00003-of-00002.safetensors"},
     r"model-00003-of-00002\.safetensors is listed in model\.safetensors\.index\.json but missing"),
])
def test_index_and_shards_must_agree(tmp_path, weight_map, match):
    with pytest.raises(ValueError, match=match):
        hf.read_safetensors(sharded_folder(tmp_path, weight_map))


def test_a_tensor_the_index_does_not_list_is_named_so(tmp_path):
    """A shard holding a tensor its index's weight_map omits: one line saying the index does not list it (before:
    "index.json places it in None")."""
    folder = sharded_folder(tmp_path)
    safetensors_numpy.save_file({"b": np.zeros(2, np.float32), "c": np.ones(3, np.float32)},
                                folder / "model-00002-of-00002.safetensors")
    with pytest.raises(ValueError) as e:
        hf.read_safetensors(folder)
    assert str(e.value) == (f"{folder / 'model-00002-of-00002.safetensors'} holds tensor 'c', which "
                            f"model.safetensors.index.json does not list (its weight_map names the shard of every "
                            f"tensor); download the index and the shards again")


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    folder = sharded_folder(tmp_path)
    safetensors_numpy.save_file({"b": np.zeros(2, np.float32), "a": np.ones(3, np.float32)},
                                folder / "model-00002-of-00002.safetensors")
    with pytest.raises(ValueError, match=r"holds tensor 'a', which model-00001-of-00002\.safetensors also holds"):
        hf.read_safetensors(folder)


def test_import_hf_of_a_damaged_file_is_one_line_and_exit_2(tmp_path, capsys):
    pytest.importorskip("transformers")
    from test_interop_hf import SHAPES, make_hf, save_tokenizer

    from numformer.cli import main

    folder, _ = make_hf(tmp_path, **SHAPES["default_ff"])
    save_tokenizer(folder)
    path = folder / "model.safetensors"
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])          # ln_f.bias aliased onto ln_f.weight's bytes
    header["transformer.ln_f.bias"]["data_offsets"] = header["transformer.ln_f.weight"]["data_offsets"]
    write_raw(path, header, blob[8 + n:])
    capsys.readouterr()
    assert main(["import-hf", str(folder), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.safetensors is damaged: a gap of 64 bytes before tensor" in err[0], err


# -- the writer ------------------------------------------------------------------------------------------------
def test_the_writer_s_files_read_back_in_safetensors_and_here(tmp_path):
    """safetensors_pieces writes what the safetensors library and numformer's strict reader both read back
    exactly: every dtype numformer writes, empty and 0-d tensors, a transposed and a big-endian array, the
    metadata; the data starts on an 8-byte boundary; a large tensor's piece is a view of the array itself."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    from numformer.run_files import write_atomic
    from numformer.safetensors_writer import DTYPE_NAMES, safetensors_pieces

    rng = np.random.default_rng(0)
    tensors = {f"t_{d.name}": (rng.standard_normal((3, 5)) * 50).astype(d) for d in DTYPE_NAMES}
    tensors.update(empty=np.zeros((0, 4), np.float32), scalar=np.array(2.5), transposed=np.arange(12.).reshape(3, 4).T,
                   big_endian=np.arange(6, dtype=">i4"), large=rng.standard_normal(1 << 16).astype(np.float32))
    pieces = list(safetensors_pieces(tensors, {"format": "pt", "step": 3}))
    assert any(np.shares_memory(np.frombuffer(piece, np.uint8), tensors["large"]) for piece in pieces[1:])
    write_atomic(tmp_path / "w.safetensors", iter(pieces))
    raw = (tmp_path / "w.safetensors").read_bytes()
    assert (8 + int.from_bytes(raw[:8], "little")) % 8 == 0
    theirs, ours = load_file(tmp_path / "w.safetensors"), read_safetensors_file(tmp_path / "w.safetensors")
    for name, a in tensors.items():
        for got in (theirs[name], ours[name]):
            assert got.shape == a.shape and got.dtype == a.dtype.newbyteorder("=")
            np.testing.assert_array_equal(got, a)
    with safe_open(str(tmp_path / "w.safetensors"), framework="np") as f:
        assert f.metadata() == {"format": "pt", "step": "3"}
    with pytest.raises(ValueError, match=r"tensor 'c' has dtype complex128, which safetensors cannot hold"):
        list(safetensors_pieces({"c": np.zeros(2, complex)}))
