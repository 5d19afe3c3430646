"""train.compile: each decoder layer compiled (trainer/masters.py). The equality tests trace with
the "aot_eager" backend: the same graphs as inductor's, without generating kernels, which on a
2-core CPU takes minutes."""
from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch
from torch._dynamo.utils import counters

from aioareal.config import load_config
from aioareal.config.layering import ConfigError
from aioareal.group import Completion, Example, Group, Sample
from aioareal.models import random_model
from aioareal.run.build import build_models, build_trainer
from aioareal.trainer import Trainer, train_step
from aioareal.trainer.masters import compile_layers
from aioareal.trainer.optim import adamw_kind


def batch(seed: int, groups: int, prompt: tuple[int, int], completion: tuple[int, int]) -> list[Group]:
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        ids = [rng.randrange(3, 40) for _ in range(rng.randint(*prompt))]
        samples = []
        for _ in range(4):
            tokens = [rng.randrange(3, 40) for _ in range(rng.randint(*completion))]
            samples.append(Sample(ids, Completion(tokens, [-1.5] * len(tokens), [0] * len(tokens), "stop"),
                                  float(rng.random() < 0.5)))
        out.append(Group(g, ids, len(samples), Example(str(g), "q", "a"), samples=samples))
    return out


def trainers() -> tuple[Trainer, Trainer]:
    config = load_config(overrides=["model.name=random:tiny", "algo.group_size=4"])
    model = random_model("tiny", torch.float32, torch.device("cpu"))
    eager = Trainer(model, config.algo, config.train, pad_id=0)
    compiled_model = copy.deepcopy(model)
    assert compile_layers(compiled_model, backend="aot_eager") == 4
    compiled = Trainer(compiled_model, config.algo, config.train, pad_id=0)
    assert eager.layouts.share and not compiled.layouts.share  # the prompts' cache would recompile each layer
    eager.layouts = dataclasses.replace(eager.layouts, share=False, tree=False)
    return eager, compiled


def test_a_compiled_step_equals_the_eager_one_without_a_compile_per_shape():
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = trainers()
    shapes = [((3, 6), (2, 9)), ((5, 12), (1, 30)), ((2, 4), (6, 18))]  # prompt and completion length ranges
    for seed, (prompt, completion) in enumerate(shapes):
        groups = batch(seed, 6, prompt, completion)
        a = train_step(eager, copy.deepcopy(groups))
        b = train_step(compiled, copy.deepcopy(groups))
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    for (name, p), q in zip(eager.model.named_parameters(), compiled.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=name)
    moved = random_model("tiny", torch.float32, torch.device("cpu")).model.layers[0].mlp.up_proj.weight
    assert not torch.allclose(moved, compiled.model.model.layers[0].mlp.up_proj.weight)  # it trained
    # Dynamic shapes and no KV cache in the training forward: three widths and row counts, and
    # every layer, share one graph (a recompile at most where a guard changes), not one per shape
    # or per layer (each layer's cache entry was a guard: 4 graphs, and past torch's recompile
    # limit of 8 on Qwen2.5's 24 layers).
    assert 1 <= counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


def test_train_compile_is_a_config_field_the_builder_applies():
    config = load_config(overrides=["model.name=random:tiny", "train.compile=true"])
    assert config.train.compile is True
    with pytest.raises(ConfigError, match="train.compile"):
        load_config(overrides=["model.name=random:tiny", "train.compile=sometimes"])
    device = torch.device("cpu")
    models = build_models(config, config.model.name, None, device, device)
    build_trainer(config, models, pad_id=0)
    assert all(hasattr(layer.forward, "_torchdynamo_orig_callable") for layer in models.train.model.layers)
    # The engine's copy stays eager.
    assert not hasattr(models.gen.model.layers[0].forward, "_torchdynamo_orig_callable")


def test_a_compiled_lora_step_equals_the_eager_one():
    """peft's LoRA layers trace: the adapters' gradients and the KL reference with the adapters
    switched off (lora.AdaptersOff) come out as in eager mode."""
    pytest.importorskip("peft")
    config = load_config(overrides=["model.name=random:tiny", "algo.group_size=4", "model.lora_rank=4",
                                    "algo.kl_coef=0.1", "algo.lr=1e-2"])
    cpu = torch.device("cpu")
    trainers = []
    for compiled in (False, True):
        torch.manual_seed(0)
        models = build_models(config, "random:tiny", None, cpu, cpu)
        if compiled:
            compile_layers(models.train, backend="aot_eager")
        trainers.append(Trainer(models.train, config.algo, config.train, pad_id=0, ref_model=models.ref))
    eager, compiled = trainers
    eager.layouts = dataclasses.replace(eager.layouts, share=False, tree=False)
    for seed in range(2):
        groups = batch(seed, 4, (3, 8), (2, 16))
        a, b = train_step(eager, copy.deepcopy(groups)), train_step(compiled, copy.deepcopy(groups))
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-6)
        assert b["kl"] == pytest.approx(a["kl"], rel=1e-4, abs=1e-7)
    assert a["kl"] > 0  # the adapters moved the policy away from the reference
    for (name, p), q in zip(eager.model.named_parameters(), compiled.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=name)


def test_adamw_is_fused_on_one_device_foreach_across_devices_and_the_trainer_uses_it():
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))]
    assert adamw_kind(params) == {"fused": True}
    assert adamw_kind([]) == {"foreach": True}
    assert adamw_kind([torch.nn.Parameter(torch.randn(2, device="meta"))]) == {"foreach": True}
    config = load_config(overrides=["model.name=random:tiny"])
    trainer = Trainer(random_model("tiny", torch.float32, torch.device("cpu")), config.algo, config.train, pad_id=0)
    group = trainer.optimizer.param_groups[0]
    assert group["fused"] is True and not group["foreach"]


def test_fused_adamw_on_the_cpu_steps_as_foreach_does():
    torch.manual_seed(0)
    weights, grads = [torch.randn(5, 3), torch.randn(7)], [[torch.randn(5, 3), torch.randn(7)] for _ in range(4)]
    out = []
    for kind in ({"fused": True}, {"foreach": True}):
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        opt = torch.optim.AdamW(params, lr=0.05, betas=(0.9, 0.99), weight_decay=0.1, **kind)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        out.append([p.detach() for p in params])
    for a, b, w in zip(*out, weights):
        torch.testing.assert_close(a, b)
        assert not torch.allclose(a, w)


def test_fused_adamw_steps_a_dtensor_as_foreach_does():
    """Why adamw_kind lets FSDP2's sharded parameters (DTensors) take the fused kernel: torch shards
    `_fused_adamw_` as a pointwise op. The CPU has the fused kernel too, so this runs here."""
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
    if dist.is_initialized():
        pytest.skip("a process group is already up")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        weight, grads = torch.randn(8, 4), [torch.randn(8, 4) for _ in range(3)]
        out = []
        for kind in ({"fused": True}, {"foreach": True}):
            p = torch.nn.Parameter(distribute_tensor(weight.clone(), mesh, [Shard(0)]))
            opt = torch.optim.AdamW([p], lr=0.1, weight_decay=0.1, **kind)
            for g in grads:
                p.grad = distribute_tensor(g, mesh, [Shard(0)])
                opt.step()
            out.append(p.detach().full_tensor())
        torch.testing.assert_close(out[0], out[1])
        assert not torch.allclose(out[0], weight)
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_adamw_on_cuda_is_fused():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    params = [torch.nn.Parameter(torch.randn(3, 2, device="cuda")),
              torch.nn.Parameter(torch.randn(4, device="cuda", dtype=torch.bfloat16))]
    assert adamw_kind(params) == {"fused": True}
    assert adamw_kind(params + [torch.nn.Parameter(torch.randn(2))]) == {"foreach": True}  # one on the CPU


@pytest.mark.gpu
def test_a_compiled_bf16_step_on_cuda_equals_the_eager_one():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    config = load_config(overrides=["model.name=random:tiny", "algo.group_size=4"])
    device = torch.device("cuda")
    model = random_model("tiny", torch.float32, device)
    other = copy.deepcopy(model)
    compile_layers(other)  # inductor: Triton kernels
    eager = Trainer(model, config.algo, config.train, pad_id=0, autocast_dtype=torch.bfloat16)
    compiled = Trainer(other, config.algo, config.train, pad_id=0, autocast_dtype=torch.bfloat16)
    assert compiled.optimizer.param_groups[0]["fused"] is True  # adamw_kind: every parameter on CUDA
    for seed in range(3):
        groups = batch(seed, 6, (3, 12), (2, 40))
        a = train_step(eager, copy.deepcopy(groups))
        b = train_step(compiled, copy.deepcopy(groups))
        assert b["loss"] == pytest.approx(a["loss"], rel=2e-2, abs=1e-3)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=5e-2)
