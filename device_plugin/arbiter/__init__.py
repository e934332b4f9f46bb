"""The arbiter the hooks talk to: one token scheduler per GPU behind a unix socket.

:mod:`.server` speaks the wire protocol (:mod:`fastgshare.protocol`) and drives the pure
schedulers (:mod:`fastgshare.arbitration`); :mod:`.identity` finds which pod a connecting
process belongs to; :mod:`.shares` says what share that pod has on which GPU.
"""
