"""The device topology picture, checked through the data it is drawn from (devices, blocks,
arrows, hosts, notes); topology.txt's device column; zoo.plan's plan.topology."""
from __future__ import annotations

import pytest

from zoo.observe.topology_picture import draw_topology, topology_drawing
from zoo.parallel.topology import Layout, describe_grid


def test_one_rank_is_one_device_and_no_note(tmp_path):
    d = draw_topology(Layout(1, 1, 1, 0), ["vm"], ["cpu"], tmp_path / "t.png")
    assert [(p["rank"], p["device"]) for p in d["devices"]] == [(0, "cpu")] and d["notes"] == []
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_two_tp_ranks_are_one_block():
    d = topology_drawing(Layout(2, 1, 1, 1), ["vm"] * 2, ["cpu"] * 2)
    assert [b["ranks"] for b in d["tp_blocks"]] == [[0, 1]] and d["arrows"] == [] and d["notes"] == []


def test_3d_on_two_hosts_keeps_each_replica_on_its_host(tmp_path):
    hosts = ["node0"] * 4 + ["node1"] * 4
    d = draw_topology(Layout(2, 2, 2, 1), hosts, [f"cuda:{r % 4}" for r in range(8)], tmp_path / "t.png")
    assert [b["ranks"] for b in d["tp_blocks"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(len(b["hosts"]) == 1 for b in d["tp_blocks"])
    assert {(a["from"], a["to"]) for a in d["arrows"]} == {(0, 2), (1, 3), (4, 6), (5, 7)}
    assert not any(a["cross_host"] for a in d["arrows"]) and d["notes"] == []
    assert d["hosts"] == {"node0": [0, 1, 2, 3], "node1": [4, 5, 6, 7]}
    seven = d["devices"][7]
    assert (seven["tp"], seven["pp"], seven["dp"], seven["device"], seven["host"]) == (1, 1, 1, "cuda:3", "node1")
    columns = sorted({round(p["x"], 3) for p in d["devices"] if p["pp"] == 1})
    assert all(x > max(p["x"] for p in d["devices"] if p["pp"] == 0) for x in columns)  # stages are columns


def test_a_tp_group_across_hosts_and_pipeline_hops_between_hosts_are_noted():
    hosts = [f"node{r // 2}" for r in range(8)]  # 2 GPUs a host, tp 4
    d = topology_drawing(Layout(4, 2, 1, 1), hosts, [f"cuda:{r % 2}" for r in range(8)])
    assert d["notes"][0] == ("TP group [0, 1, 2, 3] spans hosts node[0-1]: its all-reduces cross the network; "
                             "keep tp within the devices of one host")
    assert d["notes"][-1] == "pipeline neighbours on different hosts: 0->4, 1->5, 2->6, 3->7 (activations cross the network)"


def test_the_rank_grid_names_devices_and_groups_that_cross_hosts():
    text = describe_grid(Layout(2, 1, 2, 1), ["a", "b", "a", "b"], ["cuda:0", "cuda:0", "cuda:1", "cuda:1"])
    assert "rank  dp  pp  tp  host  device" in text and "   1   0   0   1  b  cuda:0" in text
    assert "TP group: [0, 1]  hosts a,b  (crosses hosts)" in text and "DP group: [0, 2]  hosts a\n" in text


def test_the_planner_draws_its_recommendation(tmp_path):
    from tests.unit.plan.test_cli import plan_cfg
    from zoo.plan.__main__ import run

    text = run(plan_cfg("model.size=gpt3-175b", "cluster.nodes=16", "cluster.gpus_per_node=8", "cluster.gpu_mem_gb=80",
                        "trainer.global_batch_size=512", f"plan.topology={tmp_path / 'plan.png'}"))
    assert f"Topology picture: {tmp_path / 'plan.png'}" in text and (tmp_path / "plan.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="plan.topology=.*: cannot write it"):
        (tmp_path / "file").write_text("")
        run(plan_cfg("model.size=small", f"plan.topology={tmp_path / 'file' / 'plan.png'}"))


def test_a_launcher_that_places_fewer_ranks_on_a_node_than_tp_is_warned_about():
    from zoo.run.launch import ranks_per_node, tp_placement_warning

    assert ranks_per_node({"LOCAL_WORLD_SIZE": "4"}) == 4 and ranks_per_node({}) is None
    assert ranks_per_node({"SLURM_TASKS_PER_NODE": "4(x2)"}) == 4
    assert ranks_per_node({"SLURM_TASKS_PER_NODE": "8,4(x3)"}) == 4
    assert tp_placement_warning(8, 4).startswith("parallel.tp=8 is more than the 4 ranks per node")
    assert tp_placement_warning(4, 6).startswith("parallel.tp=4 does not divide the 6 ranks per node")
    assert tp_placement_warning(2, 4) is None and tp_placement_warning(4, None) is None
