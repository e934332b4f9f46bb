"""NVIDIA's cuda-bindings sharing device memory through CUDA IPC on the simulated GPU: an exporter pod
and an importer pod, each a real process under the hook; the importer maps the exporter's
allocation (cuIpcGetMemHandle / cuIpcOpenMemHandle, the handle as 64 bytes in a file), sees what the
exporter wrote, and its write is seen by the exporter. The hook does not meter the mapping: the
importer's pod is charged nothing for it (the weights are charged once, to the exporter), and the
simulated GPU counts the allocation once.
"""

from __future__ import annotations

from fastgshare_cli.sandbox import HookBuild, TenantSpec
from tests.nvidia.harness import tier

SIZE = 3 << 20
LIMIT = 1 << 30
EXPORTER = TenantSpec(name="store", request=0.5, limit=1.0, memory="1Gi")
IMPORTER = TenantSpec(name="reader", request=0.5, limit=1.0, memory="1Gi")


def test_an_imported_allocation_shows_the_exporters_bytes_and_is_charged_once(nvidia_stack: None,
                                                                              hook_build: HookBuild) -> None:
    with tier(hook_build, [EXPORTER, IMPORTER]) as gpu:
        files = gpu.box.workdir
        shared = ("--handle-file", str(files / "handle"), "--done-file", str(files / "done"), "--size", str(SIZE))
        exporter = gpu.start(EXPORTER, "bindings_ipc.py", "--role", "export", *shared)
        importer = gpu.wait(gpu.start(IMPORTER, "bindings_ipc.py", "--role", "import", *shared)).check()
        exported = gpu.wait(exporter)
        result = exported.check()
        stale = gpu.run(IMPORTER, "bindings_ipc.py", "--role", "stale", *shared).check()
        device_used = gpu.device_memory_used()
        gpu.counts(exported)

    assert importer["pattern_matches"], "the importer reads what the exporter wrote"
    assert result["pattern_seen_after_import"], "the exporter sees what the importer wrote"
    # the importer's pod is charged nothing for the mapping; the exporter's pod for its allocation
    assert importer["free_before_open"] == importer["free_after_open"] == importer["total"] == LIMIT
    assert result["free_while_held"] == LIMIT - SIZE
    assert (result["not_base"], result["own_handle"]) == ("CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_INVALID_CONTEXT")
    assert importer["garbage"] == "CUDA_ERROR_INVALID_VALUE"
    assert stale["stale"] == "CUDA_ERROR_INVALID_VALUE", "the handle of a freed allocation is refused"
    assert device_used == 0
