"""The GPU day: ``bench/gpu/run.py``, one script that measures on a real NVIDIA GPU what the
simulated GPU cannot show, and its ``--dry-run`` on the simulated GPU (a CI test). See
``docs/benchmarks.md``.

Modules: :mod:`.run` (the command: parts as subprocesses under deadlines, the JSON and the
table), :mod:`.part` (what a part gets and returns), :mod:`.target` (the real or the simulated
GPU: environments, the arbiter, the hook), :mod:`.toolchain` (the setup part: builds),
:mod:`.tenants` (running the driver-API tenant), one module per part (:mod:`.isolation`,
:mod:`.serving`, :mod:`.memory`, :mod:`.overhead`, :mod:`.mps`, :mod:`.matrix`), :mod:`.report`
(the markdown table), :mod:`.fastgshare_run` (``fastgshare run`` without the rest of the command
line). ``programs/torch_serve.py`` and ``programs/torch_memory.py`` are the programs run under the
hook by ``fastgshare run``; they import nothing of the project.
"""
