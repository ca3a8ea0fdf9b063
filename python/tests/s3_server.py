"""The S3 server the Rust tests use (scripts/with-s3), as the Python tests and the benchmark
reach it: its endpoint and bucket, the options of a table over it, datafusion-python's own
session over it and one with the module's table, and the requests the caches sent to a
store."""

import os

import datafusion
from datafusion.object_store import AmazonS3

# The server's one key (scripts/with-s3).
KEY = "lakecache"


def server():
    """(endpoint, bucket) of the server, or None when no server runs."""
    endpoint = os.environ.get("LAKECACHE_S3_ENDPOINT")
    if endpoint is None:
        return None
    return endpoint, os.environ.get("LAKECACHE_S3_BUCKET", "lakecache-test")


def options(endpoint, key=KEY):
    """The `storage_options` of a table over the server, signed with `key`."""
    return {
        "aws_endpoint": endpoint,
        "aws_access_key_id": key,
        "aws_secret_access_key": key,
        "aws_region": "us-east-1",
        "aws_allow_http": "true",
    }


def vanilla(url, endpoint, bucket):
    """datafusion-python alone over the Parquet files at `url`, as table `t`."""
    store = AmazonS3(
        bucket_name=bucket,
        region="us-east-1",
        access_key_id=KEY,
        secret_access_key=KEY,
        endpoint=endpoint,
        allow_http=True,
    )
    ctx = datafusion.SessionContext()
    ctx.register_object_store("s3://", store, bucket)
    ctx.register_parquet("t", url)
    return ctx


def lake_table(lake, url, endpoint, key=KEY):
    """A session with the Parquet files at `url` as table `t`, a table of `lake` signed with
    `key`."""
    ctx = datafusion.SessionContext()
    ctx.register_table("t", lake.parquet_table(url, storage_options=options(endpoint, key)))
    return ctx


def requests(lake):
    """The requests the caches of `lake` sent to its stores so far: the GETs, and the HEADs
    and LISTs behind each metadata and listing miss and each proof of a version."""
    figures = lake.stats()
    return (
        figures["store"]["gets"]
        + figures["handle.metadata"]["misses"]
        + figures["handle.listings"]["misses"]
        + figures["handle.proofs"]["heads"]
    )
