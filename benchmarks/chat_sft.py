"""Supervised fine-tuning on conversations (data=chat): does a tiny imported model learn, and what
does chat data cost against raw text?

1. For each of Qwen2, Qwen3 and Mistral: a tiny random transformers model of that type (its
   own pieces: Qwen2's q/k/v biases, Qwen3's per-head q/k norms and wider heads, Mistral's
   window) with a ChatML tokenizer trained here, saved to a directory, imported
   (model.init_from) and fine-tuned on the generated conversation set (reverse or sort a few
   words: the answer is a function of the prompt) for `--steps` steps; the held-out loss on the
   assistant's tokens (the masked mean) at every `--eval-every`, against `--target`.
2. Tokens/s of data=chat (conversations packed whole, document masking, target masks, the
   loss weighed over the global batch) against data=files of the same conversations rendered
   as plain text (every token a target, no masks, no weights), same model, block, batch: the
   median step time of `--speed-steps` steps (the first 3 left out), as tokens a second of a
   block's tokens (padding included: what the device computes).

    python benchmarks/chat_sft.py [--steps 200 --target 1.0 --speed-steps 40]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = {"qwen2": dict(tie_word_embeddings=True), "qwen3": dict(tie_word_embeddings=True, head_dim=64),
         "mistral": dict(tie_word_embeddings=False, sliding_window=256)}


def save_model(kind: str, out: Path) -> Path:
    import torch
    import transformers

    from data_pipelines.chat_synthetic import write_chat_tokenizer
    from zoo.families.llama.hf import CLASSES, CONFIGS

    write_chat_tokenizer(out)
    torch.manual_seed(0)
    config = getattr(transformers, CONFIGS[kind])(vocab_size=2176, hidden_size=128, intermediate_size=352,
                                                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                                  max_position_embeddings=256, **KINDS[kind])
    getattr(transformers, CLASSES[kind])(config).save_pretrained(str(out))
    return out


def train(run_dir: Path, *overrides: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "zoo.train", f"hydra.run.dir={run_dir}", "logger=none", "trainer.progress=false",
           *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"metrics": metrics, "summary": json.loads((run_dir / "summary.json").read_text()), "stdout": proc.stdout}


def median_step_s(run) -> float:
    times = [m["step_time_s"] for m in run["metrics"] if "step_time_s" in m][3:]
    return statistics.median(times)


def rendered_text(chats: Path, tokenizer_dir: Path, out: Path) -> Path:
    """The conversations as documents of plain text, each rendered by the same template."""
    from data_pipelines.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir))
    with out.open("w") as f:
        for line in chats.read_text().splitlines():
            text = tok.apply_chat_template(json.loads(line)["messages"], tokenize=False)
            f.write(json.dumps({"text": text}) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--target", type=float, default=1.0, help="the held-out loss on the answers to fall below")
    ap.add_argument("--speed-steps", type=int, default=40)
    ap.add_argument("--kinds", default="qwen2,qwen3,mistral")
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    common = ["data=chat", "model=llama", "model.block_size=128", "trainer.global_batch_size=16",
              "trainer.micro_batch_size=8", "optim=sft", "optim.lr=1e-3", "optim.min_lr=1e-4", "trainer.log_every=1"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print("held-out loss on the assistant's tokens (masked mean), tiny random imports fine-tuned on 2,000 generated "
              f"conversations, global batch 16, block 128, lr 1e-3, {a.steps} steps:")
        for kind in a.kinds.split(","):
            model = save_model(kind, tmp / kind)
            run = train(tmp / f"run-{kind}", *common, f"model.init_from={model}", f"trainer.max_steps={a.steps}",
                        f"trainer.eval_every={a.eval_every}", "trainer.sample_tokens=16")
            evals = [(m["step"], m["eval_loss"]) for m in run["metrics"] if "eval_loss" in m]
            below = next((s for s, v in evals if v < a.target), None)
            curve = ", ".join(f"{s}: {v:.3f}" for s, v in evals)
            print(f"  {kind}: {curve}; below {a.target} at step {below if below else 'never'} "
                  f"({'met' if below else 'NOT met'}); sample: {run['summary'].get('sample', '')[-60:]!r}")
        from zoo.families.chat_data import built_in_conversations

        model = tmp / "qwen2" if (tmp / "qwen2").exists() else save_model("qwen2", tmp / "qwen2")
        chats = Path(built_in_conversations(None))
        text = rendered_text(chats, model, tmp / "rendered.jsonl")
        speed = ["model.block_size=128", "model=llama", f"model.init_from={model}", "trainer.global_batch_size=16",
                 "trainer.micro_batch_size=8", f"trainer.max_steps={a.speed_steps}", "trainer.log_every=1",
                 "trainer.eval_batches=0", "trainer.sample_tokens=0"]
        chat = train(tmp / "speed-chat", *speed, "data=chat")
        plain = train(tmp / "speed-text", *speed, "data=files", f"data.path={text}", f"data.tokenizer={model}")
        c, p = median_step_s(chat), median_step_s(plain)
        tokens = 16 * 128
        data = chat["summary"]["data"]
        padding = data["padding_tokens"] / ((data["train_blocks"] + data["eval_blocks"]) * 129)
        print(f"tokens/s at block 128, global batch 16 (median step of {a.speed_steps}, first 3 left out): data=chat "
              f"{tokens / c:,.0f} ({c * 1000:.0f} ms), raw text {tokens / p:,.0f} ({p * 1000:.0f} ms): chat / text "
              f"{p / c:.3f}x (target 0.95); the packed blocks are {padding:.1%} padding (first fit over "
              f"{data['conversations']:,} conversations), so conversation tokens/s {(p / c) * (1 - padding):.3f}x")


if __name__ == "__main__":
    main()
