"""The simulated GPU: a ``libcuda.so.1`` and ``libnvidia-ml.so.1`` for machines without an NVIDIA GPU.

The C libraries (``simgpu/driver``, ``simgpu/nvml``) and the workloads built against them
(``simgpu/workloads``) are built by ``make -C simgpu`` into ``simgpu/build``. This package is the
Python side: where the build lies (:mod:`simgpu.build`) and the reader of a simulated GPU's shared
state file (:mod:`simgpu.state`), the independent measure of what each process got. It imports
nothing of fastgshare: the simulated GPU knows no hook, arbiter or pod.
"""
