"""wandb tracking without the network: a real 2-rank run with logger=wandb and no credentials
logs offline into the run directory (read back from wandb's own .wandb file: the run's name,
group, config, history and summary), only rank 0 opens a run, and no process of the run
connects anywhere (watched with strace and a tripwire wandb server); logger=none leaves no
wandb files."""
from __future__ import annotations

import json
import shutil
import socket
import struct
import sys
from pathlib import Path

import pytest

FAST = ["debug=fast", "trainer.sample_tokens=0", "trainer.eval_batches=1", "optim.warmup_steps=2",
        "trainer.global_batch_size=8", "trainer.micro_batch_size=2", "trainer.max_steps=4", "trainer.log_every=2"]


# -- units ------------------------------------------------------------------------------------

from tests.unit.observe.test_tracking import outside_traffic


def wandb_records(path: Path):
    """The records of a .wandb file (wandb's LevelDB-style log of protobuf records: a 7-byte
    header, then 32 KiB blocks of chunks, each with a 7-byte header: crc32, length, type)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", data[:7]
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little left in the block for a chunk header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def read_offline_run(path: Path) -> dict:
    run, history, summary = None, [], {}
    for r in wandb_records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run = r.run
        elif kind == "history":  # a history row updates the summary too, in the order of the records
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in r.history.item})
            summary.update({k: v for k, v in history[-1].items() if not k.startswith("_")})
        elif kind == "summary":
            summary.update({item.key: json.loads(item.value_json) for item in r.summary.update if item.key})
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    return {"name": run.display_name, "group": run.run_group, "project": run.project, "config": config,
            "history": history, "summary": summary}


@pytest.fixture(scope="module")
def offline(run_zoo, tmp_path_factory):
    """2 ranks (ZeRO-1, dp 2), logger=wandb, no credentials, under strace when it is there,
    with WANDB_BASE_URL and the HTTP(S) proxies pointing at a tripwire socket."""
    tmp = tmp_path_factory.mktemp("wandb_offline")
    (tmp / "netrc").write_text("")
    tripwire = socket.socket()
    tripwire.bind(("127.0.0.1", 0))
    tripwire.listen(16)
    url = f"http://127.0.0.1:{tripwire.getsockname()[1]}"
    env = {"NETRC": str(tmp / "netrc"), "WANDB_BASE_URL": url,
           "HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url}
    run_dir = tmp / "run"
    argv = ["-m", "zoo.train", f"hydra.run.dir={run_dir}", "trainer.progress=false", "parallel=zero1",
            "logger=wandb", *FAST]
    strace = shutil.which("strace")
    prefix = [strace, "-f", "--seccomp-bpf", "-e", "trace=connect,sendto,sendmmsg", "-s", "64",
              "-o", str(tmp / "strace.log")] if strace else []
    unset = ["env", "-u", "WANDB_API_KEY", "-u", "WANDB_MODE"]  # no credentials, no mode: zoo decides
    run = run_zoo(cmd=[*unset, *prefix, sys.executable, *argv], run_dir=run_dir, env=env)
    tripwire.setblocking(False)
    try:
        tripwire.accept()
        run.tripped = True
    except BlockingIOError:
        run.tripped = False
    tripwire.close()
    run.strace_log = (tmp / "strace.log").read_text() if strace else None
    return run


def test_offline_run_logs_config_history_and_summary(offline):
    run_dirs = list((offline.run_dir / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1, run_dirs  # rank 1 never opened a run
    assert "offline" in offline.stderr and "wandb sync" in offline.stderr
    # zoo's one line says where it logs; wandb's own three (offline, saved in, `wandb leet`) are not printed
    assert not [line for line in offline.stderr.splitlines() if line.startswith("wandb:")], offline.stderr[-2000:]
    logged = read_offline_run(next(run_dirs[0].glob("run-*.wandb")))
    assert (logged["name"], logged["group"], logged["project"]) == ("gpt-tiny_tp1-pp1-dp2_zero1", "gpt-tiny", "zoo")
    config = logged["config"]
    assert config["model"]["family"] == "gpt" and config["parallel"]["zero_stage"] == 1
    assert (config["model"]["size"], config["model"]["n_layer"], config["model"]["n_embd"]) == ("tiny", 4, 128)
    assert config["trainer"]["max_steps"] == 4 and config["layout"] == "tp1-pp1-dp2_zero1"
    metrics = offline.metrics
    assert [h["_step"] for h in logged["history"]] == [m["step"] for m in metrics] == [2, 4]
    for h, m in zip(logged["history"], metrics):
        for key in ("loss", "lr", "tokens_per_s", "mfu", "comm_share", "data_wait_share", "peak_mem_bytes"):
            assert h[key] == pytest.approx(m[key], rel=1e-12), key
    assert logged["summary"]["final_loss"] == pytest.approx(offline.summary["final_loss"])
    assert logged["summary"]["eval_loss"] == pytest.approx(offline.summary["eval_loss"])
    # the largest rank's peak memory, and which rank (#49)
    assert (logged["summary"]["peak_mem_bytes"], logged["summary"]["peak_mem_rank"]) == \
        (offline.summary["peak_mem_bytes"], offline.summary["peak_mem_rank"])
    # the run's figures, not the last step's: the summary is written after the last history row
    for key in ("tokens_per_s", "mfu"):
        assert logged["summary"][key] == pytest.approx(offline.summary[key], rel=1e-9), key
    # the same run directory resumed later continues this wandb run
    assert (offline.run_dir / "wandb_run_id").read_text().strip() in run_dirs[0].name


def test_offline_run_touches_no_network(offline):
    assert not offline.tripped, "a process connected to the wandb server / proxy address"
    if offline.strace_log is None:
        pytest.skip("strace is not installed: only the tripwire was checked")
    assert "connect(" in offline.strace_log  # strace saw the ranks' own (local) connections
    assert outside_traffic(offline.strace_log) == []


def test_the_comm_timer_sees_zero_traffic(offline):
    """ZeRO-1 over 2 ranks: DeepSpeed's gradient reduction and parameter all-gather, made
    through deepspeed.comm, are in the communication time."""
    calls = set().union(*(m["comm_s_by_call"] for m in offline.metrics))
    assert calls & {"all_gather_into_tensor", "_all_gather_base", "all_gather"}, calls
    assert calls & {"all_reduce", "reduce_scatter_tensor", "reduce_scatter", "reduce"}, calls


def test_logger_none_leaves_no_wandb_files(run_zoo):
    run = run_zoo(*FAST, "logger=none")
    assert not (run.run_dir / "wandb").exists() and not (run.run_dir / "wandb_run_id").exists()
    assert "wandb" not in run.stdout + run.stderr
