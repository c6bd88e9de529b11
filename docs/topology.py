"""Draw the device topology picture of a 3d layout (tp 2 x pp 2 x dp 2) on two hosts of four
GPUs, as a multi-rank run writes RUN_DIR/topology.png, into docs/topology.png.

    python docs/topology.py
"""
from __future__ import annotations

from pathlib import Path

from zoo.observe.topology_picture import draw_topology
from zoo.parallel.topology import Layout


def main() -> None:
    out = Path(__file__).with_name("topology.png")
    hosts = ["node0"] * 4 + ["node1"] * 4
    draw_topology(Layout(tp=2, pp=2, dp=2, zero_stage=1), hosts, [f"cuda:{r % 4}" for r in range(8)], out)
    print(out)


if __name__ == "__main__":
    main()
