"""The Kubernetes layer the services share; the only package that imports ``kubernetes``.

- :mod:`.client`: loading an API client (``--kubeconfig``, in-cluster, ``~/.kube/config``);
- :mod:`.rest`: calls through the official client as plain JSON, lists and watches, Leases and
  Events over the API, every failure as the one :class:`~.errors.ApiError`;
- :mod:`.errors`: that error type, and :class:`~.errors.KubeConfigError`;
- :mod:`.reflector`: the one list/watch loop (informer) that keeps a store equal to the API's view;
- :mod:`.store`: the object store the reflectors fill, which the controllers read;
- :mod:`.workqueue`: the controllers' deduplicating, rate-limited work queue and its metrics' hooks;
- :mod:`.runner`: how a controller runs: caches filled before workers start, only while it leads;
- :mod:`.leader`: Lease-based leader election;
- :mod:`.events`: an event recorder that aggregates repeats as client-go's does;
- :mod:`.health`: the ``/healthz``, ``/readyz`` and ``/metrics`` server of the services;
- :mod:`.process`: what every service's process does alike: listen addresses, stop signals.

:mod:`.errors`, :mod:`.reflector`, :mod:`.store`, :mod:`.workqueue`, :mod:`.leader` and :mod:`.events`
import no client: they work through small ports (``ListWatch``, ``Sink``, ``LeasePort``,
``EventSink``) that :mod:`.rest` implements and tests fake. Each service keeps one adapter (its
``kube.py``) that maps the API's dicts to its own records; only that adapter imports :mod:`.client` and :mod:`.rest`.
"""
