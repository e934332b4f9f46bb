"""The device plugin over real unix sockets, driven by a fake kubelet."""

from __future__ import annotations

import json
import threading
import time

import attrs
import grpc

from device_plugin._api import deviceplugin_pb2 as api
from fastgshare import keys
from fastgshare.codec import decode_node_inventory
from tests.builders_k8s import assignment, pod_record
from tests.integration.device_plugin.conftest import NODE, RunningAgent, rpc_error


def _allocate(agent: RunningAgent, *device_ids: str) -> api.AllocateResponse:
    request = api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=list(device_ids))])
    return agent.stub().Allocate(request, timeout=10)


def test_registration_carries_the_contract(running_agent: RunningAgent) -> None:
    request, options = running_agent.kubelet.registrations[0]
    assert request.version == "v1beta1"
    assert request.endpoint == keys.DEVICE_PLUGIN_SOCKET
    assert request.resource_name == "fastgshare.caps.in.tum/vgpu"
    assert request.options.get_preferred_allocation_available
    assert request.options.pre_start_required  # the last check that no container gets another pod's GPU
    assert options.get_preferred_allocation_available


def test_list_and_watch_sends_slots_then_health_changes(running_agent: RunningAgent) -> None:
    stream = running_agent.stub().ListAndWatch(api.Empty(), timeout=20)
    first = next(stream)
    uuids = [gpu.uuid for gpu in running_agent.gpus.devices()]
    assert [d.ID for d in first.devices] == [f"{uuid}::{slot}" for uuid in uuids for slot in range(4)]
    assert {d.health for d in first.devices} == {"Healthy"}

    running_agent.gpus.set_health(uuids[1], healthy=False, reason="XID 79")
    second = next(stream)
    health = {d.ID: d.health for d in second.devices}
    assert [health[f"{uuids[1]}::{slot}"] for slot in range(4)] == ["Unhealthy"] * 4
    assert [health[f"{uuids[0]}::{slot}"] for slot in range(4)] == ["Healthy"] * 4
    stream.cancel()


def test_inventory_is_published_and_follows_health(running_agent: RunningAgent) -> None:
    assert running_agent.publisher.published.wait(10)
    inventory = decode_node_inventory(running_agent.publisher.payloads[0])
    assert inventory.node_name == NODE
    assert [gpu.healthy for gpu in inventory.gpus] == [True, True]
    uuid = inventory.gpus[0].uuid
    running_agent.gpus.set_health(uuid, healthy=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(running_agent.publisher.payloads) < 2:
        time.sleep(0.05)
    assert [gpu.healthy for gpu in decode_node_inventory(running_agent.publisher.payloads[-1]).gpus] == [False, True]


def test_allocate_gives_the_assigned_gpu_env_and_mounts(running_agent: RunningAgent) -> None:
    gpu = running_agent.gpus.devices()[1]
    running_agent.pods.put(pod_record("resnet-1", NODE, assigned=assignment(NODE, gpu.uuid, 1, sm=12)))
    response = _allocate(running_agent, f"{running_agent.gpus.devices()[0].uuid}::0")
    [container] = response.container_responses
    assert dict(container.envs) == {
        "NVIDIA_VISIBLE_DEVICES": gpu.uuid,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "12",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "LD_PRELOAD": keys.CONTAINER_HOOK_PATH,
        "FASTGSHARE_ARBITER_SOCKET": f"{keys.CONTAINER_RUN_DIR}/arbiter.sock",
        "FASTGSHARE_POD": "team-a/resnet-1",
        "FASTGSHARE_GPU_UUID": gpu.uuid,
        "FASTGSHARE_MODEL_SOCKET": f"{keys.CONTAINER_RUN_DIR}/model.sock",
    }
    mounts = {(m.container_path, m.host_path, m.read_only) for m in container.mounts}
    assert mounts == {
        (keys.CONTAINER_HOOK_PATH, running_agent.paths.hook_library, True),
        (keys.CONTAINER_RUN_DIR, running_agent.paths.run_dir, True),  # tenants connect, never unlink
        ("/tmp/nvidia-mps", "/tmp/nvidia-mps", True),  # read-only: no tenant writes what others read
    }
    assert running_agent.marker.marked == ["team-a/resnet-1"]


def test_allocate_without_a_waiting_pod_fails_with_a_reason(running_agent: RunningAgent) -> None:
    running_agent.pods.put(pod_record("done", NODE, assigned=assignment(NODE, "GPU-x"), allocated=True))
    running_agent.pods.put(pod_record("elsewhere", "other-node", assigned=assignment("other-node", "GPU-y")))
    error = rpc_error(lambda: _allocate(running_agent, "x::0"))
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert f"no pod bound to node {NODE} is waiting for a GPU" in error.details()
    assert running_agent.marker.marked == []


def test_allocate_waits_for_a_pod_the_cache_has_not_seen_yet(running_agent: RunningAgent) -> None:
    gpu = running_agent.gpus.devices()[0]

    def bind_later() -> None:
        time.sleep(0.3)
        running_agent.pods.put(pod_record("late", NODE, assigned=assignment(NODE, gpu.uuid)))

    threading.Thread(target=bind_later).start()
    response = _allocate(running_agent, f"{gpu.uuid}::0")
    assert response.container_responses[0].envs["FASTGSHARE_POD"] == "team-a/late"


def test_allocate_refuses_a_pod_assigned_to_an_unknown_or_sick_gpu(running_agent: RunningAgent) -> None:
    running_agent.pods.put(pod_record("lost", NODE, assigned=assignment(NODE, "GPU-not-here")))
    error = rpc_error(lambda: _allocate(running_agent, "x::0"))
    assert "is assigned GPU GPU-not-here, which node gpu-node-1 does not have" in error.details()


def test_pods_waiting_for_different_gpus_are_served_in_the_order_they_arrived(running_agent: RunningAgent) -> None:
    """kubelet admits pods one at a time in the order its watch sees them bound; the agent's watch
    sees the same order, whatever the assignment times say."""
    gpus = running_agent.gpus.devices()
    for name, gpu, at in [("b", gpus[1], 2_000), ("a", gpus[0], 1_000), ("c", gpus[0], 3_000)]:
        running_agent.pods.put(pod_record(name, NODE, assigned=assignment(NODE, gpu.uuid, gpu.index, at_ms=at)))
    served = [dict(_allocate(running_agent, "x::0").container_responses[0].envs) for _ in range(3)]
    # "a" and "c" get the same answer: the second goes out without a name, which does not matter
    assert [(e.get("FASTGSHARE_POD"), e["NVIDIA_VISIBLE_DEVICES"]) for e in served] == [
        ("team-a/b", gpus[1].uuid), (None, gpus[0].uuid), ("team-a/c", gpus[0].uuid)]


def test_pods_in_unknown_order_waiting_for_different_gpus_are_refused_rather_than_guessed(
        running_agent: RunningAgent) -> None:
    gpus = running_agent.gpus.devices()
    for name, gpu, at in [("b", gpus[1], 2_000), ("a", gpus[0], 1_000)]:  # listed after an agent restart
        running_agent.pods.put(pod_record(name, NODE, assigned=assignment(NODE, gpu.uuid, gpu.index, at_ms=at)),
                               arrived=False)
    error = rpc_error(lambda: _allocate(running_agent, "x::0"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "refused rather than guess" in error.details()
    assert f"team-a/a (GPU {gpus[0].uuid}, SM 50%), team-a/b (GPU {gpus[1].uuid}, SM 50%)" in error.details()
    assert running_agent.marker.marked == []
    # kubelet fails the pod it was admitting ("b", say); the doubt is gone and "a" is served as itself.
    _, pods = running_agent.pods.snapshot()
    running_agent.pods.put(attrs.evolve(next(p for p in pods if p.name == "b"), phase="Failed"))
    envs = _allocate(running_agent, "x::0").container_responses[0].envs
    assert (envs["FASTGSHARE_POD"], envs["NVIDIA_VISIBLE_DEVICES"]) == ("team-a/a", gpus[0].uuid)
    assert running_agent.marker.marked == ["team-a/a"]


def test_pods_waiting_for_the_same_answer_are_served_and_served_each_once(running_agent: RunningAgent) -> None:
    gpu = running_agent.gpus.devices()[0]
    for name, at in [("b", 2_000), ("a", 1_000), ("c", 3_000)]:
        running_agent.pods.put(pod_record(name, NODE, assigned=assignment(NODE, gpu.uuid, gpu.index, at_ms=at)))
    served = [dict(_allocate(running_agent, "x::0").container_responses[0].envs) for _ in range(3)]
    assert {e["NVIDIA_VISIBLE_DEVICES"] for e in served} == {gpu.uuid}
    assert running_agent.marker.marked == ["team-a/a", "team-a/b", "team-a/c"]  # no kubelet record: oldest first
    assert "FASTGSHARE_POD" not in served[0]  # not sure which pod it was: it is not named
    assert served[2]["FASTGSHARE_POD"] == "team-a/c"  # the last one waiting is certain


def test_kubelets_record_names_the_pod_an_unnamed_allocate_served(exact_agent: RunningAgent) -> None:
    gpu = exact_agent.gpus.devices()[0]
    for name, at in [("a", 1_000), ("b", 2_000)]:
        exact_agent.pods.put(pod_record(name, NODE, assigned=assignment(NODE, gpu.uuid, gpu.index, at_ms=at)))
    envs = _allocate(exact_agent, f"{gpu.uuid}::3").container_responses[0].envs
    assert "FASTGSHARE_POD" not in envs
    assert exact_agent.marker.marked == []  # not "a" on a guess
    assert exact_agent.pod_resources is not None
    exact_agent.pod_resources.give("team-a", "b", "main", keys.VGPU_RESOURCE, [f"{gpu.uuid}::3"])  # it was "b"
    deadline = time.monotonic() + 10
    while not exact_agent.marker.marked and time.monotonic() < deadline:
        time.sleep(0.02)
    assert exact_agent.marker.marked == ["team-a/b"]
    # The next Allocate knows "b" holds its slot and serves "a", by name.
    assert _allocate(exact_agent, f"{gpu.uuid}::2").container_responses[0].envs["FASTGSHARE_POD"] == "team-a/a"


def test_kubelets_record_beats_the_agents_own_marks(exact_agent: RunningAgent) -> None:
    """A crash can leave a pod marked that kubelet never got devices for, and a pod served but not
    marked: kubelet's record decides who waits, and the unmarked served pod is marked."""
    gpus = exact_agent.gpus.devices()
    assert exact_agent.pod_resources is not None
    exact_agent.pods.put(pod_record("marked-not-served", NODE, allocated=True,
                                    assigned=assignment(NODE, gpus[0].uuid, gpus[0].index, at_ms=1_000)))
    exact_agent.pods.put(pod_record("served-not-marked", NODE,
                                    assigned=assignment(NODE, gpus[1].uuid, gpus[1].index, at_ms=2_000)))
    exact_agent.pod_resources.give("team-a", "served-not-marked", "main", keys.VGPU_RESOURCE, [f"{gpus[1].uuid}::0"])
    envs = _allocate(exact_agent, f"{gpus[0].uuid}::0").container_responses[0].envs
    assert (envs["FASTGSHARE_POD"], envs["NVIDIA_VISIBLE_DEVICES"]) == ("team-a/marked-not-served", gpus[0].uuid)
    assert "team-a/served-not-marked" in exact_agent.marker.marked


def test_a_pod_with_two_gpu_containers_is_marked_after_both(running_agent: RunningAgent) -> None:
    gpu = running_agent.gpus.devices()[0]
    running_agent.pods.put(pod_record("two", NODE, assigned=assignment(NODE, gpu.uuid), containers=("a", "b")))
    running_agent.pods.put(pod_record("next", NODE, assigned=assignment(NODE, gpu.uuid, at_ms=5_000)))
    first = _allocate(running_agent, f"{gpu.uuid}::0")
    assert running_agent.marker.marked == []
    second = _allocate(running_agent, f"{gpu.uuid}::1")
    assert running_agent.marker.marked == ["team-a/two"]
    assert "FASTGSHARE_POD" not in first.container_responses[0].envs  # "two" or "next": both get the same
    assert second.container_responses[0].envs["FASTGSHARE_POD"] == "team-a/two"  # half-served: certain


def test_preferred_allocation_prefers_the_assigned_gpu(running_agent: RunningAgent) -> None:
    gpus = running_agent.gpus.devices()
    running_agent.pods.put(pod_record("p", NODE, assigned=assignment(NODE, gpus[1].uuid, 1)))
    available = [f"{gpu.uuid}::{slot}" for gpu in gpus for slot in range(4)]
    request = api.PreferredAllocationRequest(container_requests=[
        api.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=1)])
    response = running_agent.stub().GetPreferredAllocation(request, timeout=10)
    assert list(response.container_responses[0].deviceIDs) == [f"{gpus[1].uuid}::0"]
    assert running_agent.marker.marked == []  # a preference does not consume the pod


def test_kubelet_restart_leads_to_reregistration_with_state_kept(running_agent: RunningAgent) -> None:
    uuid = running_agent.gpus.devices()[0].uuid
    running_agent.gpus.set_health(uuid, healthy=False)
    time.sleep(0.3)
    running_agent.kubelet.restart()
    assert running_agent.kubelet.wait_for_registrations(2), "no re-registration after the kubelet restart"
    stream = running_agent.stub().ListAndWatch(api.Empty(), timeout=20)
    health = {d.ID: d.health for d in next(stream).devices}
    assert health[f"{uuid}::0"] == "Unhealthy"  # the health learned before the restart survived
    stream.cancel()
    assert json.loads(running_agent.publisher.payloads[-1])["node"] == NODE


def test_a_container_given_another_pods_gpu_does_not_start(exact_agent: RunningAgent) -> None:
    """If kubelet admitted a pod the agent did not expect (it rejected the expected one before its
    Allocate), PreStartContainer, when kubelet's record names the pod, stops the wrong start."""
    gpus = exact_agent.gpus.devices()
    assert exact_agent.pod_resources is not None
    for name, gpu in [("expected", gpus[0]), ("admitted", gpus[1])]:
        exact_agent.pods.put(pod_record(name, NODE, assigned=assignment(NODE, gpu.uuid, gpu.index)))
    envs = _allocate(exact_agent, f"{gpus[0].uuid}::0").container_responses[0].envs
    assert envs["FASTGSHARE_POD"] == "team-a/expected"  # it arrived first
    exact_agent.pod_resources.give("team-a", "admitted", "main", keys.VGPU_RESOURCE, [f"{gpus[0].uuid}::0"])
    stub = exact_agent.stub()
    error = rpc_error(lambda: stub.PreStartContainer(api.PreStartContainerRequest(devices_ids=[f"{gpus[0].uuid}::0"]),
                                                     timeout=10))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.details().startswith("fastgshare: refused to start a container of pod team-a/admitted")
    assert f"is assigned GPU {gpus[1].uuid}" in error.details()
    assert error.details().endswith("Delete the pod and create it again")
    assert [(key, reason) for key, reason, _ in exact_agent.marker.events] == [
        ("team-a/admitted", "GPUContainerRefused")]  # the refusal is an event on that pod, nothing is deleted
    # the usual case: kubelet's record names the pod that was served, and the container starts
    exact_agent.pod_resources.give("team-a", "admitted", "main", keys.VGPU_RESOURCE, [])
    exact_agent.pod_resources.give("team-a", "expected", "main", keys.VGPU_RESOURCE, [f"{gpus[0].uuid}::0"])
    stub.PreStartContainer(api.PreStartContainerRequest(devices_ids=[f"{gpus[0].uuid}::0"]), timeout=10)


def test_a_refused_pod_of_a_controller_is_not_deleted_but_warned(exact_agent: RunningAgent) -> None:
    """Issue 42, row 4: the agent deleted team A's pods when forged pods took their Allocate. Now it
    deletes nothing: the refused container does not start, however often kubelet retries, and a
    Warning event on that pod says why (its owner deletes it)."""
    gpus = exact_agent.gpus.devices()
    assert exact_agent.pod_resources is not None
    for name, gpu in [("expected", gpus[0]), ("admitted", gpus[1])]:
        exact_agent.pods.put(pod_record(name, NODE, assigned=assignment(NODE, gpu.uuid, gpu.index),
                                        controller="FaSTPod/web"))
    _allocate(exact_agent, f"{gpus[0].uuid}::0")
    exact_agent.pod_resources.give("team-a", "admitted", "main", keys.VGPU_RESOURCE, [f"{gpus[0].uuid}::0"])
    stub = exact_agent.stub()
    for _ in range(3):  # kubelet tries the start again and again
        error = rpc_error(lambda: stub.PreStartContainer(
            api.PreStartContainerRequest(devices_ids=[f"{gpus[0].uuid}::0"]), timeout=10))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error.details().endswith("delete the pod and FaSTPod/web makes a new one")
    assert {key for key, _, _ in exact_agent.marker.events} == {"team-a/admitted"}
    assert not any(p.deleting for p in exact_agent.pods.snapshot()[1])
    assert not hasattr(exact_agent.marker, "delete_refused")


def test_a_forged_assignment_is_never_served(running_agent: RunningAgent) -> None:
    """Issue 42, row 1: a pod placed by spec.nodeName with a made-up assignment got the whole GPU.
    Unsigned, it is no candidate: Allocate refuses with a reason kubelet shows on the pod."""
    gpu = running_agent.gpus.devices()[0]
    running_agent.pods.put(pod_record("forged", NODE, assigned=assignment(NODE, gpu.uuid), signed=False))
    error = rpc_error(lambda: _allocate(running_agent, f"{gpu.uuid}::0"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "team-a/forged: assignment refused: it carries no signature" in error.details()
    assert running_agent.marker.marked == []
