"""The trainer's state (master weights, optimizer) and the pieces of a training step, which
`train_step` (at the end) calls in order, each phase timed (`time_<phase>` in metrics.jsonl): read
it first. One step is `minibatches x ppo_epochs` optimizer steps and one policy version.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from .. import losses
from ..config import AlgoConfig, TrainConfig
from ..distributed.world import LOCAL, Collective
from ..errors import UserError
from ..generation.family_forward import sliding_windows
from ..group import Group
from ..timing import PhaseTimer
from .batching import Layouts, MicroBatch, pack, use_varlen
from .logprobs import TokenLogprobs, token_logprobs
from .masters import layers_compiled, working_copy
from .objective import StepSums, Totals, micro_loss, read_back, set_aside, step_figures
from .optim import build_optimizer, freeze_embeddings
from .prefix_tree import use_tree


class NonFiniteError(UserError):
    """Too many consecutive updates had a non-finite loss or gradient: the run stops (exit code 3),
    its last checkpoint intact."""

    exit_code = 3


# GradScaler starts at 2**16; sixteen halvings reach a scale of 1.
SCALER_CALIBRATION_SKIPS = 16
# A rare non-finite update (one bad batch) is skipped; this many in a row means the run diverged.
MAX_CONSECUTIVE_SKIPS = 5


def autocasts(device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether forward and backward run under autocast to `dtype`: on CUDA in bf16 or fp16, on the CPU
    in bf16 only (fp16 there would need loss scaling and has no matmul units)."""
    if dtype is None or dtype == torch.float32:
        return False
    return device.type == "cuda" or dtype == torch.bfloat16


class Trainer:
    def __init__(self, model: PreTrainedModel, algo: AlgoConfig, train: TrainConfig, pad_id: int, *,
                 ref_model: PreTrainedModel | None = None, autocast_dtype: torch.dtype | None = None,
                 temperature: float = 1.0, loss_constant: float | None = None,
                 policy: torch.nn.Module | None = None, collective: Collective = LOCAL) -> None:
        """`temperature` scales logits as the generator's sampling did (generation.temperature);
        `loss_constant` is Dr. GRPO's fixed length for algo.loss_agg=constant (generation.max_new_tokens).
        Under torchrun `policy` is `model`'s `TokenLogprobs`, sharded by FSDP2 (built here otherwise),
        and `collective` makes the normalisers and statistics global (nothing to reduce in one process)."""
        if algo.loss_agg == "constant" and loss_constant is None:
            raise ValueError("algo.loss_agg=constant needs loss_constant (generation.max_new_tokens)")
        self.model, self.ref_model, self.algo, self.pad_id = model, ref_model, algo, pad_id
        self.policy = policy if policy is not None else TokenLogprobs(model)
        self.collective = collective
        self.temperature, self.logprob_chunk = temperature, train.logprob_chunk
        self.loss_constant = float(loss_constant or 0.0)
        self.max_logprob_gap = math.inf  # train.max_logprob_gap, set by run/build.py (`train_step` checks it)
        self.device = next(model.parameters()).device
        # Only what trains: all parameters in full fine-tuning, the adapters alone with LoRA.
        freeze_embeddings(model, algo)  # algo.embedding_lr_scale=0
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.autocast_dtype = autocast_dtype if autocasts(self.device, autocast_dtype) else None
        self.working = working_copy(model, train.precision, self.autocast_dtype, collective.size > 1)
        if self.working is not None:
            self.policy = TokenLogprobs(self.working.model)
        self.optimizer = build_optimizer(self.params, self.algo, train.optimizer_moments, collective.size > 1, model)
        warmup = self.algo.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
        self.scaler = torch.amp.GradScaler("cuda") if self.autocast_dtype == torch.float16 else None
        if self.scaler and collective.size > 1:  # each rank's scaler would see only its own shards' overflows
            raise UserError("model.train_dtype resolves to float16, which is not supported on several ranks "
                            "(the loss scaler would skip steps on some ranks only); set model.train_dtype=bfloat16 "
                            "or float32")
        self._choose_layouts(model, train, collective)
        self.version = 0
        self.micro_batch_tokens = train.micro_batch_tokens  # halved for good after an OOM
        # A KL penalty has a gradient at a zero advantage: then every sample is computed.
        self.skip_zero_advantage = train.skip_zero_advantage and algo.kl_coef == 0
        self.oom_retries = 0
        self.skipped_updates = 0
        self.consecutive_skips = 0

    def _choose_layouts(self, model: PreTrainedModel, train: TrainConfig, collective: Collective) -> None:
        """`self.layouts`: which layouts the micro-batches' log-probs may use (batching.py `Layouts`),
        chosen once; `collate` gives each micro-batch at most one of them (its `layout`)."""
        # Shared prompts are off under torchrun (FSDP2 would gather every layer twice per forward),
        # with gradient checkpointing (it drops the prompts' KV cache) and with compiled layers (a
        # recompile for the cache). The non-padded layouts' masks know no sliding window.
        checkpointed = any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
        compiled = layers_compiled(model)
        windowed = bool(sliding_windows(model))
        share = collective.size == 1 and not checkpointed and not compiled and not windowed
        self.layouts = Layouts(share=share,
                               varlen=not share and not windowed and use_varlen(train.varlen, self.device, model),
                               tree=False if windowed else use_tree(train.prefix_tree, self.device, model, compiled))

    def _autocast(self):
        if self.autocast_dtype is None or self.working is not None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _logprobs(self, model: PreTrainedModel, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        with self._autocast():
            if model is self.model:  # through the module: FSDP2 gathers the shards in its hooks
                return self.policy(mb.input_ids, mb.attention_mask, mb.loss_mask, self.temperature,
                                   self.logprob_chunk, mb.layout)
            return token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask,
                                  self.temperature, self.logprob_chunk, mb.layout)

    def pack(self, groups: list[Group]) -> list[list[MicroBatch]]:
        """The batch's mini-batches (whole groups each), packed into micro-batches on the device."""
        self.model.train()  # a freshly loaded model is in eval mode
        if self.working is not None:
            self.working.model.train()
        m = self.algo.minibatches
        size = math.ceil(len(groups) / m)
        parts = [groups[i:i + size] for i in range(0, len(groups), size)]
        budget = self.micro_batch_tokens
        packed = []
        for part in parts:
            samples, aside = set_aside([s for g in part for s in g.samples], self.skip_zero_advantage)
            mbs = pack(samples, budget, self.pad_id, self.device, self.layouts)
            mbs[0].aside_rows, mbs[0].aside_tokens = aside.rows, aside.completion_tokens
            packed.append(mbs)
        return self._even_out(packed)

    def _even_out(self, packed: list[list[MicroBatch]]) -> list[list[MicroBatch]]:
        """Under torchrun every forward and backward is a collective: ranks add fillers up to the most."""
        if self.collective.size == 1:
            return packed
        most = self.collective.max_(torch.tensor([len(part) for part in packed])).tolist()
        return [part + [MicroBatch.empty(self.pad_id, self.device) for _ in range(n - len(part))]
                for part, n in zip(packed, most)]

    @torch.no_grad()
    def fill_fixed_logprobs(self, packed: list[list[MicroBatch]]) -> None:
        """pi_prox (the policy at the start of this step, docs/architecture.md rule 4) and the reference policy."""
        # pi_prox (decoupled) and tis_cap's pi_old are the start-of-step log-probs of every token; with
        # one update per step the loss forward gives them itself (no update has happened yet), so only
        # several updates pay a forward pass for them.
        several = self.algo.minibatches * self.algo.ppo_epochs > 1
        need_prox = several and (self.algo.objective == "decoupled" and self.algo.prox == "recompute"
                                 or self.algo.tis_cap is not None)
        for mb in (mb for part in packed for mb in part):
            if need_prox:
                mb.prox_logp = self._logprobs(self.model, mb)[0].float()
            if self.ref_model is not None:
                mb.ref_logp = self._logprobs(self.ref_model, mb)[0].float()

    def accumulate(self, part: list[MicroBatch], theta_version: float, step: StepSums) -> None:
        """Forward and backward every micro-batch of a mini-batch; after an out-of-memory error, halve
        the micro-batches and start over. The normalisers are global, so the ranks' losses add up to
        the whole mini-batch's (gradients summed: FSDP2 divide factor 1)."""
        local = torch.tensor([sum(mb.completion_tokens + mb.aside_tokens for mb in part),
                              sum(mb.rows + mb.aside_rows for mb in part)], dtype=torch.float64)
        tokens, seqs = self.collective.sum_(local).tolist()
        totals = Totals(tokens=tokens, seqs=seqs, constant=self.loss_constant)
        while True:
            try:
                self._accumulate(part, totals, theta_version, step)
                return
            except torch.cuda.OutOfMemoryError:
                if self.collective.size > 1:  # one rank cannot re-split alone: the others' collectives wait
                    raise UserError("out of memory in a micro-batch on one rank; lower train.micro_batch_tokens "
                                    "or enable model.gradient_checkpointing") from None
                part = self._split_after_oom(part)

    def optimizer_step(self, step: StepSums) -> None:
        """Clip the accumulated gradients and step the optimizer (a non-finite norm skips it)."""
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        norm = losses.grad_norm_clip(self.params, self.algo.grad_clip)
        if isinstance(norm, DTensor):  # sharded gradients: the global norm, the same on every rank
            norm = norm.full_tensor()
        self._optimizer_step(norm)
        if self.working is not None:
            self.working.refresh()
        # Freed now, or a full model's worth of gradients stays resident through generation.
        self.optimizer.zero_grad(set_to_none=True)
        step.norms.append(norm)
        step.updates += 1

    def _accumulate(self, part: list[MicroBatch], totals: Totals, theta_version: float, step: StepSums) -> None:
        """Forward and backward every micro-batch of a mini-batch; gradients add up."""
        self.optimizer.zero_grad(set_to_none=True)
        part_sums = StepSums()
        for mb in part:
            logp, entropy = self._logprobs(self.model, mb)
            loss, stats = micro_loss(self.algo, mb, logp.float(), totals, self.version, theta_version)
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            stats.update(loss=loss.detach(), entropy=(entropy * mb.loss_mask).sum(), tokens=mb.loss_mask.sum())
            part_sums.add({key: value.float() for key, value in stats.items()})
        step.add(part_sums.sums)  # only a mini-batch that completed counts

    def _split_after_oom(self, part: list[MicroBatch]) -> list[MicroBatch]:
        """Out of memory in a micro-batch: halve every micro-batch (and the budget) and retry."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.working is not None:
            self.working.drop_grads()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        if all(mb.input_ids.shape[0] == 1 for mb in part):
            raise UserError("out of memory on a single sequence; lower data.max_prompt_tokens or "
                            "generation.max_new_tokens, or enable model.gradient_checkpointing")
        self.oom_retries += 1
        self.micro_batch_tokens = max(1, self.micro_batch_tokens // 2)
        return [half for mb in part for half in mb.halves()]

    def _optimizer_step(self, norm: torch.Tensor) -> None:
        # Intentional host sync, once per optimizer step: a non-finite gradient must skip the update.
        finite = bool(torch.isfinite(norm))
        if self.scaler:
            self.scaler.step(self.optimizer)  # skips the update itself when the unscaled grads overflowed
            self.scaler.update()  # and then halves the scale
        elif finite:
            self.optimizer.step()
        if not finite:
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_updates += 1
            self.consecutive_skips += 1
            # fp16 loss scaling overflows a few times by design while it finds its scale (each skip
            # halves it), so it is allowed that many more skips in a row before the run stops.
            limit = MAX_CONSECUTIVE_SKIPS + (SCALER_CALIBRATION_SKIPS if self.scaler else 0)
            if self.consecutive_skips >= limit:
                raise NonFiniteError(f"{self.consecutive_skips} consecutive updates had a non-finite loss or "
                                     "gradient; lower algo.lr or check the reward function")
            return  # the learning-rate schedule counts updates, not attempts
        self.consecutive_skips = 0
        self.scheduler.step()

    def summary(self, packed: list[list[MicroBatch]], step: StepSums) -> dict[str, float]:
        """The step's metrics. Reads every device-side sum back at once: the step's one host sync."""
        total = read_back(step, self.collective)  # over all ranks
        mbs = [mb for part in packed for mb in part if not mb.filler]
        real, padded, positions, count, aside = self._global_counts(mbs)
        # train_positions: what the forward computed in its layout; padding_frac: of the padded rows.
        return {**step_figures(total, step.updates), "lr": self.scheduler.get_last_lr()[0], "train_tokens": real,
                "train_positions": positions, "padding_frac": 1.0 - real / padded, "micro_batches": count,
                "aside_samples": aside, "skipped_updates": self.skipped_updates, "oom_retries": self.oom_retries}

    def _global_counts(self, mbs: list[MicroBatch]) -> tuple[int, ...]:
        """Tokens, padded tokens, computed positions, micro-batches and samples set aside, over all ranks."""
        local = [sum(mb.real_tokens for mb in mbs), sum(mb.padded_tokens for mb in mbs),
                 sum(mb.positions for mb in mbs), len(mbs), sum(mb.aside_rows for mb in mbs)]
        if self.collective.size == 1:
            return tuple(local)
        return tuple(int(x) for x in self.collective.sum_(torch.tensor(local, dtype=torch.float64)).tolist())

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), **self.counters()}

    def counters(self) -> dict:
        """Everything but the optimizer's state, as plain data (sharded checkpoints save that apart)."""
        return {"scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict() if self.scaler else None,
                "version": self.version, "skipped_updates": self.skipped_updates}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_counters(state)
        if self.working is not None:  # the masters may have been restored after the copy was made
            self.working.refresh()

    def load_counters(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.version = state["version"]
        self.skipped_updates = state.get("skipped_updates", 0)


def train_step(trainer: Trainer, groups: list[Group],
               publish: Callable[[int], None] = lambda version: None) -> dict[str, float]:
    """Train on a batch of B groups, bump the policy version, `publish` it (weightsync); returns
    the step's metrics with one `time_<phase>` entry per phase."""
    timer = PhaseTimer(trainer.device)
    with timer("advantages", host=True):  # group-normalised rewards (docs/architecture.md rule 4), one per sample
        assign_advantages(groups, trainer.algo.adv_std_norm)
    with timer("pack", host=True):  # mini-batches of whole groups, packed into micro-batches by token budget
        minibatches = trainer.pack(groups)
    with timer("fixed_logprobs"):  # pi_prox (decoupled; tis_cap's pi_old) and the KL reference
        trainer.fill_fixed_logprobs(minibatches)
    sums = StepSums()
    updates = trainer.algo.ppo_epochs * len(minibatches)
    for epoch in range(trainer.algo.ppo_epochs):
        for k, part in enumerate(minibatches):
            # The policy's version at this update, between v and v+1 (loglinear pi_prox needs it).
            theta_version = trainer.version + (epoch * len(minibatches) + k) / updates
            with timer("loss"):  # forward + backward of every micro-batch; gradients add up
                trainer.accumulate(part, theta_version, sums)
            with timer("optimizer"):  # clip, step (or skip a non-finite update), schedule
                trainer.optimizer_step(sums)
    trainer.version += 1
    with timer("publish"):  # stage the new weights for the generator (no host wait)
        publish(trainer.version)
    metrics = trainer.summary(minibatches, sums)  # the step's one host sync
    check_gap(metrics["logprob_gap_max"], trainer.max_logprob_gap, trainer.version)
    return {**metrics, **{f"time_{phase}": s for phase, s in timer.take().items()}}


def check_gap(gap: float, bound: float, version: int) -> None:
    """Stop the run when the generator's and the trainer's log-probs differ by more than `bound` nats
    on a token the trainer's version sampled: it samples from another model than the one trained."""
    if gap > bound:
        raise UserError(f"step {version}: logprob_gap_max {gap:.3g} nats exceeds train.max_logprob_gap={bound:g}: "
                        "the generator's log-probs differ from the trainer's; try generation.backend=hf")


def assign_advantages(groups: list[Group], std_norm: bool) -> None:
    rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float32)  # (B, G), on the CPU
    advantages = losses.group_advantages(rewards, std_norm).tolist()  # CPU tensors: no device sync
    for group, row in zip(groups, advantages):
        for sample, advantage in zip(group.samples, row):
            sample.advantage = advantage
