"""``fastgshare-queue-worker``: runs the asynchronous invocations the gateway stored in NATS JetStream.

The gateway answers ``POST /async-function/<name>[.<namespace>]`` with 202 and ``X-Call-Id`` once the
request is stored in the stream ``--async-stream`` (default ``fastgshare-async``; the message format is
:mod:`fastgshare_gateway.queue`). This worker reads the stream through one durable pull consumer
(``--durable``, shared by every replica of the worker), and for each message:

1. calls ``<--gateway-url>/function/<name>.<namespace>[/rest][?query]`` with the stored method, headers,
   body and ``X-Call-Id`` (and the gateway's credentials from ``--basic-auth-dir`` when given), at most
   ``--max-inflight`` calls per function at once;
2. on 429, 5xx or the gateway unreachable, retries with exponential back-off (``--retry-base`` doubling up
   to ``--retry-max`` seconds) up to ``--max-retries`` times. A function still failing then is recorded as
   failed (a log line, ``fastgshare_queue_failures_total``) and the callback gets its last status. A
   gateway still unreachable then leaves the message in the queue (redelivered later, no callback);
3. posts the answer to the ``X-Callback-Url`` the caller gave, with OpenFaaS's headers ``X-Call-Id``,
   ``X-Function-Name``, ``X-Function-Status``, ``X-Duration-Seconds`` (retried like the call; given up
   after ``--max-retries``: ``fastgshare_queue_callback_failures_total``);
4. only then acknowledges the message, which removes it from the stream (at-least-once: a worker that dies
   before step 4 leaves the message to be delivered again after ``--ack-wait``; while a call runs the
   worker tells JetStream it is in progress, so a slow call is not redelivered).

Duplicates: a call runs twice when a worker dies (or loses NATS) after the call and before the
acknowledgement reaches JetStream. The worker skips a call id it completed itself
(``fastgshare_queue_duplicates_total``) and counts every delivery after the first
(``fastgshare_queue_redeliveries_total``); functions that must not run twice use ``X-Call-Id``.

``--listen`` (default ``0.0.0.0:8081``) serves ``/healthz`` (200 while the consumer is bound) and
``/metrics``: ``fastgshare_queue_pending{function_name="<fn>.<ns>"}`` (messages stored and not yet
acknowledged: the queued demand the autoscaler may read), ``fastgshare_queue_inflight``,
``fastgshare_queue_retries_total``, ``fastgshare_queue_failures_total``,
``fastgshare_queue_callback_failures_total``, ``fastgshare_queue_duplicates_total``,
``fastgshare_queue_redeliveries_total``, ``fastgshare_queue_completed_total{function_name,code}``,
``fastgshare_queue_malformed_total``.

Modules: :mod:`.main` (flags, wiring), :mod:`.worker` (the loop and the rules above, through ports),
:mod:`.retry` (pure back-off), :mod:`.consumer` (the NATS adapter), :mod:`.calls` (HTTP: the gateway and
the callbacks), :mod:`.metrics` (Prometheus), :mod:`.server` (the health and metrics listener).
Docs: docs/functions.md, "Asynchronous invocations".
"""
