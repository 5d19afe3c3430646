"""One GSM8K-shaped training step of the CPU recipe at a given micro-batch budget: seconds and peak RSS.

    python docs/log/2026-12-gsm8k/train_budget.py 8192   # train.micro_batch_tokens

Builds the trainer as a run does (configs/smollm2-gsm8k-cpu.yaml: SmolLM2-135M-Instruct with the SFT
LoRA adapter, lean activations), then trains two steps on 4 groups x 16 samples of random tokens
(150-token prompts, completions of 120-240 tokens, rewards alternating so every sample is computed).
Prints the second step's seconds and the process's peak RSS. Run each budget in its own process: peak
RSS only grows."""
import random
import resource
import sys
import time

import torch

from aioareal.config import load_config
from aioareal.group import Completion, Example, Group, Sample
from aioareal.run.build import build_models, build_trainer
from aioareal.trainer import train_step

budget = int(sys.argv[1])
torch.set_num_threads(1)
config = load_config("configs/smollm2-gsm8k-cpu.yaml",
                     ["model.name=docs/log/2026-12-gsm8k/adapters/sft-lora", f"train.micro_batch_tokens={budget}"])
cpu = torch.device("cpu")
trainer = build_trainer(config, build_models(config, config.model.name, None, cpu, cpu), pad_id=0)
rng = random.Random(0)


def groups() -> list[Group]:
    out = []
    for g in range(4):
        prompt = [rng.randrange(100, 40000) for _ in range(150)]
        group = Group(g, prompt, 16, Example(str(g), "q", "a"))
        for i in range(16):
            n = rng.randrange(120, 241)
            tokens = [rng.randrange(100, 40000) for _ in range(n)]
            group.samples.append(Sample(prompt, Completion(tokens, [-2.0] * n, [trainer.version] * n, "stop"),
                                        float(i % 2)))
        out.append(group)
    return out


trainer.max_logprob_gap = float("inf")  # random tokens: behaviour log-probs from no generator
train_step(trainer, groups())  # warm-up
start = time.perf_counter()
metrics = train_step(trainer, groups())
seconds = time.perf_counter() - start
peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(f"micro_batch_tokens {budget}: step {seconds:.1f} s (loss {metrics['time_loss']:.1f} s), "
      f"{metrics['micro_batches']:.0f} micro-batches, peak RSS {peak_gib:.2f} GiB")
