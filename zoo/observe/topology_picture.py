"""The device topology as a picture (RUN_DIR/topology.png; zoo.plan's plan.topology=PATH).

Pipeline stages are columns with arrows from each stage to the next, data-parallel replicas
are rows, and each tensor-parallel group is one coloured block holding its devices; every
device is labelled with its rank, its device (GPU index or cpu) and its (tp, pp, dp). Hosts
are dashed boxes around their devices (or, where a host's devices do not form one block of
the grid, named on each device). A note says when a tensor-parallel group spans hosts (its
all-reduces cross the network) and which pipeline neighbours sit on different hosts.
`topology_drawing` is the data the picture is drawn from.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

from zoo.parallel.topology import Layout, build_topology, compress_hosts, group_lists

CELL, GAP = 1.0, 0.6  # a device's square, the space between stages and replicas


def topology_drawing(layout: Layout, hosts: Sequence[str], devices: Sequence[str]) -> Dict[str, object]:
    """Devices with their grid place, the tensor-parallel blocks, the pipeline arrows, the
    hosts and the notes."""
    topo = build_topology(layout)
    place = {}
    for rank in range(layout.world_size):
        c = topo.get_coord(rank)
        cp = getattr(c, "context", 0)  # a stage's cp ranks side by side, each its tp block
        place[rank] = {"rank": rank, "tp": c.model, "cp": cp, "pp": c.pipe, "dp": c.data, "host": hosts[rank],
                       "device": devices[rank],
                       "x": c.pipe * (layout.tp * layout.cp * CELL + GAP) + (cp * layout.tp + c.model) * CELL,
                       "y": -c.data * (CELL + GAP)}
    groups = group_lists(topo)
    tp_blocks = [{"ranks": list(g), "hosts": sorted({hosts[r] for r in g}), "dp": place[g[0]]["dp"],
                  "pp": place[g[0]]["pp"]} for g in groups["TP"]]
    arrows = []
    for g in groups["PP"]:
        for a, b in zip(g, g[1:]):
            arrows.append({"from": a, "to": b, "cross_host": hosts[a] != hosts[b]})
    by_host: Dict[str, List[int]] = {}
    for rank in range(layout.world_size):
        by_host.setdefault(hosts[rank], []).append(rank)
    notes = [f"TP group {b['ranks']} spans hosts {compress_hosts(b['hosts'])}: its all-reduces cross the network; "
             f"keep tp within the devices of one host" for b in tp_blocks if len(b["hosts"]) > 1]
    notes += [f"CP group {list(g)} spans hosts {compress_hosts({hosts[r] for r in g})}: its key/value gathers cross "
              f"the network; keep tp x cp within one host" for g in groups.get("CP", []) if len({hosts[r] for r in g}) > 1]
    crossing = [a for a in arrows if a["cross_host"]]
    if crossing:
        pairs = ", ".join(f"{a['from']}->{a['to']}" for a in crossing[:6]) + (", ..." if len(crossing) > 6 else "")
        notes.append(f"pipeline neighbours on different hosts: {pairs} (activations cross the network)")
    return {"layout": layout.name, "devices": [place[r] for r in range(layout.world_size)], "tp_blocks": tp_blocks,
            "arrows": arrows, "hosts": by_host, "notes": notes}


def _host_box(ranks: List[int], place: Dict[int, dict], all_ranks: int):
    """The host's bounding box in the grid, if it holds only the host's own devices."""
    xs = [place[r]["x"] for r in ranks]
    ys = [place[r]["y"] for r in ranks]
    box = (min(xs), min(ys), max(xs) + CELL, max(ys) + CELL)
    inside = [r for r in range(all_ranks) if box[0] <= place[r]["x"] < box[2] and box[1] <= place[r]["y"] < box[3]]
    return box if sorted(inside) == sorted(ranks) else None


def draw_topology(layout: Layout, hosts: Sequence[str], devices: Sequence[str], path: Path) -> Dict[str, object]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

    d = topology_drawing(layout, hosts, devices)
    place = {p["rank"]: p for p in d["devices"]}
    stage_width = layout.tp * layout.cp * CELL  # a stage's devices of one replica: cp blocks of tp
    width = layout.pp * (stage_width + GAP)
    height = layout.dp * (CELL + GAP)
    fig, ax = plt.subplots(figsize=(min(24, 2.5 + 1.4 * width), min(18, 1.5 + 1.4 * height + 0.35 * len(d["notes"]))))
    colors = plt.get_cmap("tab20")
    for i, block in enumerate(d["tp_blocks"]):
        first = place[block["ranks"][0]]
        xs = [place[r]["x"] for r in block["ranks"]]
        ax.add_patch(FancyBboxPatch((min(xs) + 0.04, first["y"] + 0.04), max(xs) - min(xs) + CELL - 0.08, CELL - 0.08,
                                    boxstyle="round,pad=0.02", facecolor=colors(i % 20), alpha=0.45,
                                    edgecolor="red" if len(block["hosts"]) > 1 else "black",
                                    linewidth=2.5 if len(block["hosts"]) > 1 else 1.0))
    boxed = {}
    for host, ranks in d["hosts"].items():
        box = _host_box(ranks, place, layout.world_size)
        if box is not None and len(d["hosts"]) > 1:
            boxed[host] = box
            ax.add_patch(Rectangle((box[0] - 0.05, box[1] - 0.1), box[2] - box[0] + 0.1, box[3] - box[1] + 0.2,
                                   fill=False, linestyle="--", edgecolor="dimgray", linewidth=1.2))
            ax.text(box[0] - 0.1, box[3] + 0.14, host, fontsize=9, color="dimgray", va="bottom")
    for p in d["devices"]:
        ax.add_patch(Rectangle((p["x"] + 0.08, p["y"] + 0.08), CELL - 0.16, CELL - 0.16, fill=False,
                               edgecolor="gray", linewidth=0.6))
        coords = f"{p['tp']}, {p['cp']}, {p['pp']}, {p['dp']}" if layout.cp > 1 else f"{p['tp']}, {p['pp']}, {p['dp']}"
        label = f"rank {p['rank']}\n{p['device']}\n({coords})"
        if len(d["hosts"]) > 1 and p["host"] not in boxed:
            label += f"\n{p['host']}"
        ax.text(p["x"] + CELL / 2, p["y"] + CELL / 2, label, ha="center", va="center", fontsize=7)
    hops: Dict[tuple, bool] = {}  # (replica, stage) -> whether a pair of its arrow crosses hosts
    for a in d["arrows"]:
        key = (place[a["from"]]["dp"], place[a["from"]]["pp"])
        hops[key] = hops.get(key, False) or a["cross_host"]
    for (replica, stage), cross in hops.items():  # block edge to block edge, one arrow per hop
        x0 = stage * (stage_width + GAP) + stage_width
        y = -replica * (CELL + GAP) + CELL / 2
        ax.add_patch(FancyArrowPatch((x0 - 0.02, y), (x0 + GAP + 0.02, y), arrowstyle="-|>", mutation_scale=12,
                                     color="red" if cross else "black", linewidth=1.2))
    for s in range(layout.pp):
        ax.text(s * (stage_width + GAP) + stage_width / 2, CELL + 0.35, f"stage {s}", ha="center",
                fontsize=9, weight="bold")
    for r in range(layout.dp):
        ax.text(-0.2, -r * (CELL + GAP) + CELL / 2, f"replica {r}", ha="right", va="center", fontsize=9, weight="bold")
    ax.set_xlim(-1.6, width + 0.2)
    ax.set_ylim(-height - 0.2 - 0.5 * len(d["notes"]), CELL + 0.9)
    ax.set_aspect("equal")
    ax.axis("off")
    cp = layout.cp > 1
    title = (f"{layout.name}: world {layout.world_size} = tp {layout.tp} x {f'cp {layout.cp} x ' if cp else ''}pp "
             f"{layout.pp} x dp {layout.dp} on {len(d['hosts'])} host(s)\ndevice labels: rank, device, "
             f"({'tp, cp, pp, dp' if cp else 'tp, pp, dp'})")
    ax.set_title(title, fontsize=10)
    for i, note in enumerate(d["notes"]):
        ax.text(-1.5, -height - 0.1 - 0.45 * i, "note: " + note, fontsize=8, color="red", va="top")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return d
