"""``fastgshare-gateway``: routes ``/function/<name>`` to a function's ready pods and serves the OpenFaaS
provider API (``/system/...``) over FaSTFunc objects, with OpenFaaS's gateway metrics (docs/functions.md)."""
