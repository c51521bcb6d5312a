"""pytorch_model.bin (torch.save's zip of a pickled state dict) loads as its safetensors twin:
the same logits bit for bit from `dcp run`, single file, sharded with an index, zip64, storages
shared between tensors; and every file dcp cannot read safely is refused by name, with nothing
of the pickle run. The files are written by torch itself (Debian's python3-torch)."""
import collections
import json
import os
import shutil
import struct
import subprocess
import zipfile

import pytest

torch = pytest.importorskip("torch")

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = collections.OrderedDict()
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + begin:8 + n + end]),
                                     dtype=DTYPES[t["dtype"]]).reshape(t["shape"]).clone()
    return out


def write_safetensors(path, tensors):
    names = {v: k for k, v in DTYPES.items()}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def shards(ckpt):
    """The safetensors files of a checkpoint, in order, each as its state dict."""
    files = sorted(f for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    return [(f, read_safetensors(os.path.join(ckpt, f))) for f in files]


def without_weights(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    return dst


def to_torch(src, dst, **save_kw):
    """`src`'s weights as pytorch_model.bin, or one .bin per shard and the index."""
    without_weights(src, dst)
    parts = shards(src)
    if len(parts) == 1:
        torch.save(parts[0][1], os.path.join(dst, "pytorch_model.bin"), **save_kw)
        return dst
    weight_map = {}
    for i, (_, sd) in enumerate(parts):
        name = "pytorch_model-%05d-of-%05d.bin" % (i + 1, len(parts))
        torch.save(sd, os.path.join(dst, name), **save_kw)
        weight_map.update({k: name for k in sd})
    with open(os.path.join(dst, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return dst


def rezip(path, compression=zipfile.ZIP_STORED, zip64=False):
    """The archive rewritten by Python's zipfile: another writer, optionally every record in
    zip64 form (as files past 4 GiB have them) or compressed."""
    with zipfile.ZipFile(path) as z:
        entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    limit = zipfile.ZIP64_LIMIT
    if zip64:
        zipfile.ZIP64_LIMIT = -1  # every size and offset "overflows": all written as zip64
    try:
        with zipfile.ZipFile(path, "w") as z:
            for name, data in entries:
                info = zipfile.ZipInfo(name)
                info.compress_type = compression
                with z.open(info, "w", force_zip64=zip64) as f:
                    f.write(data)
    finally:
        zipfile.ZIP64_LIMIT = limit
    with zipfile.ZipFile(path) as z:  # Python reads it back
        assert z.testzip() is None
    data = open(path, "rb").read()
    assert (b"PK\x06\x06" in data) == zip64  # the zip64 end record
    # Central headers whose 32-bit sizes and offset say "see the zip64 extra field".
    assert (data.count(b"\xff\xff\xff\xff\xff\xff\xff\xff") >= len(entries)) == zip64


def logits(dcp_bin, ckpt, tmp_path, *flags):
    out = tmp_path / ("logits-%d.bin" % len(os.listdir(tmp_path)))
    subprocess.run([dcp_bin, "run", "--model-path", ckpt, "--batch", "2", "--prompt-len", "40", "--max-new-tokens", "4",
                    "--no-verify", "--dump-logits", str(out),
                    *flags], check=True, stdout=subprocess.DEVNULL)
    return out.read_bytes()


def refusal(dcp_bin, ckpt):
    r = subprocess.run([dcp_bin, "run", "--model-path", ckpt, "--batch", "1", "--prompt-len", "8",
                        "--max-new-tokens", "1", "--no-verify"],
                       capture_output=True, text=True)
    assert r.returncode != 0
    return r.stderr


@pytest.fixture(scope="module")
def minicpm3(dcp_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("minicpm3") / "model"
    subprocess.run([dcp_bin, "gen-checkpoint", "--family", "minicpm3", "--num-layers", "2",
                    "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    return str(out)


def test_single_file_gives_the_safetensors_logits(dcp_bin, checkpoint, tmp_path):
    pt = to_torch(checkpoint, str(tmp_path / "pt"))
    assert os.listdir(pt).count("pytorch_model.bin") == 1
    assert logits(dcp_bin, pt, tmp_path) == logits(dcp_bin, checkpoint, tmp_path)


def test_sharded_bf16_with_an_index_at_tp_and_dcp(dcp_bin, minicpm3, tmp_path):
    pt = to_torch(minicpm3, str(tmp_path / "pt"))
    assert len([f for f in os.listdir(pt) if f.endswith(".bin")]) == 3
    flags = ("--tp-size", "2", "--dcp-size", "2")
    assert logits(dcp_bin, pt, tmp_path, *flags) == logits(dcp_bin, minicpm3, tmp_path, *flags)


@pytest.mark.parametrize("protocol", [2, 4])
def test_zip64_records_and_pickle_protocols(dcp_bin, checkpoint, tmp_path, protocol):
    pt = to_torch(checkpoint, str(tmp_path / "pt"), pickle_protocol=protocol)
    rezip(os.path.join(pt, "pytorch_model.bin"), zip64=True)
    assert logits(dcp_bin, pt, tmp_path) == logits(dcp_bin, checkpoint, tmp_path)


def test_tensors_sharing_a_storage(dcp_bin, checkpoint, tmp_path):
    """lm_head.weight saved as the embedding itself (one storage, as a tied model's state dict
    has it) reads as a tied checkpoint does; a tensor at an offset inside a larger storage reads
    from that offset."""
    (_, sd), = shards(checkpoint)
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    norm = sd["model.norm.weight"]
    big = torch.cat([torch.full((5,), float("nan"), dtype=norm.dtype), norm])
    sd["model.norm.weight"] = big[5:]  # storage offset 5, NaNs before it
    tied = without_weights(checkpoint, str(tmp_path / "tied"))
    del sd["lm_head.weight"]
    write_safetensors(os.path.join(tied, "model.safetensors"),
                      {k: v.contiguous() for k, v in sd.items()})
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    pt = without_weights(checkpoint, str(tmp_path / "pt"))
    torch.save(sd, os.path.join(pt, "pytorch_model.bin"))
    with zipfile.ZipFile(os.path.join(pt, "pytorch_model.bin")) as z:
        stored = [n for n in z.namelist() if "/data/" in n]
    assert len(stored) == len(sd) - 1  # the two names share one storage in the file
    assert logits(dcp_bin, pt, tmp_path) == logits(dcp_bin, tied, tmp_path)


def test_safetensors_are_preferred_to_a_bin_beside_them(dcp_bin, checkpoint, tmp_path):
    both = shutil.copytree(checkpoint, str(tmp_path / "both"))
    open(os.path.join(both, "pytorch_model.bin"), "wb").write(b"not a checkpoint")
    assert logits(dcp_bin, both, tmp_path) == logits(dcp_bin, checkpoint, tmp_path)


class Payload:
    def __reduce__(self):
        return (os.system, ("touch ran-the-pickle",))


def test_refusals(dcp_bin, checkpoint, tmp_path):
    (_, sd), = shards(checkpoint)

    def saved(name, obj, **kw):
        d = without_weights(checkpoint, str(tmp_path / name))
        torch.save(obj, os.path.join(d, "pytorch_model.bin"), **kw)
        return d

    # A pickle that would run a command names the function and runs nothing.
    evil = saved("evil", collections.OrderedDict(sd, extra=Payload()))
    err = refusal(dcp_bin, evil)
    assert "'posix.system'" in err and "runs nothing" in err, err
    assert not os.path.exists(os.path.join(evil, "ran-the-pickle"))
    assert not os.path.exists("ran-the-pickle")

    wrapped = saved("wrapped", {"state_dict": sd})
    assert "'state_dict' is a dict, not a tensor" in refusal(dcp_bin, wrapped)

    view = dict(sd)
    view["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"].t().contiguous().t()
    err = refusal(dcp_bin, saved("view", view))
    assert "tensor 'model.embed_tokens.weight' is a non-contiguous view" in err, err

    legacy = saved("legacy", sd, _use_new_zipfile_serialization=False)
    assert "legacy (pre-1.6) format" in refusal(dcp_bin, legacy)

    deflated = saved("deflated", sd)
    rezip(os.path.join(deflated, "pytorch_model.bin"), compression=zipfile.ZIP_DEFLATED)
    assert "is compressed (method 8)" in refusal(dcp_bin, deflated)

    truncated = saved("truncated", sd)
    path = os.path.join(truncated, "pytorch_model.bin")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])
    assert "not a zip archive" in refusal(dcp_bin, truncated)

    corrupt = saved("corrupt", sd)
    path = os.path.join(corrupt, "pytorch_model.bin")
    data = bytearray(open(path, "rb").read())
    data[data.index(b"model.norm.weight")] ^= 1  # inside data.pkl
    open(path, "wb").write(bytes(data))
    assert "fails its CRC-32" in refusal(dcp_bin, corrupt)

    empty = without_weights(checkpoint, str(tmp_path / "empty"))
    assert "no .safetensors files and no pytorch_model.bin" in refusal(dcp_bin, empty)
