"""Training throughput: zoo's GPT (or Llama) through the DeepSpeed engine, the path
`python -m zoo.train` takes, against transformers' GPT2LMHeadModel (or LlamaForCausalLM)
with a plain torch loop, same dimensions, batch, AdamW, dtype and thread count, in one run.

    python benchmarks/gpt_vs_hf.py [--layers 4 --embd 256 --heads 4 --block 256 --batch 8 --steps 20]
    python benchmarks/gpt_vs_hf.py --family llama [--kv-heads 2 --inter 704]   # GQA, SwiGLU, RoPE

Prints tokens/s of both and the ratio zoo / HF (target >= 1.0: the engine adds no overhead).
"""
from __future__ import annotations

import argparse
import os
import socket
import time

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def interleaved(steps_a, steps_b, steps: int, rounds: int = 5, warmup: int = 2):
    """Median seconds per step of a and b, timed in alternating rounds so that a busy
    machine slows both alike."""
    for _ in range(warmup):
        steps_a()
        steps_b()
    per_round = max(1, steps // rounds)
    times = {0: [], 1: []}
    for _ in range(rounds):
        for i, step in enumerate((steps_a, steps_b)):
            t0 = time.perf_counter()
            for _ in range(per_round):
                step()
            times[i].append((time.perf_counter() - t0) / per_round)
    return [sorted(t)[len(t) // 2] for t in (times[0], times[1])]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--family", choices=["gpt", "llama"], default="gpt")
    p.add_argument("--kv-heads", type=int, default=2, help="llama: grouped-query attention's key/value heads")
    p.add_argument("--inter", type=int, default=704, help="llama: the SwiGLU MLP's intermediate size")
    a = p.parse_args()
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    import deepspeed

    from zoo import lean_start
    from zoo.build import build_model
    from zoo.engine import param_groups

    lean_start.skip_shm_comm_op()  # as zoo's ranks start
    lean_start.skip_muon_import({})
    deepspeed.init_distributed("gloo")
    threads = torch.get_num_threads()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, a.vocab, (a.batch, a.block), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.block), generator=g)

    shape, hf, name = models(a)
    hf = hf.to(dtype)
    model = build_model(shape, seed=0, device=torch.device("cpu"))
    ds = {"train_batch_size": a.batch, "train_micro_batch_size_per_gpu": a.batch, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1, "torch_adam": True}},
          "bf16": {"enabled": a.dtype == "bf16"}, "zero_optimization": {"stage": 0}, "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, config=ds, model_parameters=param_groups(model, 0.1))

    def zoo_step():
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()

    opt = torch.optim.AdamW(param_groups(hf, 0.1), lr=1e-4)

    def hf_step():
        loss = hf(input_ids=x, labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    hf_s, zoo_s = interleaved(hf_step, zoo_step, a.steps)
    hf_tps, zoo_tps = a.batch * a.block / hf_s, a.batch * a.block / zoo_s
    extra = f" KV={a.kv_heads} FFN={a.inter}" if a.family == "llama" else ""
    print(f"{a.family} L={a.layers} C={a.embd} H={a.heads}{extra} T={a.block} V={a.vocab}, batch {a.batch}, "
          f"{a.dtype}, {threads} threads, median of 5 alternating rounds over {a.steps} steps each")
    print(f"huggingface {name} + torch AdamW: {hf_tps:,.0f} tokens/s")
    print(f"zoo {a.family} + DeepSpeed engine: {zoo_tps:,.0f} tokens/s")
    print(f"ratio zoo / huggingface: {zoo_tps / hf_tps:.3f}")


def models(a):
    """(zoo's shape, transformers' model, its class name) of the same dimensions."""
    if a.family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        from zoo.models.llama import llama_shape

        shape = llama_shape("tiny", a.vocab, n_layer=a.layers, n_head=a.heads, n_kv_head=a.kv_heads, n_embd=a.embd,
                            intermediate_size=a.inter, block_size=a.block)
        hf = LlamaForCausalLM(LlamaConfig(vocab_size=a.vocab, hidden_size=a.embd, intermediate_size=a.inter,
                                          num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                          num_key_value_heads=a.kv_heads, max_position_embeddings=a.block,
                                          tie_word_embeddings=False, attn_implementation="sdpa"))
        return shape, hf, "LlamaForCausalLM"
    from transformers import GPT2Config, GPT2LMHeadModel

    from zoo.models.gpt import gpt_shape

    shape = gpt_shape("tiny", a.vocab, n_layer=a.layers, n_head=a.heads, n_embd=a.embd, block_size=a.block)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=a.vocab, n_positions=a.block, n_embd=a.embd, n_layer=a.layers,
                                    n_head=a.heads, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
                                    attn_implementation="sdpa"))
    return shape, hf, "GPT2LMHeadModel"


if __name__ == "__main__":
    main()
