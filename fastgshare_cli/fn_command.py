"""``fastgshare fn deploy | list | invoke | logs | delete``: thin conveniences over the gateway's OpenFaaS API.

- ``deploy NAME --image IMG [--quota-request R --quota-limit L --sm S --memory M] [--replicas N]
  [--env K=V ...]`` sends an OpenFaaS ``FunctionDeployment`` (``service, image, namespace, envVars,
  labels, annotations``) with the share as ``fastgshare/gpu_*`` annotations and the replicas as the
  ``com.openfaas.scale.min/max`` labels: ``PUT /system/functions``, and ``POST`` when the gateway
  answers 404 (what ``faas-cli deploy`` does);
- ``list``: ``GET /system/functions`` as a table (or the JSON with ``-o json``);
- ``invoke NAME``: ``POST /function/<name>[.<namespace>]`` with ``--data`` or stdin, the answer's
  body on stdout;
- ``logs NAME [-f] [--tail N] [--since DURATION|TIME] [--instance POD]``: ``GET /system/logs``, each
  message's text on a line, prefixed by ``[pod]`` when more than one pod speaks (with ``-f``: when
  ``GET /system/function/NAME`` reports more than one ready pod, else from a second pod's first line
  on); ``-f`` prints lines as they come until the gateway ends the stream (its cap) or Ctrl-C.
  ``--since 10m`` is sent as the RFC 3339 time 10 minutes ago;
- ``delete NAME``: ``DELETE /system/functions`` with ``{functionName, namespace}``.

The gateway is ``--gateway URL`` (default ``$FASTGSHARE_GATEWAY``, else http://127.0.0.1:8080).
Credentials, as faas-cli takes them (HTTP basic auth, which the gateway requires on ``/system/*`` and,
with ``--auth-functions``, on ``/function/*``): user ``--gateway-user`` (default admin), password from
``--password-stdin`` (the first line of stdin), else ``$FASTGSHARE_GATEWAY_PASSWORD``; sent with every
request. Neither given: requests go without; on a 401 the password is read once from the Secret
``basic-auth`` in fastgshare-system through ``--kubeconfig`` (else ``$KUBECONFIG``, else ~/.kube/config,
as ``fastgshare cluster up`` prints it) and the request is sent again. A password is never printed.
Bad arguments: one line naming the flag, the value and what is allowed, exit 2. The gateway
unreachable or answering an error: one line with its status and message, exit 1. Only urllib.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import http.client
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any, BinaryIO, TextIO

import attrs

from fastgshare import keys
from fastgshare.errors import InvalidShareSpec
from fastgshare.share import parse_share
from fastgshare_kube import rest
from fastgshare_kube.client import KubeConfigError, load_api_client
from fastgshare_kube.errors import ApiError

ENV_GATEWAY = "FASTGSHARE_GATEWAY"
ENV_PASSWORD = "FASTGSHARE_GATEWAY_PASSWORD"
DEFAULT_USER = "admin"
SECRET_TIMEOUT_S = 10.0
DEFAULT_GATEWAY = f"http://127.0.0.1:{keys.DEFAULT_GATEWAY_PORT}"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MESSAGE_CHARS = 300  # of a gateway's error answer, in the one line we print
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
DURATION = re.compile(r"(?:\d+(?:\.\d+)?[hms])+")  # Go's form, as faas-cli's --since takes it: 1h30m, 10m, 45s
DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")

# --flag -> the annotation it sets, and the value parse_share is given for a flag left out (so
# only the flags given are checked, and request <= limit only when both are given).
SHARE_FLAGS = {
    "quota_request": ("--quota-request", keys.GPU_QUOTA_REQUEST, "0"),
    "quota_limit": ("--quota-limit", keys.GPU_QUOTA_LIMIT, "1"),
    "sm": ("--sm", keys.GPU_SM_PARTITION, "100"),
    "memory": ("--memory", keys.GPU_MEM, "1"),
}


class UsageError(Exception):
    """A bad argument; the message names the flag, the value and what is allowed."""


class GatewayError(Exception):
    """The gateway could not be reached or answered an error; the message is one line."""


@attrs.frozen
class Answer:
    status: int
    body: bytes


@attrs.frozen(repr=False)
class Credentials:
    """The gateway's basic-auth user and password (never in a repr or a message)."""

    user: str
    password: str

    def header(self) -> str:
        return "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r}, password=<hidden>)"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--gateway", metavar="URL",
                        help=f"the gateway (default: ${ENV_GATEWAY}, else {DEFAULT_GATEWAY})")
    common.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="how long to wait for the gateway's answer (default: %(default)s)")
    common.add_argument("--gateway-user", default=DEFAULT_USER, metavar="USER",
                        help="the gateway's basic-auth user (default: %(default)s)")
    common.add_argument("--password-stdin", action="store_true",
                        help=f"read the gateway's password from stdin's first line (default: ${ENV_PASSWORD}, "
                             f"else, after a 401, the Secret {keys.BASIC_AUTH_SECRET} in {keys.SYSTEM_NAMESPACE} "
                             "through the kubeconfig)")
    common.add_argument("--kubeconfig", metavar="FILE",
                        help=f"where to read the Secret {keys.BASIC_AUTH_SECRET} from when no password is given "
                             "(default: $KUBECONFIG, else ~/.kube/config)")
    namespaced = argparse.ArgumentParser(add_help=False)
    namespaced.add_argument("-n", "--namespace", metavar="NS",
                            help=f"the function's namespace (default: {keys.DEFAULT_FUNCTION_NAMESPACE})")

    fn = commands.add_parser(
        "fn", help="deploy, list, invoke, read the logs of and delete functions through the gateway's OpenFaaS API",
        description="Thin conveniences over the gateway's OpenFaaS API (/system/functions, /system/logs, "
                    "/function/NAME); "
                    "faas-cli works against the same gateway.")
    actions = fn.add_subparsers(dest="fn_command", required=True, metavar="ACTION")

    deploy = actions.add_parser(
        "deploy", parents=[common, namespaced], help="create or update a function",
        description="Send an OpenFaaS FunctionDeployment: PUT /system/functions, then POST if the function does "
                    "not exist yet. The share goes in the fastgshare/gpu_* annotations, the replicas in the "
                    f"{keys.OPENFAAS_SCALE_MIN_LABEL} and {keys.OPENFAAS_SCALE_MAX_LABEL} labels.")
    deploy.add_argument("name", help="the function's name (a DNS label: lowercase letters, digits, '-')")
    deploy.add_argument("--image", required=True, help="the container image, e.g. fastgshare/fake-fn:local")
    deploy.add_argument("--quota-request", metavar="R", help="guaranteed fraction of GPU time, 0..1")
    deploy.add_argument("--quota-limit", metavar="L", help="most GPU time, request..1")
    deploy.add_argument("--sm", metavar="S", help="percent of the GPU's SMs, 1..100")
    deploy.add_argument("--memory", metavar="M", help="GPU memory, bytes or with Ki/Mi/Gi, e.g. 1Gi")
    deploy.add_argument("--replicas", type=int, default=1, metavar="N", help="pods to run (default: %(default)s)")
    deploy.add_argument("--env", action="append", default=[], metavar="K=V", help="an environment variable; repeat")
    deploy.add_argument("--label", action="append", default=[], metavar="K=V", help="a label; repeat")
    deploy.add_argument("--annotation", action="append", default=[], metavar="K=V", help="an annotation; repeat")

    listing = actions.add_parser("list", aliases=["ls"], parents=[common, namespaced], help="the functions",
                                 description="GET /system/functions: name, namespace, image, ready replicas, "
                                             "invocations and the GPU share of each function.")
    listing.add_argument("-o", "--output", choices=["table", "json"], default="table",
                         help="output format (default: %(default)s)")

    invoke = actions.add_parser("invoke", parents=[common, namespaced], help="call a function, print its answer",
                                description="POST /function/NAME[.NAMESPACE] with --data, else stdin; the "
                                            "answer's body goes to stdout. Exit 1 if the answer is not 2xx.")
    invoke.add_argument("name")
    invoke.add_argument("-d", "--data", help="the request body (default: read stdin)")
    invoke.add_argument("--method", default="POST", help="HTTP method (default: %(default)s)")
    invoke.add_argument("--content-type", default="text/plain", help="Content-Type (default: %(default)s)")

    logs = actions.add_parser(
        "logs", parents=[common, namespaced], help="print a function's logs",
        description="GET /system/logs: the log lines of the function's pods, prefixed by [pod] when more than one "
                    "pod speaks. With -f, lines are printed as they come until the gateway ends the stream or "
                    "Ctrl-C; --timeout then bounds only the wait for the gateway's first answer.")
    logs.add_argument("name")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("--tail", type=str, metavar="N", help="the last N lines of each pod (default: all)")
    logs.add_argument("--since", metavar="DURATION|TIME",
                      help="lines from this long ago (10m, 1h30m, 45s) or since this RFC 3339 time")
    logs.add_argument("--instance", metavar="POD", help="one pod of the function only")

    delete = actions.add_parser("delete", aliases=["rm"], parents=[common, namespaced], help="remove a function",
                                description="DELETE /system/functions {functionName, namespace}.")
    delete.add_argument("name")


def fn_main(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None,
            stdin: BinaryIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    action = {"ls": "list", "rm": "delete"}.get(args.fn_command, args.fn_command)
    try:
        url = gateway_url(args.gateway if args.gateway is not None else os.environ.get(ENV_GATEWAY) or None)
        if not args.timeout > 0:
            raise UsageError(f"--timeout {args.timeout}: expected seconds > 0")
        if args.password_stdin and action == "invoke" and args.data is None:
            raise UsageError("--password-stdin with invoke: give the request body with --data (stdin holds the "
                             "password)")
        gateway = Gateway(url, args.timeout, given_credentials(args, stdin), args.gateway_user, args.kubeconfig)
        if action == "invoke":
            return _invoke(gateway, args, out, err, stdin)
        return {"deploy": _deploy, "list": _list, "logs": _logs, "delete": _delete}[action](gateway, args, out)
    except UsageError as error:
        err.write(f"fastgshare fn {action}: {error}\n")
        return EXIT_USAGE
    except GatewayError as error:
        err.write(f"fastgshare fn {action}: {error}\n")
        return EXIT_FAILED


# --- arguments ------------------------------------------------------------------------------
def gateway_url(value: str | None) -> str:
    """The gateway's base URL without a trailing slash."""
    url = (value or DEFAULT_GATEWAY).rstrip("/")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise UsageError(f"--gateway {value!r}: expected http://HOST[:PORT] or https://HOST[:PORT] "
                         f"(also from ${ENV_GATEWAY})")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise UsageError(f"--gateway {value!r}: the port must be a number in 0..65535") from None
    return url


def _dns_label(flag: str, value: str) -> str:
    if len(value) > 63 or not DNS_LABEL.fullmatch(value):
        raise UsageError(f"{flag} {value!r}: expected a DNS label (at most 63 lowercase letters, digits and "
                         "'-', starting and ending with a letter or digit)")
    return value


def _pairs(flag: str, values: Sequence[str], *, env: bool = False) -> dict[str, str]:
    result = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key or (env and not ENV_NAME.fullmatch(key)):
            what = "an environment variable name" if env else "a key"
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE with {what} before the '='")
        result[key] = value
    return result


def share_annotations(args: argparse.Namespace) -> dict[str, str]:
    """The fastgshare/gpu_* annotations for the share flags given, each checked by parse_share."""
    given = {key: getattr(args, attr) for attr, (_, key, _) in SHARE_FLAGS.items() if getattr(args, attr) is not None}
    try:
        parse_share({key: default for _, key, default in SHARE_FLAGS.values()} | given)
    except InvalidShareSpec as error:
        flags = {key: flag for flag, key, _ in SHARE_FLAGS.values()}
        problems = [f"{flags[p.field]} ({p.field}): {p.message}" for p in error.problems if p.field in given]
        if problems:
            raise UsageError("; ".join(problems)) from None
    return given


def deployment(args: argparse.Namespace) -> dict[str, Any]:
    """The OpenFaaS FunctionDeployment that ``fn deploy`` sends."""
    if args.replicas < 0:
        raise UsageError(f"--replicas {args.replicas}: expected a whole number >= 0")
    if not args.image.strip():
        raise UsageError("--image '': expected an image reference, e.g. fastgshare/fake-fn:local")
    labels = _pairs("--label", args.label)
    labels[keys.OPENFAAS_SCALE_MIN_LABEL] = labels[keys.OPENFAAS_SCALE_MAX_LABEL] = str(args.replicas)
    annotations = _pairs("--annotation", args.annotation) | share_annotations(args)
    return {
        "service": _dns_label("NAME", args.name),
        "image": args.image,
        "namespace": _dns_label("--namespace", args.namespace or keys.DEFAULT_FUNCTION_NAMESPACE),
        "envVars": _pairs("--env", args.env, env=True),
        "labels": labels,
        "annotations": annotations,
    }


# --- credentials ----------------------------------------------------------------------------
def given_credentials(args: argparse.Namespace, stdin: BinaryIO | None) -> Credentials | None:
    """The password given on stdin (``--password-stdin``) or in ``$FASTGSHARE_GATEWAY_PASSWORD``, else None."""
    user = args.gateway_user
    if not user or ":" in user:
        raise UsageError(f"--gateway-user {user!r}: expected a user name without ':'")
    if args.password_stdin:
        source = stdin if stdin is not None else sys.stdin.buffer
        password = source.readline().decode("utf-8", errors="strict").strip()
        if not password:
            raise UsageError("--password-stdin: stdin held no password (pipe it in, e.g. "
                             f"kubectl get secret {keys.BASIC_AUTH_SECRET} -n {keys.SYSTEM_NAMESPACE} "
                             f"-o jsonpath='{{.data.{keys.BASIC_AUTH_PASSWORD_KEY}}}' | base64 -d | fastgshare fn ... "
                             "--password-stdin)")
        return Credentials(user, password)
    if password := os.environ.get(ENV_PASSWORD, "").strip():
        return Credentials(user, password)
    return None


def _kubeconfig_path(flag: str | None) -> str | None:
    if flag:
        return flag
    candidates = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    candidates.append(os.path.expanduser("~/.kube/config"))
    return next((p for p in candidates if os.path.isfile(p)), None)


def secret_credentials(kubeconfig: str | None) -> tuple[Credentials | None, str]:
    """The gateway's credentials from the Secret ``basic-auth`` in the system namespace, or None and why not
    (a short reason without any secret value)."""
    path = _kubeconfig_path(kubeconfig)
    if path is None:
        return None, "no kubeconfig to read the Secret with"
    try:
        with load_api_client(path) as api:
            secret = rest.call(rest.core_v1(api).read_namespaced_secret, keys.BASIC_AUTH_SECRET,
                               keys.SYSTEM_NAMESPACE, timeout_s=SECRET_TIMEOUT_S)
    except KubeConfigError as error:
        return None, str(error)
    except ApiError as error:
        return None, (f"cannot read Secret {keys.SYSTEM_NAMESPACE}/{keys.BASIC_AUTH_SECRET}: "
                      f"{error.status} {error.reason}")
    data = secret.get("data") or {} if isinstance(secret, dict) else {}
    try:
        user = base64.b64decode(data.get(keys.BASIC_AUTH_USER_KEY) or "").decode().strip()
        password = base64.b64decode(data.get(keys.BASIC_AUTH_PASSWORD_KEY) or "").decode().strip()
    except ValueError:
        return None, f"Secret {keys.SYSTEM_NAMESPACE}/{keys.BASIC_AUTH_SECRET} does not hold base64 text"
    if not user or not password:
        return None, (f"Secret {keys.SYSTEM_NAMESPACE}/{keys.BASIC_AUTH_SECRET} lacks {keys.BASIC_AUTH_USER_KEY} "
                      f"or {keys.BASIC_AUTH_PASSWORD_KEY}")
    return Credentials(user, password), ""


@attrs.define
class Gateway:
    """The gateway's URL and the credentials to send: those given, else (after a 401) the Secret's."""

    url: str
    timeout: float
    credentials: Credentials | None
    user: str = DEFAULT_USER
    kubeconfig: str | None = None
    _looked_up: str | None = None  # why the Secret gave none; None: not looked up yet

    def request(self, method: str, path: str, body: bytes | None = None, *,
                content_type: str | None = None) -> Answer:
        answer = call(self.url, method, path, body, content_type=content_type, timeout=self.timeout,
                      auth=self.credentials.header() if self.credentials else None)
        if self._secret_found_after(answer.status):
            return self.request(method, path, body, content_type=content_type)
        return answer if answer.status != 401 else self._unauthorized(answer)

    def stream(self, path: str, *, follow: bool) -> http.client.HTTPResponse:
        """``GET path``, its 2xx answer open for reading (with ``follow``, no read timeout once it began);
        any other answer a :class:`GatewayError`."""
        response = open_stream(self.url, path, timeout=self.timeout, follow=follow,
                               auth=self.credentials.header() if self.credentials else None)
        if 200 <= response.status < 300:
            return response
        with response:
            answer = Answer(response.status, response.read())
        if self._secret_found_after(answer.status):
            return self.stream(path, follow=follow)
        raise GatewayError(message(answer if answer.status != 401 else self._unauthorized(answer)))

    def _secret_found_after(self, status: int) -> bool:
        """After a first 401 without credentials, the Secret's (read once); True: send the request again."""
        if status != 401 or self.credentials is not None or self._looked_up is not None:
            return False
        self.credentials, self._looked_up = secret_credentials(self.kubeconfig)
        return self.credentials is not None

    def _unauthorized(self, answer: Answer) -> Answer:
        hint = (f"the gateway needs its credentials: pipe the password to --password-stdin or set ${ENV_PASSWORD} "
                f"(kubectl get secret {keys.BASIC_AUTH_SECRET} -n {keys.SYSTEM_NAMESPACE} "
                f"-o jsonpath='{{.data.{keys.BASIC_AUTH_PASSWORD_KEY}}}' | base64 -d)")
        if self.credentials is not None:
            hint = f"the gateway refused the credentials of user {self.credentials.user!r}"
        elif self._looked_up:
            hint += f"; {self._looked_up}"
        return Answer(401, hint.encode())


# --- the gateway ----------------------------------------------------------------------------
def call(gateway: str, method: str, path: str, body: bytes | None = None, *, content_type: str | None = None,
         timeout: float = 60.0, auth: str | None = None) -> Answer:
    """One request; any HTTP status is an :class:`Answer`, no answer at all a :class:`GatewayError`."""
    headers = {"Content-Type": content_type} if content_type and body is not None else {}
    if auth is not None:
        headers["Authorization"] = auth
    request = urllib.request.Request(gateway + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Answer(response.status, response.read())
    except urllib.error.HTTPError as error:
        with error:
            return Answer(error.code, error.read())
    except TimeoutError:
        raise GatewayError(f"no answer from the gateway at {gateway} within {timeout:g} s") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        reason = getattr(error, "reason", error)
        raise GatewayError(f"cannot reach the gateway at {gateway}: {reason} (is it running? pass --gateway URL "
                           f"or set ${ENV_GATEWAY})") from None


def open_stream(gateway: str, path: str, *, timeout: float, follow: bool,
                auth: str | None = None) -> http.client.HTTPResponse:
    """``GET gateway+path`` with http.client (urllib cannot lift the read timeout once the answer began)."""
    parts = urllib.parse.urlsplit(gateway)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname or "", parts.port, timeout=timeout)
    try:
        connection.request("GET", parts.path + path, headers={"Authorization": auth} if auth else {})
        response = connection.getresponse()
        if follow and connection.sock is not None:
            connection.sock.settimeout(None)
        return response
    except TimeoutError:
        connection.close()
        raise GatewayError(f"no answer from the gateway at {gateway} within {timeout:g} s") from None
    except (OSError, http.client.HTTPException) as error:
        connection.close()
        raise GatewayError(f"cannot reach the gateway at {gateway}: {error} (is it running? pass --gateway URL "
                           f"or set ${ENV_GATEWAY})") from None


def message(answer: Answer) -> str:
    """The gateway's error answer as one line: its status and the start of its message."""
    text = answer.body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        text = str(data.get("message") or data.get("error") or text)
    line = " ".join(text.split())
    if len(line) > MESSAGE_CHARS:
        line = line[:MESSAGE_CHARS] + "..."
    reason = http.client.responses.get(answer.status, "")
    return f"the gateway answered {answer.status} {reason}".rstrip() + (f": {line}" if line else "")


def _ok(answer: Answer) -> bool:
    return 200 <= answer.status < 300


# --- the actions ----------------------------------------------------------------------------
def _deploy(gateway: Gateway, args: argparse.Namespace, out: TextIO) -> int:
    body = json.dumps(deployment(args)).encode()
    answer = gateway.request("PUT", "/system/functions", body, content_type="application/json")
    created = answer.status == 404
    if created:
        answer = gateway.request("POST", "/system/functions", body, content_type="application/json")
    if not _ok(answer):
        raise GatewayError(message(answer))
    namespace = args.namespace or keys.DEFAULT_FUNCTION_NAMESPACE
    out.write(f"{'created' if created else 'updated'} function {args.name} in {namespace} "
              f"({args.replicas} replica{'' if args.replicas == 1 else 's'}, image {args.image}) via {gateway.url}\n")
    return EXIT_OK


def _list(gateway: Gateway, args: argparse.Namespace, out: TextIO) -> int:
    query = f"?{urllib.parse.urlencode({'namespace': args.namespace})}" if args.namespace else ""
    answer = gateway.request("GET", f"/system/functions{query}")
    if not _ok(answer):
        raise GatewayError(message(answer))
    try:
        functions = json.loads(answer.body)
    except ValueError:
        functions = None
    if not isinstance(functions, list) or not all(isinstance(f, dict) for f in functions):
        raise GatewayError(f"the gateway's /system/functions is not a JSON list of functions: "
                           f"{answer.body[:100]!r}")
    if args.output == "json":
        out.write(json.dumps(functions, indent=2) + "\n")
        return EXIT_OK
    out.write(function_table(functions))
    return EXIT_OK


def function_table(functions: Sequence[dict[str, Any]]) -> str:
    """NAME, NAMESPACE, IMAGE, READY (available/replicas), INVOCATIONS and SHARE, aligned."""
    if not functions:
        return "no functions\n"
    rows = [("NAME", "NAMESPACE", "IMAGE", "READY", "INVOCATIONS", "SHARE")]
    for fn in sorted(functions, key=lambda f: (str(f.get("namespace", "")), str(f.get("name", "")))):
        invocations = fn.get("invocationCount", 0)
        count = f"{invocations:g}" if isinstance(invocations, (int, float)) else str(invocations)
        rows.append((str(fn.get("name", "?")), str(fn.get("namespace", "")), str(fn.get("image", "")),
                     f"{fn.get('availableReplicas', 0)}/{fn.get('replicas', 0)}", count,
                     _share_text(fn.get("annotations") or {})))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n"
                   for row in rows)


def _share_text(annotations: dict[str, Any]) -> str:
    """``time 0.2..0.5, 50% SM, 1Gi`` from whichever share annotations are there; ``-`` if none."""
    if not isinstance(annotations, dict):
        return "-"
    parts = []
    request, limit = annotations.get(keys.GPU_QUOTA_REQUEST), annotations.get(keys.GPU_QUOTA_LIMIT)
    if request is not None or limit is not None:
        parts.append(f"time {request if request is not None else '?'}..{limit if limit is not None else '?'}")
    if (sm := annotations.get(keys.GPU_SM_PARTITION)) is not None:
        parts.append(f"{sm}% SM")
    if (memory := annotations.get(keys.GPU_MEM)) is not None:
        parts.append(str(memory))
    return ", ".join(parts) or "-"


def _invoke(gateway: Gateway, args: argparse.Namespace, out: TextIO, err: TextIO, stdin: BinaryIO | None) -> int:
    name = _dns_label("NAME", args.name)
    target = f"{name}.{_dns_label('--namespace', args.namespace)}" if args.namespace else name
    if not re.fullmatch(r"[A-Za-z]+", args.method):
        raise UsageError(f"--method {args.method!r}: expected an HTTP method such as POST or GET")
    if args.data is not None:
        body: bytes | None = args.data.encode()
    else:
        source = stdin if stdin is not None else sys.stdin.buffer
        body = source.read()
    if args.method.upper() in ("GET", "HEAD") and not body:
        body = None
    answer = gateway.request(args.method.upper(), f"/function/{target}", body, content_type=args.content_type)
    if not _ok(answer):
        raise GatewayError(f"function {target}: {message(answer)}")
    _write_bytes(out, answer.body)
    return EXIT_OK


def _write_bytes(out: TextIO, data: bytes) -> None:
    """The function's answer as it came: bytes to a binary stream where there is one."""
    buffer = getattr(out, "buffer", None)
    if buffer is not None:
        out.flush()
        buffer.write(data)
        buffer.flush()
    else:
        out.write(data.decode("utf-8", errors="replace"))
        out.flush()


def since_time(value: str, now: datetime.datetime) -> str:
    """``--since``: a duration back from ``now`` (``10m``, ``1h30m``, ``45s``) or an RFC 3339 time, as the
    RFC 3339 time the gateway takes."""
    if DURATION.fullmatch(value):
        seconds = sum(float(number) * {"h": 3600, "m": 60, "s": 1}[unit]
                      for number, unit in DURATION_PART.findall(value))
        return (now - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    if RFC3339.fullmatch(value):
        with contextlib.suppress(ValueError):
            datetime.datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", value))
            return value
    raise UsageError(f"--since {value!r}: expected a duration such as 10m, 1h30m or 45s, or an RFC 3339 time such "
                     "as 2026-01-02T03:04:05Z")


def logs_query(args: argparse.Namespace, now: datetime.datetime) -> dict[str, str]:
    """The query string of ``GET /system/logs`` for ``fn logs``' arguments."""
    query = {"name": _dns_label("NAME", args.name),
             "namespace": _dns_label("--namespace", args.namespace or keys.DEFAULT_FUNCTION_NAMESPACE),
             "follow": "true" if args.follow else "false"}
    if args.tail is not None:
        if not args.tail.isdigit() or int(args.tail) < 1:
            raise UsageError(f"--tail {args.tail!r}: expected a whole number of lines >= 1 (leave it out for all)")
        query["tail"] = str(int(args.tail))
    if args.since is not None:
        query["since"] = since_time(args.since, now)
    if args.instance is not None:
        query["instance"] = args.instance
    return query


def _log_message(line: bytes) -> tuple[str, str]:
    """A /system/logs line as (instance, text)."""
    try:
        data = json.loads(line)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise GatewayError(f"the gateway's /system/logs sent a line that is not a log message: {line[:100]!r}")
    return str(data.get("instance", "")), data["text"]


def _ready_pods(gateway: Gateway, name: str, namespace: str) -> int:
    """The function's ready pods as the gateway reports them (0 when it does not say)."""
    answer = gateway.request("GET", f"/system/function/{name}?{urllib.parse.urlencode({'namespace': namespace})}")
    try:
        status = json.loads(answer.body) if _ok(answer) else {}
        return int(status.get("availableReplicas") or 0) if isinstance(status, dict) else 0
    except (ValueError, TypeError):
        return 0


def _logs(gateway: Gateway, args: argparse.Namespace, out: TextIO) -> int:
    query = logs_query(args, datetime.datetime.now(datetime.UTC))
    response = gateway.stream(f"/system/logs?{urllib.parse.urlencode(query)}", follow=args.follow)
    try:
        with response:
            lines = (line for line in iter(response.readline, b"") if line.strip())
            if not args.follow:
                messages = [_log_message(line) for line in lines]
                several = len({instance for instance, _ in messages}) > 1
                out.write("".join(f"[{i}] {text}\n" if several else f"{text}\n" for i, text in messages))
                return EXIT_OK
            seen: set[str] = set()
            several = args.instance is None and _ready_pods(gateway, query["name"], query["namespace"]) > 1
            for line in lines:
                instance, text = _log_message(line)
                seen.add(instance)
                several = several or len(seen) > 1
                out.write(f"[{instance}] {text}\n" if several else f"{text}\n")
                out.flush()
    except KeyboardInterrupt:
        return EXIT_OK  # how one stops following
    except (OSError, http.client.HTTPException) as error:
        raise GatewayError(f"the log stream from the gateway broke: {error}") from None
    return EXIT_OK


def _delete(gateway: Gateway, args: argparse.Namespace, out: TextIO) -> int:
    name = _dns_label("NAME", args.name)
    namespace = _dns_label("--namespace", args.namespace or keys.DEFAULT_FUNCTION_NAMESPACE)
    body = json.dumps({"functionName": name, "namespace": namespace}).encode()
    answer = gateway.request("DELETE", "/system/functions", body, content_type="application/json")
    if answer.status == 404:
        raise GatewayError(f"no function {name} in {namespace} ({message(answer)})")
    if not _ok(answer):
        raise GatewayError(message(answer))
    out.write(f"deleted function {name} from {namespace}\n")
    return EXIT_OK
