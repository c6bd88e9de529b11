"""What a user sees on the console of a multi-rank run: only zoo's lines from rank 0 (no
DeepSpeed start-up chatter, no rank's duplicate), the start's phases once, ending with the
result block."""
from __future__ import annotations

THIRD_PARTY = ("[WARNING]", "[INFO]", "Using topology", "SEED_LAYERS", "stage=", "Setting accelerator",
               "Attempting to get learning rate", "deepspeed_shm_comm", "gcc ")


def test_a_tp_pp_run_prints_only_zoos_lines_and_ends_with_its_result(trained_3d):
    out = [line for line in (trained_3d.stdout + trained_3d.stderr).splitlines() if line.strip()]
    noise = [line for line in out if any(marker in line for marker in THIRD_PARTY)]
    assert not noise, noise
    others = [line for line in out if not line.startswith(("zoo: ", "step ", "    ", "           "))]
    assert not others, others
    assert sum(line.startswith("zoo: layout tp2-pp2-dp1") for line in out) == 1
    assert "the rank grid goes to topology.txt" in next(line for line in out if line.startswith("zoo: layout "))
    # the source and its size, once (a cache built for this run adds lines on its tokenizing)
    data = [line for line in out if line.startswith("zoo: data: data=")]
    assert len(data) == 1 and data[0].startswith("zoo: data: data=pydoc (the Python documentation inside CPython): ")
    assert " blocks of 128 tokens (" in data[0] and " held out (data.eval_fraction=0.05)" in data[0]
    assert "TP group: [0, 1]" in (trained_3d.run_dir / "topology.txt").read_text()
    import yaml

    model = yaml.safe_load((trained_3d.run_dir / "config.yaml").read_text())["model"]  # real dimensions, not null
    assert (model["size"], model["n_layer"], model["n_head"], model["n_embd"], model["block_size"]) == \
        ("tiny", 4, 4, 128, 128) and model["vocab_size"] % 128 == 0
    stdout = [line for line in trained_3d.stdout.splitlines() if line.strip()]
    block = stdout[next(i for i, line in enumerate(stdout) if line.startswith("zoo: result: ")):]
    assert block[0].startswith("zoo: result: eval loss ") and "perplexity" in block[0]
    assert block[1].startswith("zoo: run: 3 steps, ")
    assert block[2] == (f"zoo: run directory {trained_3d.run_dir}: model.safetensors.index.json (weights, a file "
                        f"per pipeline stage), checkpoints/ "
                        f"(checkpoints), metrics.jsonl (metrics), summary.json (summary), config.yaml (config), "
                        f"topology.txt (rank grid), topology.png (its picture), tokenizer/ (tokenizer)")
    assert block[3] == f"zoo: next: python -m zoo.export {trained_3d.run_dir} {trained_3d.run_dir}/hf"
    assert len(block) == 6 and "resume=auto" in block[-1], "\n".join(block)
    (start,) = [line for line in stdout if line.startswith("zoo: start: ")]
    phases = trained_3d.summary["startup"]
    assert list(phases) == ["validation", "ranks", "process_group", "data", "model", "first_step", "total"], phases
    assert abs(sum(v for k, v in phases.items() if k != "total") - phases["total"]) < 0.01 and phases["first_step"] > 0
    assert start.startswith(f"zoo: start: {phases['total']:.1f} s to the end of the first step (imports and ")
