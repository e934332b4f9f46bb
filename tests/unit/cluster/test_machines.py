"""The plan of a local cluster's nodes (their names, subnets and links) and the shell lines that
make a node's namespaces: pure, no namespace is made here (the real-node tier makes them)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fastgshare_cluster import machines


def test_three_nodes_get_consecutive_subnets_and_their_own_links() -> None:
    plans = machines.plan_nodes(3, "10.244.250.0/24", "fastgshare-node")
    assert [(p.name, p.subnet, p.node_ip) for p in plans] == [
        ("fastgshare-node", "10.244.250.0/24", "10.244.250.1"),
        ("fastgshare-node-2", "10.244.251.0/24", "10.244.251.1"),
        ("fastgshare-node-3", "10.244.252.0/24", "10.244.252.1")]
    assert [(p.host_link, p.link_host_ip, p.link_node_ip) for p in plans[1:]] == [
        ("fgsv2", "169.254.250.9", "169.254.250.10"), ("fgsv3", "169.254.250.13", "169.254.250.14")]


@pytest.mark.parametrize(("count", "subnet", "message"), [
    (0, "10.244.250.0/24", "--nodes 0: a local cluster has 1 to 6 nodes"),
    (7, "10.244.250.0/24", "--nodes 7: a local cluster has 1 to 6 nodes"),
    (3, "255.255.255.0/24", "--subnet 255.255.255.0/24: no room after it for 3 node subnets"),
    (2, "169.254.249.0/24", "node 2's subnet 169.254.250.0/24 overlaps the nodes' links 169.254.250.0/24"),
])
def test_a_plan_that_cannot_be_made_says_why(count: int, subnet: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("'", ".")):
        machines.plan_nodes(count, subnet, "n")


def test_a_node_process_joins_every_hierarchy_of_its_cgroup_or_does_not_start(tmp_path: Path) -> None:
    [_, plan] = machines.plan_nodes(2, "10.244.250.0/24", "node")
    hierarchies = [tmp_path / "cpu", tmp_path / "memory"]
    for top in hierarchies:
        (top / plan.name).mkdir(parents=True)
    command = machines.enter_command(plan, 12345, hierarchies)
    script = command[2]
    assert script.startswith("for f in ")
    assert f"{tmp_path}/cpu/node-2/cgroup.procs {tmp_path}/memory/node-2/cgroup.procs" in script
    # a hierarchy that refuses the process (a v1 cpuset without cpus, say) stops it before nsenter
    (hierarchies[1] / plan.name / "cgroup.procs").mkdir()  # writing to a directory fails
    result = subprocess.run([*command, "true"], capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert (hierarchies[0] / plan.name / "cgroup.procs").read_text().strip().isdigit()


def test_the_holder_mounts_each_cgroup_hierarchy_again_and_binds_the_node_paths(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(machines, "_cgroup_mounts", lambda: [
        ("/sys/fs/cgroup/cpu,cpuacct", "cgroup", "cpu,cpuacct"), ("/sys/fs/cgroup/unified", "cgroup2", ""),
        ("/elsewhere", "cgroup", "pids")])
    [_, plan] = machines.plan_nodes(2, "10.244.250.0/24", "node")
    script = machines.holder_command(plan, tmp_path, [])[2]
    assert "mount -t cgroup -o cpu,cpuacct cgroup /sys/fs/cgroup/cpu,cpuacct" in script
    assert "mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified" in script
    assert "/elsewhere" not in script
    for path in machines.NODE_PATHS:
        assert f"mount --bind {machines.node_path(tmp_path, path)} {path}" in script
    assert "exec unshare --mount --net --cgroup --propagation private" in script


def test_up_refuses_a_plan_that_cannot_be_made_in_one_line_before_touching_the_host(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from fastgshare_cluster import cluster  # noqa: PLC0415 - the module under test here is machines

    monkeypatch.setattr(cluster, "_check_host", lambda: None)
    with pytest.raises(cluster.ClusterError, match="no room after it for 3 node subnets"):
        cluster.up(cluster.Options(state_dir=tmp_path / "state", nodes=3, subnet="255.255.255.0/24",
                                   say=lambda _text: None))
    assert not (tmp_path / "state").exists()
