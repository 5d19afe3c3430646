"""`python -m aioareal export`: a policy written as GGUF loads back through the project's own GGUF
reader (models/gguf.py) with the same tokens and the same logits within the format's tolerance, for
a qwen2 model with the tiny model's character vocabulary and a llama model with a byte-level BPE
(q/k rows permuted as llama.cpp wants them); RUN may be a run, a checkpoint or a policy directory;
`--hub` fails in one line without a login (no network here)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from aioareal.cli import main
from aioareal.models import gguf as gguf_cache
from aioareal.models import load_model, load_tokenizer
from aioareal.models.load_policy import resolve_source

gguf = pytest.importorskip("gguf")
from gguf_tiny import write_tiny_gguf  # noqa: E402

CPU = torch.device("cpu")
TEXT = "<|im_start|>user\nWhat is 12 + 34?  Hello, world!\n<|im_end|>\n<|im_start|>assistant\n"
TOLERANCE = {"f16": 1e-2, "q8_0": 5e-2}  # max |logit difference|: f16 rounding, q8_0's 8-bit blocks


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_cache.ENV_CACHE, str(tmp_path / "cache"))
    gguf_cache._digest.cache_clear()


def tiny_run(root: Path) -> Path:
    """A run directory as training leaves it: the tiny qwen2 model in checkpoints/step-N/policy/."""
    policy = root / "run" / "checkpoints" / "step-000002" / "policy"
    load_model("random:tiny", torch.float32, CPU, seed=3).save_pretrained(policy)
    load_tokenizer("random:tiny").save_pretrained(policy)
    (policy.parent / "state.json").write_text(json.dumps({"step": 2}))
    return root / "run"


def llama_policy(root: Path) -> Path:
    """The tiny llama GGUF of tests/gguf_tiny.py as a plain Hugging Face directory (byte-level BPE, merges)."""
    write_tiny_gguf(root / "src.gguf")
    policy = root / "llama-policy"
    shutil.copytree(resolve_source(str(root / "src.gguf")), policy)
    return policy


def logits(name: str, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return load_model(name, torch.float32, CPU)(ids).logits


def check_round_trip(policy: Path, target: Path, out: Path, qtype: str) -> None:
    from transformers import PreTrainedTokenizerFast

    assert main(["export", str(target), "--gguf", str(out), "--type", qtype]) == 0
    source, loaded = PreTrainedTokenizerFast.from_pretrained(str(policy)), load_tokenizer(str(out))
    ids = source(TEXT, return_tensors="pt")["input_ids"]
    assert loaded(TEXT, return_tensors="pt")["input_ids"].tolist() == ids.tolist()
    assert loaded.chat_template == source.chat_template and loaded.eos_token == source.eos_token
    gap = (logits(str(policy), ids) - logits(str(out), ids)).abs().max().item()
    assert gap < TOLERANCE[qtype], gap
    assert gap > 0 or qtype == "f16"  # q8_0 really is quantized


@pytest.mark.parametrize("qtype", ["f16", "q8_0"])
def test_qwen2_run_round_trips_through_the_gguf_reader(tmp_path, qtype):
    run = tiny_run(tmp_path)
    policy = run / "checkpoints" / "step-000002" / "policy"
    check_round_trip(policy, run, tmp_path / f"tiny-{qtype}.gguf", qtype)


@pytest.mark.parametrize("qtype", ["f16", "q8_0"])
def test_llama_bpe_policy_round_trips_with_permuted_qk(tmp_path, qtype):
    policy = llama_policy(tmp_path)
    check_round_trip(policy, policy, tmp_path / f"llama-{qtype}.gguf", qtype)
    reader = gguf.GGUFReader(str(tmp_path / f"llama-{qtype}.gguf"))
    q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    source = load_model(str(policy), torch.float32, CPU).model.layers[0].self_attn.q_proj.weight
    if qtype == "f16":  # stored in llama.cpp's rotary layout, not as transformers holds it
        stored = torch.from_numpy(q.data.astype("float32")).reshape(source.shape)
        assert not torch.allclose(stored, source, atol=1e-2)


def test_the_file_has_llama_cpp_names_types_tokenizer_and_template(tmp_path):
    run = tiny_run(tmp_path)
    out = tmp_path / "tiny.gguf"
    assert main(["export", str(run / "checkpoints" / "step-000002"), "--gguf", str(out), "--type", "q8_0"]) == 0
    reader = gguf.GGUFReader(str(out))
    tensors = {t.name: t for t in reader.tensors}
    for name in ("token_embd.weight", "output_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_q.bias",
                 "blk.3.ffn_down.weight", "blk.3.attn_norm.weight"):
        assert name in tensors, name
    assert "output.weight" not in tensors  # tied embeddings are stored once
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    field = reader.fields
    assert field["general.architecture"].contents() == "qwen2"
    assert field["tokenizer.ggml.model"].contents() == "gpt2"
    assert len(field["tokenizer.ggml.tokens"].contents()) == 128  # the embedding's rows, padded
    assert field["tokenizer.ggml.merges"].contents()  # llama.cpp needs the key
    assert "<|im_start|>" in field["tokenizer.chat_template"].contents()
    assert not list(tmp_path.glob(".tiny.gguf.tmp-*"))


@pytest.mark.parametrize("args, expected", [
    (["no/such/run", "--gguf", "x.gguf"], "export: no/such/run: no such run, checkpoint or policy directory"),
    ([".", "--gguf", "x.gguf"], "export: .: neither a run with a checkpoint"),
    (["."], "export: nothing to do; give --gguf FILE and/or --hub REPO"),
])
def test_bad_targets_are_one_line(tmp_path, monkeypatch, capsys, args, expected):
    monkeypatch.chdir(tmp_path)
    assert main(["export", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {expected}") and len(err.splitlines()) == 1


def test_a_folder_as_the_gguf_gets_a_named_file_and_a_missing_one_is_one_line(tmp_path, monkeypatch, capsys):
    run = tiny_run(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(run), "--gguf", "."]) == 0
    assert (tmp_path / "run-step-000002-f16.gguf").stat().st_size > 0
    assert main(["export", str(run), "--gguf", "no/such/dir/x.gguf"]) == 2
    assert capsys.readouterr().err.strip().endswith("export --gguf no/such/dir/x.gguf: no directory no/such/dir to "
                                                    "write it in")


def test_an_unwritable_gguf_folder_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    """A read-only mount (root writes anywhere else, so access(2) is what a test can steer): the error
    names the folder before the model loads, not the temporary file the export would have written."""
    run = tiny_run(tmp_path)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "ro"
    out.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p).resolve() == out and mode == os.W_OK
                        else real_access(p, mode, **kw))
    assert main(["export", str(run), "--gguf", "ro/x.gguf"]) == 2
    assert capsys.readouterr().err.strip() == "error: export --gguf ro/x.gguf: directory ro is not writable"
    assert list(out.iterdir()) == []


def test_hub_without_login_or_package_is_one_line(tmp_path, monkeypatch, capsys):
    run = tiny_run(tmp_path)
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no stored token
    pytest.importorskip("huggingface_hub")
    assert main(["export", str(run), "--hub", "me/tiny", "--gguf", str(tmp_path / "t.gguf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: export --hub: not logged in") and len(err.splitlines()) == 1
    assert not (tmp_path / "t.gguf").exists()  # refused before the export, not after
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "huggingface_hub" else real(n, *a))
    assert main(["export", str(run), "--hub", "me/tiny"]) == 2
    assert "needs the huggingface_hub package" in capsys.readouterr().err


def test_an_architecture_llama_cpp_layout_is_not_written_for_is_refused(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    policy = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128)).save_pretrained(policy)
    load_tokenizer("random:tiny").save_pretrained(policy)
    assert main(["export", str(policy), "--gguf", str(tmp_path / "g.gguf")]) == 2
    assert "export: a gpt2 model; GGUF export writes llama and qwen2 models" in capsys.readouterr().err



def test_a_saved_character_tokenizer_loads_back_as_saved(tmp_path):
    """A policy directory's tokenizer.json is read as is: the model type's own class (Qwen2Tokenizer)
    would rebuild the tiny model's character vocabulary and drop spaces and newlines."""
    policy = tiny_run(tmp_path) / "checkpoints" / "step-000002" / "policy"
    text = "<|im_start|>user\n1 + 2?<|im_end|>\n"
    assert load_tokenizer(str(policy))(text)["input_ids"] == load_tokenizer("random:tiny")(text)["input_ids"]


def test_without_the_gguf_package_the_export_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    import importlib.util

    run = tiny_run(tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "gguf" else real(n, *a))
    assert main(["export", str(run), "--gguf", str(tmp_path / "t.gguf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: export: writing a GGUF file needs the gguf package: pip install 'aioareal[gguf]' "
                   "(or pip install gguf)")


def test_a_killed_exports_temporary_file_is_removed_and_a_live_writer_refused(tmp_path, capsys):
    import subprocess
    import sys

    run = tiny_run(tmp_path)
    out = tmp_path / "model.gguf"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process has now: an export killed with SIGKILL left its file
    husk = tmp_path / f".model.gguf.tmp-{gone.pid}"
    husk.write_bytes(b"GGUF half written")
    unrelated = tmp_path / ".model.gguf.tmp-notapid"
    unrelated.write_text("someone else's")
    assert main(["export", str(run), "--gguf", str(out)]) == 0
    assert out.stat().st_size > 0 and not husk.exists() and unrelated.exists()
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        try:
            (tmp_path / f".model.gguf.tmp-{live.pid}").write_bytes(b"being written")
            assert main(["export", str(run), "--gguf", str(out)]) == 2
        finally:
            live.kill()
    err = capsys.readouterr().err
    assert f"is being written by another export now (pid {live.pid}" in err and err.count("\n") == 1
