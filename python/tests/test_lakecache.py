"""The module through the published datafusion and pyarrow packages, over the S3 server the
Rust tests use (scripts/with-s3): the rows of datafusion-python alone, no request for a
repeated query, no rows for a store that may not read."""

import os
import uuid

import datafusion
import pytest
from datafusion.object_store import AmazonS3

import datafusion_lakecache as lc
from datafusion_lakecache import _lakecache

FILES = 12


def s3():
    """The S3 server's endpoint and bucket; skipped without one (failed in CI)."""
    endpoint = os.environ.get("LAKECACHE_S3_ENDPOINT")
    bucket = os.environ.get("LAKECACHE_S3_BUCKET", "lakecache-test")
    if endpoint is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and no S3 server: run under scripts/with-s3")
        pytest.skip("no S3 server (run under scripts/with-s3)")
    return endpoint, bucket


def options(endpoint, key="lakecache"):
    return {
        "aws_endpoint": endpoint,
        "aws_access_key_id": key,
        "aws_secret_access_key": key,
        "aws_region": "us-east-1",
        "aws_allow_http": "true",
    }


@pytest.fixture(scope="module")
def lake_url():
    """A seeded lake of small files on the S3 server, written by the Rust tests' generator."""
    endpoint, bucket = s3()
    if not hasattr(_lakecache, "write_small_files"):
        pytest.fail("the module was built without its testkit feature (scripts/pytest builds it)")
    url = f"s3://{bucket}/python-{uuid.uuid4().hex}/"
    _lakecache.write_small_files(url, FILES, options(endpoint))
    return url


def vanilla(url):
    """datafusion-python alone over the lake."""
    endpoint, bucket = s3()
    store = AmazonS3(
        bucket_name=bucket,
        region="us-east-1",
        access_key_id="lakecache",
        secret_access_key="lakecache",
        endpoint=endpoint,
        allow_http=True,
    )
    ctx = datafusion.SessionContext()
    ctx.register_object_store("s3://", store, bucket)
    ctx.register_parquet("t", url)
    return ctx


def cached(lake, url, key="lakecache"):
    endpoint, _ = s3()
    ctx = datafusion.SessionContext()
    ctx.register_table("t", lake.parquet_table(url, storage_options=options(endpoint, key)))
    return ctx


def rows(ctx, sql):
    """The rows of `sql`, sorted (as the Rust tests compare them: not every query orders)."""
    return sorted(ctx.sql(sql).to_arrow_table().to_pylist(), key=repr)


def gets(lake):
    return lake.stats()["store"]["gets"]


def test_the_corpus_returns_the_rows_of_datafusion_python_and_repeats_without_a_request(lake_url):
    lake = lc.LakeCache(range_memory="256MiB")
    plain, ctx = vanilla(lake_url), cached(lake, lake_url)
    corpus = _lakecache.corpus()
    assert len(corpus) >= 30
    for sql in corpus:
        assert rows(ctx, sql) == rows(plain, sql), sql
    cold = gets(lake)
    assert cold > 0
    # Warm: every footer and byte the corpus reads is cached; no request reaches the store.
    for sql in corpus:
        assert rows(ctx, sql) == rows(plain, sql), sql
    assert gets(lake) == cold
    figures = lake.stats()
    assert figures["range.memory"]["hits"] > 0
    assert figures["index"]["hits"] > 0


def test_a_second_session_and_table_over_the_store_share_the_caches(lake_url):
    lake = lc.LakeCache()
    sql = "SELECT category, count(*) AS n FROM t GROUP BY category ORDER BY category"
    first = rows(cached(lake, lake_url), sql)
    cold = gets(lake)
    second = rows(cached(lake, lake_url), sql)
    assert second == first
    assert gets(lake) == cold


def test_a_key_the_server_refuses_gets_a_403_naming_the_table_and_no_rows(lake_url):
    lake = lc.LakeCache()
    sql = "SELECT count(*) AS n FROM t"
    assert rows(cached(lake, lake_url), sql) == [{"n": FILES * 5000}]
    # The same URL with a key the server refuses: a store of its own, which has shown nothing
    # it may read, so what the caches hold of the lake is not its to be served. The server
    # refuses its first request (the listing), and the error names the table.
    with pytest.raises(RuntimeError, match="403 Forbidden") as refused:
        rows(cached(lake, lake_url, key="not-a-key"), sql)
    assert f"table {lake_url}" in str(refused.value)


def test_settings_are_validated_with_the_builders_messages():
    with pytest.raises(ValueError, match="lakecache.range.memory"):
        lc.LakeCache(range_memory="a lot")
    with pytest.raises(ValueError, match="lakecache.handle.capacty"):
        lc.LakeCache(handle_capacty=10)
    with pytest.raises(TypeError, match="range_disk"):
        lc.LakeCache(range_disk="/tmp/x")
    with pytest.raises(ValueError, match="memory_limit"):
        lc.LakeCache(memory_limit="lots")
    lake = lc.LakeCache(range_memory="64MiB", prefetch_max_in_flight=4, memory_limit="1GiB")
    assert lake.stats()["range.memory"]["capacity"] == 64 << 20


def test_a_missing_table_is_an_error_naming_it(tmp_path):
    lake = lc.LakeCache()
    missing = f"{tmp_path}/nothing-here/"
    with pytest.raises(RuntimeError, match=f"table {missing}"):
        lake.parquet_table(missing)
