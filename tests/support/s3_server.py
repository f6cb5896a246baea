"""An S3-compatible server on loopback for the storage tests: moto's server mode, the server s3fs and pandas test
against. It runs in the test process (a thread); drivers, executors and cluster workers started by the tests reach
it over loopback through the standard AWS environment variables, the way users configure a real endpoint.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from standalone_cluster import free_port

ENV_KEYS = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)


@dataclass
class S3Server:
    endpoint: str
    env: dict[str, str]

    def bucket(self) -> str:
        """A new, empty bucket; returns its name."""
        import boto3

        name = f"tg-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint, **_credentials(self.env)).create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """The objects under `prefix`, less the empty directory markers pyarrow leaves (names ending in '/')."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, **_credentials(self.env))
        out: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out.extend(o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/"))
        return sorted(out)


def _credentials(env: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_REGION"],
    }


@contextlib.contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    """This process's AWS environment set to `env` meanwhile (restored afterwards)."""
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def s3_server(point_environ: bool = True) -> Iterator[S3Server]:
    """Start the server and (`point_environ`) point this process's environment at it (restored afterwards)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "tidegauge-test",
        "AWS_SECRET_ACCESS_KEY": "tidegauge-test-secret",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    try:
        with environ(env) if point_environ else contextlib.nullcontext():
            yield S3Server(endpoint, env)
    finally:
        server.stop()
