"""The provider API behind basic auth, as faas-cli uses it (``faas-cli login`` then basic auth on every
``/system`` call), and the admin's limits over HTTP: replicas, image prefixes, hostile bodies."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import aiohttp

from fastgshare import keys
from fastgshare_gateway.auth import BasicAuth
from fastgshare_gateway.endpoints import Endpoint
from fastgshare_gateway.http import Options
from fastgshare_gateway.policy import DeployPolicy
from tests.integration.gateway.harness import NS, MemoryStore, echo_app, gateway, serving

DEPLOYMENT = {"service": "hello", "image": "ghcr.io/team-a/fn:1", "annotations": {keys.GPU_MEM: "1Gi"}}


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


ADMIN = basic("admin", "pw-from-the-secret")


def credentials(directory: Path, password: str = "pw-from-the-secret") -> BasicAuth:
    (directory / keys.BASIC_AUTH_USER_KEY).write_text("admin")
    (directory / keys.BASIC_AUTH_PASSWORD_KEY).write_text(password)
    return BasicAuth(directory)


async def status(client: aiohttp.ClientSession, method: str, url: str, body: Any = None,
                 auth: str | None = None, data: bytes | None = None) -> tuple[int, str, Any]:
    async with client.request(method, url, json=body if data is None else None, data=data,
                              headers={"Authorization": auth} if auth else None) as answer:
        return answer.status, await answer.text(), answer.headers


def test_system_needs_the_credentials_functions_and_probes_do_not(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        options = Options(auth=credentials(tmp_path))
        async with serving(echo_app("a")) as pod, gateway(store=store, options=options) as (gw, url), \
                aiohttp.ClientSession() as client:
            for method, path, body in (
                    ("GET", "/system/functions", None), ("POST", "/system/functions", DEPLOYMENT),
                    ("PUT", "/system/functions", DEPLOYMENT), ("DELETE", "/system/functions", {"functionName": "x"}),
                    ("POST", "/system/scale-function/hello", {"replicas": 3}), ("GET", "/system/function/hello", None),
                    ("GET", "/system/info", None), ("GET", "/system/logs", None), ("GET", "/%73ystem/functions", None)):
                for auth in (None, basic("admin", "wrong"), basic("root", "pw-from-the-secret")):
                    code, _, headers = await status(client, method, url + path, body, auth)
                    assert code == 401, (method, path, auth)
                    assert headers["WWW-Authenticate"] == 'Basic realm="fastgshare"'
            assert store.fastfuncs == {}
            # faas-cli login checks the credentials with GET /system/functions, then sends them on each call
            assert (await status(client, "GET", f"{url}/system/functions", auth=ADMIN))[0] == 200
            assert (await status(client, "POST", f"{url}/system/functions", DEPLOYMENT, ADMIN))[0] == 202
            assert (NS, "hello") in store.fastfuncs
            # invocations and the probes stay open
            gw.functions.set_endpoints((NS, "hello"), [Endpoint("a", pod)])
            assert (await status(client, "POST", f"{url}/function/hello", {"x": 1}))[0] == 200
            assert (await status(client, "GET", f"{url}/healthz"))[0] == 200
            assert (await status(client, "GET", f"{url}/metrics"))[0] == 200
    asyncio.run(scenario())


def test_auth_functions_protects_invocations_too(tmp_path: Path) -> None:
    async def scenario() -> None:
        options = Options(auth=credentials(tmp_path), auth_functions=True)
        async with serving(echo_app("a")) as pod, gateway(store=MemoryStore(), options=options) as (gw, url), \
                aiohttp.ClientSession() as client:
            gw.functions.set_endpoints((NS, "hello"), [Endpoint("a", pod)])
            assert (await status(client, "POST", f"{url}/function/hello"))[0] == 401
            assert (await status(client, "POST", f"{url}/function/hello/x/y"))[0] == 401
            assert (await status(client, "POST", f"{url}/function/hello", auth=ADMIN))[0] == 200
            assert (await status(client, "GET", f"{url}/healthz"))[0] == 200
    asyncio.run(scenario())


def test_a_rotated_password_applies_to_the_next_request(tmp_path: Path) -> None:
    async def scenario() -> None:
        options = Options(auth=credentials(tmp_path))
        async with gateway(store=MemoryStore(), options=options) as (_, url), aiohttp.ClientSession() as client:
            assert (await status(client, "GET", f"{url}/system/functions", auth=ADMIN))[0] == 200
            (tmp_path / keys.BASIC_AUTH_PASSWORD_KEY).write_text("the-new-one-is-longer")
            assert (await status(client, "GET", f"{url}/system/functions", auth=ADMIN))[0] == 401
            new = basic("admin", "the-new-one-is-longer")
            assert (await status(client, "GET", f"{url}/system/functions", auth=new))[0] == 200
    asyncio.run(scenario())


def test_replica_and_image_limits_are_400_naming_the_limit() -> None:
    async def scenario() -> None:
        store = MemoryStore()
        options = Options(policy=DeployPolicy(max_replicas=4, image_prefixes=("ghcr.io/team-a/",)))
        async with gateway(store=store, options=options) as (_, url), aiohttp.ClientSession() as client:
            many = {**DEPLOYMENT, "labels": {keys.OPENFAAS_SCALE_MIN_LABEL: "10000"}}
            code, text, _ = await status(client, "POST", f"{url}/system/functions", many)
            assert code == 400, text
            assert "4" in text, text
            assert "--max-replicas" in text, text
            code, text, _ = await status(client, "POST", f"{url}/system/functions",
                                         {**DEPLOYMENT, "image": "docker.io/evil/miner"})
            assert code == 400, text
            assert "image" in text, text
            assert "ghcr.io/team-a/" in text, text
            assert store.fastfuncs == {}
            assert (await status(client, "POST", f"{url}/system/functions", DEPLOYMENT))[0] == 202
            code, text, _ = await status(client, "PUT", f"{url}/system/functions", many)
            assert code == 400, text
            assert "--max-replicas" in text, text
            code, text, _ = await status(client, "PUT", f"{url}/system/functions",
                                         {**DEPLOYMENT, "image": "docker.io/evil/miner"})
            assert code == 400
            assert "ghcr.io/team-a/" in text
            code, text, _ = await status(client, "POST", f"{url}/system/scale-function/hello", {"replicas": 5})
            assert code == 400, text
            assert "replicas" in text, text
            assert "--max-replicas" in text, text
            assert (await status(client, "POST", f"{url}/system/scale-function/hello", {"replicas": 4}))[0] == 202
            assert store.fastfuncs[(NS, "hello")]["spec"]["fixed"]["replicas"] == 4
            assert store.fastfuncs[(NS, "hello")]["spec"]["podSpec"]["containers"][0]["image"] == DEPLOYMENT["image"]
    asyncio.run(scenario())


def test_hostile_bodies_are_400_naming_the_field_never_500() -> None:
    async def scenario() -> None:
        store = MemoryStore()
        async with gateway(store=store) as (_, url), aiohttp.ClientSession() as client:
            deep = b"[" * 200_000 + b"]" * 200_000
            for method, path in (("POST", "/system/functions"), ("PUT", "/system/functions"),
                                 ("DELETE", "/system/functions"), ("POST", "/system/scale-function/hello")):
                code, text, _ = await status(client, method, url + path, data=deep)
                assert code == 400, text
                assert text.startswith("body:"), text
            huge = b'{"serviceName": "hello", "replicas": ' + b"9" * 20_000 + b"}"
            code, text, _ = await status(client, "POST", f"{url}/system/scale-function/hello", data=huge)
            assert code == 400, text
            assert text.startswith("replicas:"), text
            code, text, _ = await status(client, "POST", f"{url}/system/functions",
                                         data=json.dumps({**DEPLOYMENT, "labels": [1]}).encode())
            assert code == 400
            assert "labels" in text
            code, text, _ = await status(client, "POST", f"{url}/system/scale-function/hello",
                                         {"replicas": 1, "namespace": {"x": 1}})
            assert code == 400
            assert "namespace" in text
            big = json.dumps({**DEPLOYMENT, "envVars": {"A": "x" * (2 * 2**20)}}).encode()
            code, text, _ = await status(client, "POST", f"{url}/system/functions", data=big)
            assert code == 413, text
            assert "body" in text, text
            assert store.fastfuncs == {}
    asyncio.run(scenario())

