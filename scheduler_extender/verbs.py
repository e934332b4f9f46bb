"""The scheduler's three verbs, one function each: the decoded request and the services it needs in,
the answer's JSON body out.

kube-scheduler calls ``POST /filter`` and ``/prioritize`` for every pod it places and ``/bind`` for
every pod it binds. The HTTP edge (:mod:`scheduler_extender.http`) decodes the request with
:mod:`~scheduler_extender.wire`, calls the verb and sends the bytes it returns; both of its paths
(the bare WSGI lane and the Flask routes) call these same functions. The answers are bytes, not
objects, because :class:`~scheduler_extender.decisions.Decisions` keeps the encoded body of its
last evaluations and answers a repeated filter or prioritize with it (no re-encoding at 5,000
nodes).

The admission webhook's two verbs (``/validate``, ``/mutate``) belong to another edge, the API
server's; they are :func:`scheduler_extender.admission.review` and
:func:`scheduler_extender.admission.mutate`.
"""

from __future__ import annotations

import json

from scheduler_extender import wire
from scheduler_extender.binder import Binder
from scheduler_extender.decisions import Decisions


def filter_nodes(args: wire.ExtenderArgs, decisions: Decisions) -> bytes:
    """``ExtenderFilterResult``: the nodes where the pod fits now (bind binds only to one of them)."""
    return decisions.filter_body(args)


def prioritize(args: wire.ExtenderArgs, decisions: Decisions) -> bytes:
    """``HostPriorityList``: a score per node."""
    return decisions.prioritize_body(args)


def bind(args: wire.BindingArgs, binder: Binder) -> bytes:
    """``ExtenderBindingResult``: ``Error`` empty when the pod is bound, else why it is not."""
    return json.dumps(wire.encode_binding_result(binder.bind(args)), separators=(",", ":")).encode()
