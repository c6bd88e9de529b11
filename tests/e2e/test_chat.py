"""Fine-tuning on conversations end to end (data=chat): a random Qwen2 with a ChatML tokenizer
fine-tuned on generated conversations trains the same in one process, under dp2 (with
gradient accumulation), tp2 and pp2 (losses and held-out losses within 1e-5: each micro-batch
counts its own assistant tokens, weighed into the global batch's mean); a resume mid-epoch on
another layout continues the same conversations; with data.packing=false (a row a
conversation, length-bucketed, each micro-batch cut to its longest) likewise under dp2, pp2,
cp2 and tp2 with sequence parallelism, and a resume goes on in the bucketed order; a bad
record stops the start in one line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.e2e

STEPS = ["model=qwen2", "data=chat", "model.block_size=128", "trainer.max_steps=6", "trainer.global_batch_size=12",
         "trainer.log_every=1", "trainer.eval_every=3", "trainer.eval_batches=2", "optim.warmup_steps=2",
         "optim.lr=1e-3", "logger=none"]


def save_chat_model(out: Path) -> Path:
    """A random Qwen2ForCausalLM (tied, q/k/v biases) with a ChatML tokenizer trained here."""
    import transformers

    from data_pipelines.chat_synthetic import write_chat_tokenizer

    write_chat_tokenizer(out)
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=2176, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      tie_word_embeddings=True)
    transformers.Qwen2ForCausalLM(config).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def chat_setup(tmp_path_factory):
    from data_pipelines.chat_synthetic import write_conversations

    root = tmp_path_factory.mktemp("chat")
    model = save_chat_model(root / "model")
    return [f"model.init_from={model}", f"data.path={write_conversations(root / 'chats.jsonl', 600)}"]


@pytest.fixture(scope="module")
def one_process(run_zoo, chat_setup, tmp_path_factory):
    return run_zoo(*STEPS, *chat_setup, "parallel=ddp", "trainer.micro_batch_size=12", "checkpoint.every=3",
                   "trainer.sample_tokens=8", run_dir=tmp_path_factory.mktemp("chat_ref") / "run")


def test_the_start_line_counts_conversations_and_the_sample_is_a_chat_turn(one_process, chat_setup):
    out = one_process.stdout + one_process.stderr
    assert "600 conversations" in out and "target tokens (data.train_on=assistant)" in out
    first_user = json.loads(Path(chat_setup[1].split("=", 1)[1]).read_text().splitlines()[0])["messages"]
    prompt = next(m["content"] for m in first_user if m["role"] == "user")
    assert one_process.summary["sample_prompt"] == prompt  # rendered as a user turn, the answer generated after
    assert one_process.summary["sample"].startswith(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
    data = one_process.summary["data"]
    assert data["conversations"] == 600 and data["supervised_tokens"] > 0


@pytest.mark.parametrize("layout", [["parallel=ddp", "parallel.dp=2", "trainer.micro_batch_size=2"],
                                    ["parallel=tp", "trainer.micro_batch_size=4"], ["parallel=pp"]],
                         ids=["dp2-accum3", "tp2", "pp2"])
def test_fine_tuning_matches_one_process(run_zoo, chat_setup, one_process, layout):
    run = run_zoo(*STEPS, *chat_setup, *layout, "trainer.sample_tokens=0")
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(one_process.losses()), rtol=1e-5, atol=0)
    torch.testing.assert_close(torch.tensor(list(run.evals().values())),
                               torch.tensor(list(one_process.evals().values())), rtol=1e-5, atol=0)


def test_a_resume_mid_epoch_on_another_layout_continues_the_same_conversations(run_zoo, chat_setup, one_process):
    step3 = one_process.run_dir / "checkpoints" / "step_0000003"
    resumed = run_zoo(*STEPS, *chat_setup, "parallel=ddp", "parallel.dp=2", "trainer.micro_batch_size=3",
                      f"resume={step3}", "trainer.sample_tokens=0")
    want = {m["step"]: m["loss"] for m in one_process.metrics if "loss" in m and m["step"] > 3}
    got = {m["step"]: m["loss"] for m in resumed.metrics if "loss" in m and m["step"] > 3}
    assert sorted(got) == [4, 5, 6]
    torch.testing.assert_close(torch.tensor([got[s] for s in sorted(got)]), torch.tensor([want[s] for s in sorted(got)]),
                               rtol=1e-5, atol=0)


@pytest.fixture(scope="module")
def unpacked(run_zoo, chat_setup, tmp_path_factory):
    return run_zoo(*STEPS, *chat_setup, "data.packing=false", "parallel=ddp", "trainer.micro_batch_size=12",
                   "checkpoint.every=3", "trainer.sample_tokens=0", run_dir=tmp_path_factory.mktemp("unpacked") / "run")


def test_unpacked_conversations_are_ordered_by_length_and_cut_to_each_micro_batchs_longest(unpacked):
    """data.packing=false: a row a conversation, the rows in length buckets, a micro-batch as
    long as its longest row: far less padding than a block a conversation."""
    out = unpacked.stdout + unpacked.stderr
    assert "conversations of up to 128 tokens, a row each, a micro-batch cut to its longest (data.packing=false: " in out
    state = json.loads((unpacked.run_dir / "checkpoints" / "step_0000003" / "state.json").read_text())
    assert state["data_order"] == "bucketed-pools"
    rows = unpacked.summary["data"]
    block_padding = rows["padding_tokens"] / (rows["conversations"] * 129)  # the rows' padding to the block
    assert unpacked.summary["padding_efficiency"] > 1.5 * (1 - block_padding), (unpacked.summary["padding_efficiency"],
                                                                                 block_padding)


@pytest.mark.parametrize("layout", [["parallel=ddp", "parallel.dp=2", "trainer.micro_batch_size=2"], ["parallel=pp"],
                                    ["parallel=cp", "trainer.micro_batch_size=12"],
                                    ["parallel=tp", "parallel.sequence_parallel=true", "trainer.micro_batch_size=4"]],
                         ids=["dp2-accum3", "pp2", "cp2", "tp2-sp"])
def test_unpacked_conversations_train_as_one_process(run_zoo, chat_setup, unpacked, layout):
    """Micro-batches of other lengths on every layout (a pipeline takes each one's shape; cp and
    sp round the length up to what they split): the same losses as one process."""
    run = run_zoo(*STEPS, *chat_setup, "data.packing=false", *layout, "trainer.sample_tokens=0")
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(unpacked.losses()), rtol=1e-5, atol=0)
    torch.testing.assert_close(torch.tensor(list(run.evals().values())),
                               torch.tensor(list(unpacked.evals().values())), rtol=1e-5, atol=0)


def test_an_unpacked_run_resumes_its_bucketed_order_on_another_layout(run_zoo, chat_setup, unpacked):
    resumed = run_zoo(*STEPS, *chat_setup, "data.packing=false", "parallel=ddp", "parallel.dp=2",
                      "trainer.micro_batch_size=3", f"resume={unpacked.run_dir / 'checkpoints' / 'step_0000003'}",
                      "trainer.sample_tokens=0")
    want = {m["step"]: m["loss"] for m in unpacked.metrics if "loss" in m and m["step"] > 3}
    got = {m["step"]: m["loss"] for m in resumed.metrics if "loss" in m and m["step"] > 3}
    assert sorted(got) == [4, 5, 6]
    torch.testing.assert_close(torch.tensor([got[s] for s in sorted(got)]), torch.tensor([want[s] for s in sorted(got)]),
                               rtol=1e-5, atol=0)


def test_a_bad_record_stops_the_start_in_one_line(run_zoo, chat_setup, tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    bad.write_text(json.dumps(good) + "\n" + json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n")
    run = run_zoo(*STEPS, chat_setup[0], f"data.path={bad}", "parallel=ddp", "trainer.micro_batch_size=12", check=False,
                  run_dir=tmp_path / "run")
    assert run.returncode == 2, run.stderr[-2000:]
    errors = [line for line in (run.stdout + run.stderr).splitlines() if line.startswith("zoo: error:")]
    assert errors == [f"zoo: error: {bad} line 2: turn 0 has the unknown role 'robot'; use one of system, user, "
                      f"assistant, tool"], run.stderr[-2000:]
    assert "Traceback" not in run.stderr
