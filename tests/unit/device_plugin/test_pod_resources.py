"""Reading kubelet's PodResources answer: our devices per pod, and a kubelet that does not answer."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from device_plugin._api import podresources_pb2 as api
from device_plugin.pod_resources import PodDevices, PodResourcesClient, devices_of
from fastgshare import keys


def _container(name: str, *devices: tuple[str, list[str]]) -> api.ContainerResources:
    return api.ContainerResources(name=name, devices=[api.ContainerDevices(resource_name=resource, device_ids=ids)
                                                      for resource, ids in devices])


def test_only_our_resource_counts_and_pods_without_it_are_left_out() -> None:
    response = api.ListPodResourcesResponse(pod_resources=[
        api.PodResources(namespace="a", name="two", containers=[
            _container("x", (keys.VGPU_RESOURCE, ["G0::1"])),
            _container("y", ("nvidia.com/gpu", ["GPU-9"]), (keys.VGPU_RESOURCE, ["G0::2"])),
            _container("sidecar")]),
        api.PodResources(namespace="a", name="other", containers=[_container("x", ("nvidia.com/gpu", ["GPU-9"]))]),
        api.PodResources(namespace="b", name="none", containers=[_container("x")]),
    ])
    assert devices_of(response, keys.VGPU_RESOURCE) == {
        "a/two": PodDevices("a", "two", {"x": ("G0::1",), "y": ("G0::2",)})}


def test_without_kubelets_socket_the_client_says_none_and_warns_once(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    client = PodResourcesClient(tmp_path / "kubelet.sock", keys.VGPU_RESOURCE)
    with caplog.at_level(logging.WARNING):
        assert client.devices() is None
        assert client.devices() is None
    [record] = caplog.records
    assert f"no kubelet PodResources socket at {tmp_path / 'kubelet.sock'}" in record.getMessage()
    assert keys.POD_ALLOCATED_ANNOTATION in record.getMessage()
