"""The extender's HTTP edge: every server, app and route; it decodes, calls and encodes, nothing more.

What answers what:

- ``--listen`` (the pod's loopback; only kube-scheduler reaches it): :func:`.apps.create_app`
  served by :class:`.threaded.ThreadedHttpServer`. The scheduler's verbs are answered by the bare
  WSGI :class:`.lane.VerbLane` in front of Flask; :mod:`.routes` answers the rest (``/inspect``,
  the status endpoints, every malformed request).
- ``--metrics-listen`` (the pod network): :func:`.apps.status_server` (``/healthz``,
  ``/readyz``, ``/metrics``), the services' one health server, :class:`fastgshare_kube.health.HealthServer`.
- ``--webhook-listen`` (the pod network, TLS from :mod:`.tls`): :func:`.webhook.create_webhook_app`
  served by :class:`.guarded.HttpServer`.

The verbs themselves are :mod:`scheduler_extender.verbs` (scheduler) and
:mod:`scheduler_extender.admission` (webhook); what they work on is
:class:`scheduler_extender.services.Services`. Nothing outside this package imports Flask.

**Why two servers.** Both run in the extender's one process, so every request reads the one
watch-fed cache. They serve different clients:

- the pod network (webhook, probes, Prometheus) is open to any tenant, who may connect and send
  nothing: ``fastgshare_kube.guarded_http`` (one event-loop thread for every connection, TLS
  handshakes off the accept path, deadlines, a connection cap, a fixed pool of 16 workers) holds
  against that, and is the server every service uses on the pod network;
- the loopback listener has one trusted client that sends up to 32 binds at once, each on its own
  connection, and a bind may wait up to ``--bind-wait-seconds`` for its node's bind turn
  (:mod:`scheduler_extender.state`). With a thread per connection a waiting bind holds only its own
  connection; in a fixed pool of 16 workers, 16 waiting binds would hold every worker and the
  scheduler's next filter would wait behind them.

Speed is no longer the reason. ``threaded.py`` replaced Cheroot, which was 6–7 times slower on the
scheduler's requests (see :mod:`.threaded`). Measured on 2026-12-03 on this project's 2-core
development machine, one kept-alive connection, the scheduler's 70 KB request and a 65 KB answer
from a WSGI app that does nothing else, each server in a process of its own, timed by
``bench/http_timer.c``, 5 runs of 3,000 requests: ``threaded`` 0.075–0.157 ms p50 and 0.22–0.57 ms
p99, ``guarded_http`` 0.082–0.199 ms p50 and 0.23–0.77 ms p99, against a warm filter of 1.2 ms at
5,000 nodes. One server would do if ``guarded_http`` served the loopback listener with a worker for
every connection the scheduler may hold (at least the 32 binds and its filter), and
``bench.extender_latency`` and ``bench.scheduling_throughput`` showed no loss.
"""
