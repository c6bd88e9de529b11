"""The training loop of one rank: steps through the DeepSpeed engine, periodic metrics,
held-out evaluation, a generated sample and the run summary.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from data_pipelines.lm import PackedBlocks, unigram_perplexity
from data_pipelines.schedule import SampleStream, micro_batch_start
from zoo.build import build_gpt, count_parameters
from zoo.config.schema import Config
from zoo.consolidate import consolidated_state_dict
from zoo.engine import initialize_engine, micro_batching
from zoo.metrics import RunLog, peak_memory_bytes
from zoo.models import model_dims, padded_vocab
from zoo.parallel.topology import Layout, tp_group


class Trainer:
    def __init__(self, cfg: Config, layout: Layout, grid, blocks: PackedBlocks, tokenizer_dir: str,
                 run_dir: Path, device: torch.device):
        from transformers import AutoTokenizer

        self.cfg, self.layout, self.grid, self.blocks, self.device = cfg, layout, grid, blocks, device
        self.rank = dist.get_rank()
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.shape = model_dims(cfg.model, padded_vocab(len(self.tokenizer), cfg.model))
        torch.manual_seed(cfg.trainer.seed)
        self.engine = initialize_engine(self._build_model(), cfg, layout, grid)
        self.pipelined = layout.pp > 1
        self.micro_batch_size, self.grad_accum = micro_batching(cfg, layout)
        self.dp_rank = grid.get_data_parallel_rank()
        self.dp_group = grid.get_data_parallel_group()
        self.stream = SampleStream(len(blocks.train), cfg.trainer.seed)
        self.step = 0
        self.consumed = 0  # samples, globally: the layout-free data position
        self.log = RunLog(run_dir, active=self.rank == 0, total_steps=cfg.trainer.max_steps,
                          progress=cfg.trainer.progress)

    def _build_model(self):
        cfg, build = self.cfg, dict(seed=self.cfg.trainer.seed, device=self.device, tp_group=tp_group(self.grid),
                                    sequence_parallel=self.cfg.parallel.sequence_parallel)
        if self.layout.pp > 1:
            from zoo.parallel.pipeline import gpt_pipeline

            return gpt_pipeline(self.shape, self.layout, partition_method=cfg.parallel.partition_method,
                                activation_checkpointing=cfg.model.activation_checkpointing, **build)
        return build_gpt(self.shape, activation_checkpointing=cfg.model.activation_checkpointing, **build)

    # -- data -------------------------------------------------------------------------------
    def _batch(self, rows: np.ndarray, indices: np.ndarray):
        block = torch.from_numpy(np.asarray(rows[indices], dtype=np.int64))
        block = block.to(self.device, non_blocking=True)
        return block[:, :-1], block[:, 1:]

    def micro_batch(self, micro: int):
        start = micro_batch_start(self.consumed, micro, global_batch=self.cfg.trainer.global_batch_size,
                                  micro_batch=self.micro_batch_size, dp_rank=self.dp_rank, dp_size=self.layout.dp)
        return self._batch(self.blocks.train, self.stream.indices(start, self.micro_batch_size))

    # -- steps ------------------------------------------------------------------------------
    def _dp_mean(self, value: torch.Tensor) -> float:
        value = value.detach().float().clone()
        if self.layout.dp > 1:
            dist.all_reduce(value, group=self.dp_group)
            value /= self.layout.dp
        return value.item()

    def train_step(self) -> torch.Tensor:
        """One optimizer step (grad_accum micro-batches); returns this rank's mean loss."""
        self.engine.train()
        if self.pipelined:  # the pipeline engine runs its schedule over all micro-batches
            loss = self.engine.train_batch(iter([self.micro_batch(m) for m in range(self.grad_accum)]))
            self.consumed += self.cfg.trainer.global_batch_size
            self.step += 1
            return loss.detach().float()
        total = torch.zeros((), device=self.device)
        for micro in range(self.grad_accum):
            x, y = self.micro_batch(micro)
            loss = self.engine(x, y)
            self.engine.backward(loss)
            self.engine.step()
            total += loss.detach().float()
        self.consumed += self.cfg.trainer.global_batch_size
        self.step += 1
        return total / self.grad_accum

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean held-out loss per token; each dp rank takes a disjoint share of the batches."""
        mb = self.micro_batch_size
        self.engine.eval()
        per_round = mb * self.layout.dp
        rounds = min(self.cfg.trainer.eval_batches, len(self.blocks.eval) // per_round)
        if not rounds:
            return float("nan")
        batches = [self._batch(self.blocks.eval, np.arange(r * per_round + self.dp_rank * mb,
                                                          r * per_round + (self.dp_rank + 1) * mb))
                   for r in range(rounds)]
        if self.pipelined:  # already averaged over the data-parallel group
            return self.engine.eval_batch(iter(batches), num_micro_batches=rounds).float().item()
        total = sum(self.engine(x, y).float() for x, y in batches)
        return self._dp_mean(total / rounds)

    @torch.no_grad()
    def sample(self, state: dict) -> str:
        """A short continuation of a fixed prompt by the plain model loaded with the
        consolidated weights (rank 0 only)."""
        n = self.cfg.trainer.sample_tokens
        if n <= 0 or self.rank != 0:
            return ""
        from zoo.models.gpt import GPT

        model = GPT(self.shape)
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert set(missing) <= {"lm_head.weight"} and not unexpected, (missing, unexpected)
        model.eval()
        ids = torch.tensor([self.tokenizer("The for statement")["input_ids"]])
        out = model.generate(ids, n, generator=torch.Generator().manual_seed(self.cfg.trainer.seed))
        return self.tokenizer.decode(out[0].tolist())

    # -- the run ----------------------------------------------------------------------------
    def fit(self) -> None:
        t, tokens_per_step = self.cfg.trainer, self.cfg.trainer.global_batch_size * self.shape.block_size
        self.log.write(f"zoo: {self.cfg.model.family}-{self.cfg.model.size} "
                       f"({count_parameters(self.shape):,} parameters) on {self.layout.name}, "
                       f"global batch {t.global_batch_size} = micro {self.micro_batch_size} x accum "
                       f"{self.grad_accum} x dp {self.layout.dp}, {self.cfg.precision.dtype}")
        started = time.perf_counter()
        window_start, window_steps, train_time, loss = time.perf_counter(), 0, 0.0, float("nan")
        while self.step < t.max_steps:
            t0 = time.perf_counter()
            local_loss = self.train_step()
            train_time += time.perf_counter() - t0
            window_steps += 1
            last = self.step == t.max_steps
            if self.step % t.log_every == 0 or last:
                loss = self._dp_mean(local_loss)
                step_time = (time.perf_counter() - window_start) / window_steps
                self.log.step({"step": self.step, "loss": loss, "lr": self.engine.get_lr()[0],
                               "grad_norm": self.engine.get_global_grad_norm(),
                               "tokens_per_s": tokens_per_step / step_time,
                               "samples_per_s": t.global_batch_size / step_time, "step_time_s": step_time,
                               "peak_mem_bytes": peak_memory_bytes(self.device)})
                window_start, window_steps = time.perf_counter(), 0
            self.log.advance(1, None if math.isnan(loss) else loss)
        self.log.close()
        eval_loss = self.evaluate()
        text = ""
        if self.cfg.checkpoint.save_final or t.sample_tokens > 0:
            state = consolidated_state_dict(self.engine.module, self.grid)
            text = self.sample(state)
            if text:
                self.log.write(f"sample: {text!r}")
            if self.cfg.checkpoint.save_final and self.rank == 0:
                save_weights(state, self.log.run_dir / "model.safetensors", self.cfg.model.family)
        local = sum(p.numel() for p in {id(p): p for p in self.engine.module.parameters()}.values())
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, local)
        steps = max(self.step, 1)
        self.log.summary({
            "final_loss": loss, "eval_loss": eval_loss,
            "eval_perplexity": math.exp(eval_loss) if eval_loss < 50 else float("inf"),
            "unigram_perplexity": unigram_perplexity(self.blocks.train, self.blocks.eval, self.shape.vocab_size),
            "tokens_per_s": tokens_per_step * steps / train_time if train_time else 0.0,
            "steps": self.step, "world_size": self.layout.world_size, "tp": self.layout.tp,
            "pp": self.layout.pp, "dp": self.layout.dp, "zero_stage": self.layout.zero_stage,
            "params": count_parameters(self.shape), "params_per_rank": per_rank, "global_batch_size": t.global_batch_size,
            "micro_batch_size": self.micro_batch_size, "grad_accum": self.grad_accum,
            "dtype": self.cfg.precision.dtype, "peak_mem_bytes": peak_memory_bytes(self.device),
            "wall_time_s": time.perf_counter() - started, "sample": text})

    def close(self) -> None:
        self.log.close()


def save_weights(state: dict, path: Path, family: str) -> None:
    """Write consolidated weights atomically as safetensors."""
    from safetensors.torch import save_file

    tmp = path.with_suffix(".tmp")
    save_file(state, str(tmp), metadata={"family": family})
    tmp.replace(path)
