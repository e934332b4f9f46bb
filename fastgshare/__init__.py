"""fastgshare: the pure core shared by every fastgshare component.

This package owns the domain of spatio-temporal GPU sharing: the share a pod asks for
(:mod:`fastgshare.share`), the GPUs a node has (:mod:`fastgshare.inventory`), the per-GPU
ledger with its 2-D time x SM packing (:mod:`fastgshare.ledger`, :mod:`fastgshare.packing`),
placement policies (:mod:`fastgshare.placement`), packing a whole workload onto a fleet
(:mod:`fastgshare.fleet`), every cross-component name (:mod:`fastgshare.keys`) and the
versioned annotation payloads (:mod:`fastgshare.codec`).

It performs no I/O and imports no service library (kubernetes, grpc, flask, pynvml); the
import-linter contracts in ``pyproject.toml`` keep it that way.
"""

__version__ = "0.1.0"  # the package's one version (setup.cfg reads it); every command's --version shows it
