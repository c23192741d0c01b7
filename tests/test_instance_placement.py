"""Throughput mode's placement of an instance's ranks (`mlhpc.runtime.instance_placement`),
checked against a brute-force count over every rank of the job: ranks on nodes in blocks of
ranks-per-node, instances in blocks of their size, including instances that straddle two nodes
because neither size divides the other."""

from __future__ import annotations

import pytest

from mlhpc.runtime import instance_placement


def _brute_force(world: int, per_node: int, size: int) -> list[dict[str, int]]:
    node_of = [r // per_node for r in range(world)]
    instance_of = [r // size for r in range(world)]
    out = []
    for rank in range(world):
        members = [r for r in range(world) if instance_of[r] == instance_of[rank]]
        nodes = sorted({node_of[r] for r in members})
        out.append({"rank": members.index(rank), "world_size": len(members),
                    "instance": instance_of[rank],
                    "local_world_size": sum(node_of[r] == node_of[rank] for r in members),
                    "num_nodes": len(nodes), "node_rank": nodes.index(node_of[rank]),
                    "instances_per_node": len({instance_of[r] for r in range(world)
                                               if node_of[r] == node_of[rank]})})
    return out


@pytest.mark.parametrize("world, per_node, size", [
    (8, 4, 2), (8, 4, 4), (16, 4, 8), (12, 4, 3), (12, 4, 6), (24, 8, 6), (6, 3, 2), (10, 5, 2)])
def test_every_rank_is_placed_as_counted(world, per_node, size):
    expected = _brute_force(world, per_node, size)
    assert [instance_placement(r, per_node, size) for r in range(world)] == expected


def test_an_instance_straddling_two_nodes():
    """12 ranks, 4 a node, instances of 3: instance 1 is rank 3 on node 0 and ranks 4, 5 on
    node 1, so rank 4 has 2 instance ranks on its node, the instance spans 2 nodes, and node 1
    holds ranks of instances 1 and 2."""
    assert instance_placement(4, 4, 3) == {"rank": 1, "world_size": 3, "instance": 1,
                                           "local_world_size": 2, "num_nodes": 2, "node_rank": 1,
                                           "instances_per_node": 2}
