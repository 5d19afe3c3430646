"""An H100 profile of the Qwen2.5-0.5B shape derived from figures measured in one H100 80GB session
(docs/log/2026-11-h100-session.md: bf16, random weights), for the bench e2e setting
(B=8, G=8, 128-token prompts, completion cap 768, micro-batch budget 8192). No GPU profile was
measured directly: each coefficient below names the figure (or the assumption) it comes from and
whether it is bound by memory bandwidth, tensor FLOPs or latency/host, which is how `gpus.derive`
scales it to other GPUs. That session's e2e figures are NOT used: they are what this profile is
checked against.
"""
from __future__ import annotations

from .cost_profile import Contention, DecodeCost, PrefillCost, Profile, TrainCost

N, SPAN = 256, 384  # the session's decode reference point: 256 sequences, 128-token prompts + 512 new (mean span 384)
STEP = N / 51_943  # bench gen: engine 51,943 tok/s at 256 sequences -> 4.93 ms per decode step, all in
WEIGHTS_READ = 0.99e9 / 3.35e12  # docs/architecture.md#reference-facts: 0.99 GB per decode step, 3.35 TB/s
TRAIN_TOKEN = 200 / (35_148 * (64 + 200))  # bench train: 35,148 completion tok/s packed, 64-token prompts, mean 200
PARAMS = 494_032_768  # Qwen2.5-0.5B, tied embeddings (docs/architecture.md#reference-facts: 494M)
NON_EMBEDDING = 358e6  # Qwen2.5-0.5B model card: 0.36B non-embedding parameters
ACHIEVED_FLOPS = 6 * PARAMS / TRAIN_TOKEN  # the trainer's achieved FLOP/s (fwd + bwd = 6 x params per token)


def part(seconds: float, bound: str, source: str) -> dict:
    return {"seconds": seconds, "bound": bound, "source": source}


def components() -> dict[str, list[dict]]:
    attention = 0.6e-3  # profiler, 256 seqs span 384: attention (cuDNN SDPA) 0.6 ms
    per_seq = [part(0.85e-3 / N, "bandwidth", "profiler: sampling over 151,936 words 0.85 ms at 256 seqs"),
               part(1.0e-3 / N, "host", "H100 session: about 1 ms of host bookkeeping for 256 sequences per step"),
               part((1.2e-3 - WEIGHTS_READ) / N, "flops", "profiler: GEMMs 1.2 ms at 256 seqs, less the weight read")]
    fixed = STEP - attention - N * sum(p["seconds"] for p in per_seq)
    return {
        "decode.c": [part(attention / (N * SPAN), "bandwidth", "profiler: attention 0.6 ms at 256 seqs x span 384")],
        "decode.b": per_seq,
        "decode.a": [part(WEIGHTS_READ, "bandwidth", "0.99 GB of weights per step at 3.35 TB/s"),
                     part(fixed - WEIGHTS_READ, "latency", "bench gen's 4.93 ms step less everything above: "
                          "small kernels at 2-3 us each inside the CUDA graph"),
                     part(0.1e-3, "host", "assumed: the orchestrator's per-step thread hand-off (not measured)")],
        "prefill.a": [part(2e-3, "latency", "assumed: ~420 eager kernel launches (24 layers) at ~5 us")],
        "prefill.b": [part(2 * NON_EMBEDDING / ACHIEVED_FLOPS, "flops",
                           "2 x 0.36B non-embedding FLOPs per token at the trainer's achieved FLOP/s")],
        "prefill.c": [part(4 * 24 * 896 / ACHIEVED_FLOPS, "flops",
                           "attention 4 x layers x hidden x width^2 FLOPs per prompt at the same rate")],
        "train.b": [part(TRAIN_TOKEN, "flops", "bench train: 35,148 completion tok/s = 46,395 tok/s with prompts")],
        "train.a": [part(28 * PARAMS / 3.35e12, "bandwidth", "fused AdamW + clip: ~28 bytes per parameter"),
                    part(20e-3, "host", "assumed: packing, per-micro-batch Python, the step's one sync")],
        "publish_s": [part(6 * PARAMS / 3.35e12, "bandwidth", "fp32 master read + bf16 staging write"),
                      part(1.5e-3, "latency", "assumed: ~290 copy launches")],
        "adopt_s": [part(4 * PARAMS / 3.35e12, "bandwidth", "bf16 staging -> weights"),
                    part(1.5e-3, "latency", "assumed: ~290 copy launches")],
        "reward_s": [part(1e-3, "host",
                          "GSM8K verifier round trip, measured 0.5-0.7 ms on the 2-core CPU, rounded up")],
    }


def readme_h100() -> Profile:
    c = components()
    total = {k: sum(p["seconds"] for p in parts) for k, parts in c.items()}
    return Profile(
        name="h100-qwen2.5-0.5b", kind="derived", device="NVIDIA H100 SXM5 80GB (figures from one H100 session)",
        model="random:qwen2.5-0.5b", dtype="bfloat16",
        decode=DecodeCost(total["decode.a"], total["decode.b"], total["decode.c"]),
        prefill=PrefillCost(total["prefill.a"], total["prefill.b"], total["prefill.c"]),
        train=TrainCost(total["train.a"], total["train.b"]),
        publish_s=total["publish_s"], adopt_s=total["adopt_s"], reward_s=total["reward_s"],
        contention=Contention(1.5, 1.2, "assumed, not measured: generator and trainer share one H100 (two streams, "
                              "one GIL); the e2e figures it is checked against used one GPU for both"),
        param_count=PARAMS, link_gbps=450.0,
        setup={"batch_groups": 8, "group_size": 8, "prompt_len": 128, "max_new_tokens": 768, "slots": 0,
               "micro_batch_tokens": 8192, "compile": False, "cuda_graphs": True},
        notes=["derived from one H100 session's figures (torch 2.11, bf16; docs/log/2026-11-h100-session.md): "
               "bench gen 51,943 tok/s at 256 seqs; the decode-step profiler breakdown; bench train 35,148 tok/s "
               "packed. No GPU profile was measured directly. That session's e2e figures are held out to check it.",
               "see derivation.components for which figure fed which coefficient"],
        derivation={"from": "docs/log/2026-11-h100-session.md", "gpu": "h100", "components": c})
