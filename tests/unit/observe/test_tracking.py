"""wandb tracking without the network: a real 2-rank run with logger=wandb and no credentials
logs offline into the run directory (read back from wandb's own .wandb file: the run's name,
group, config, history and summary), only rank 0 opens a run, and no process of the run
connects anywhere (watched with strace and a tripwire wandb server); logger=none leaves no
wandb files."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

from tests.conftest import REPO
from zoo.config.schema import Config
from zoo.observe.tracking import (
    credentials_configured,
    default_group,
    default_name,
    wandb_mode,
)
from zoo.parallel.topology import Layout

FAST = ["debug=fast", "trainer.sample_tokens=0", "trainer.eval_batches=1", "optim.warmup_steps=2",
        "trainer.global_batch_size=8", "trainer.micro_batch_size=2", "trainer.max_steps=4", "trainer.log_every=2"]


# -- units ------------------------------------------------------------------------------------


def test_online_exactly_when_credentials_exist(tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine example.org login u password p\n")
    env = {"HOME": str(tmp_path), "NETRC": str(netrc)}
    assert not credentials_configured(env) and wandb_mode(None, env) == "offline"
    assert wandb_mode(None, {**env, "WANDB_API_KEY": "k" * 40}) == "online"
    netrc.write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    assert credentials_configured(env) and wandb_mode(None, env) == "online"
    assert wandb_mode(None, {**env, "WANDB_BASE_URL": "https://wandb.example.org"}) == "offline"  # another host
    assert wandb_mode("offline", env) == "offline" and wandb_mode(None, {**env, "WANDB_MODE": "disabled"}) == "disabled"


def test_default_name_and_group():
    cfg = Config()
    cfg.model.family, cfg.model.size = "gpt", "tiny"
    assert default_name(cfg.model, Layout(tp=2, pp=2, dp=2, zero_stage=1)) == "gpt-tiny_tp2-pp2-dp2_zero1"
    assert default_group(cfg.experiment, cfg.model) == "gpt-tiny"
    cfg.experiment = "gpt_tiny_zero2"
    assert default_group(cfg.experiment, cfg.model) == "gpt_tiny_zero2"


def outside_traffic(strace_log: str) -> list:
    """Lines of an `strace -f -e trace=connect,sendto,sendmmsg` log where a process connects to
    an address outside this machine, or asks DNS for anything but a reverse lookup (torch's
    rendezvous resolves 127.0.0.1 by itself, with or without wandb)."""
    import psutil

    local = {"127.0.0.1", "::1", "::ffff:127.0.0.1", "0.0.0.0", "::"}
    local |= {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    dns, bad = set(), []
    for line in strace_log.splitlines():
        tid = line.split(" ", 1)[0]
        m = re.search(r'connect\((\d+), \{sa_family=AF_INET6?, sin6?_port=htons\((\d+)\).*?'
                      r'(?:inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)")', line)
        if m:
            fd, port, address = m.group(1), int(m.group(2)), m.group(3) or m.group(4)
            if address in local:
                continue
            if port == 53:
                dns.add((tid, fd))
            else:
                bad.append(line)
        m = re.search(r"(?:sendto|sendmmsg|sendmsg)\((\d+),", line)
        if m and (tid, m.group(1)) in dns and "\\7in-addr\\4arpa" not in line and "\\3ip6\\4arpa" not in line:
            bad.append(line)
    return bad


def test_outside_traffic_is_recognised():
    log = "\n".join([
        '11 connect(5, {sa_family=AF_INET, sin_port=htons(41000), sin_addr=inet_addr("127.0.0.1")}, 16) = 0',
        '11 connect(6, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.255.255.53")}, 16) = 0',
        '11 sendto(6, "E \\1\\0\\0\\1\\0011\\0010\\0010\\003127\\7in-addr\\4arpa\\0\\0\\f", 40, 0, NULL, 0) = 40',
        '12 connect(7, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.255.255.53")}, 16) = 0',
        '12 sendto(7, "\\1\\0\\3api\\5wandb\\2ai\\0\\0\\1\\0\\1", 28, 0, NULL, 0) = 28',
        '13 connect(8, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), '
        'inet_pton(AF_INET6, "2606:4700::1", &sin6_addr), sin6_scope_id=0}, 28) = -1 EINPROGRESS'])
    assert [line.split(" ", 1)[0] for line in outside_traffic(log)] == ["12", "13"]


def test_an_unreachable_server_falls_back_to_offline(tmp_path):
    """Credentials, but nothing answers (a compute node without internet): offline, with a
    warning, rather than a failed run. The server is a closed local port."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    code = ("from pathlib import Path\n"
            "from zoo.config.schema import Config\n"
            "from zoo.parallel.topology import Layout\n"
            "from zoo.observe.tracking import open_tracker\n"
            "cfg = Config()\n"
            "cfg.model.family, cfg.logger.kind = 'gpt', 'wandb'\n"
            f"tracker = open_tracker(cfg, Layout(1, 1, 1), Path({str(tmp_path)!r}), 0, {{}})\n"
            "tracker.log({'loss': 1.0}, step=1)\n"
            "tracker.finish()\n")
    env = {**os.environ, "WANDB_API_KEY": "k" * 40, "WANDB_BASE_URL": url, "WANDB_INIT_TIMEOUT": "3",
           "HTTP_PROXY": url, "HTTPS_PROXY": url}
    env.pop("WANDB_MODE", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "could not start online" in proc.stderr and "offline" in proc.stderr
    assert len(list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))) == 1


def test_the_tracker_opens_in_the_background_and_keeps_what_is_logged_meanwhile():
    """wandb.init takes seconds: open_tracker returns at once, the steps logged while it opens
    arrive in order, finish waits for it; an error opening it reaches the training's thread."""
    import threading

    import pytest

    from zoo.observe.tracking import BackgroundTracker

    calls, gate = [], threading.Event()

    class Fake:
        def log(self, values, step):
            calls.append(("log", step, values["loss"]))

        def summary(self, values):
            calls.append(("summary", values))

        def finish(self, exit_code=0):
            calls.append(("finish", exit_code))

    def start():
        assert gate.wait(10)
        return Fake()

    tracker = BackgroundTracker(start)  # returns while start() still waits
    for step in (1, 2):
        tracker.log({"loss": float(step)}, step=step)
    assert calls == []
    gate.set()
    tracker.wait()
    tracker.log({"loss": 3.0}, step=3)
    tracker.summary({"final_loss": 3.0})
    tracker.finish(0)
    assert calls == [("log", 1, 1.0), ("log", 2, 2.0), ("log", 3, 3.0), ("summary", {"final_loss": 3.0}), ("finish", 0)]

    def broken():
        raise RuntimeError("wandb said no")

    failing = BackgroundTracker(broken)
    with pytest.raises(RuntimeError, match="wandb said no"):
        failing.wait()
    with pytest.raises(RuntimeError, match="wandb said no"):
        failing.log({"loss": 1.0}, step=1)
