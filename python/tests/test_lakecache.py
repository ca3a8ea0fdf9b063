"""The module through the published datafusion and pyarrow packages, over the S3 server the
Rust tests use (scripts/with-s3): the rows of datafusion-python alone, no request for a
repeated query, no rows for a store that may not read."""

import os
import uuid

import datafusion
import pytest
from s3_server import lake_table, options, requests, server, vanilla

import datafusion_lakecache as lc
from datafusion_lakecache import _lakecache

FILES = 12


def s3():
    """The S3 server's endpoint and bucket; skipped without one (failed in CI)."""
    found = server()
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and no S3 server: run under scripts/with-s3")
        pytest.skip("no S3 server (run under scripts/with-s3)")
    return found


@pytest.fixture(scope="module")
def lake_url():
    """A seeded lake of small files on the S3 server, written by the Rust tests' generator."""
    endpoint, bucket = s3()
    if not hasattr(_lakecache, "write_small_files"):
        pytest.fail("the module was built without its testkit feature (scripts/pytest builds it)")
    url = f"s3://{bucket}/python-{uuid.uuid4().hex}/"
    _lakecache.write_small_files(url, FILES, options(endpoint))
    return url


def plain(url):
    endpoint, bucket = s3()
    return vanilla(url, endpoint, bucket)


def cached(lake, url, key="lakecache"):
    endpoint, _ = s3()
    return lake_table(lake, url, endpoint, key)


def rows(ctx, sql):
    """The rows of `sql`, sorted (as the Rust tests compare them: not every query orders)."""
    return sorted(ctx.sql(sql).to_arrow_table().to_pylist(), key=repr)


def test_the_corpus_returns_the_rows_of_datafusion_python_and_repeats_without_a_request(lake_url):
    lake = lc.LakeCache(range_memory="256MiB")
    alone, ctx = plain(lake_url), cached(lake, lake_url)
    corpus = _lakecache.corpus()
    assert len(corpus) >= 30
    for sql in corpus:
        assert rows(ctx, sql) == rows(alone, sql), sql
    cold = requests(lake)
    assert cold > 0
    # Warm: every footer and byte the corpus reads is cached; no request reaches the store.
    for sql in corpus:
        assert rows(ctx, sql) == rows(alone, sql), sql
    assert requests(lake) == cold
    figures = lake.stats()
    assert figures["range.memory"]["hits"] > 0
    assert figures["index"]["hits"] > 0


def test_a_second_session_and_table_over_the_store_share_the_caches(lake_url):
    lake = lc.LakeCache()
    sql = "SELECT category, count(*) AS n FROM t GROUP BY category ORDER BY category"
    first = rows(cached(lake, lake_url), sql)
    cold = requests(lake)
    second = rows(cached(lake, lake_url), sql)
    assert second == first
    assert requests(lake) == cold


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


def test_a_storage_option_object_store_does_not_know_is_an_error_naming_it(tmp_path):
    lake = lc.LakeCache()
    url = "s3://some-bucket/sales/"
    misspelt = {"aws_region": "eu-west-1", "aws_regoin": "eu-west-1"}
    with pytest.raises(ValueError, match="aws_regoin") as unknown:
        lake.parquet_table(url, storage_options=misspelt)
    assert f"table {url}" in str(unknown.value)
    with pytest.raises(ValueError, match="local path"):
        lake.parquet_table(f"{tmp_path}/", storage_options={"aws_region": "eu-west-1"})


def test_credentials_come_from_the_environment_and_another_environment_is_another_store(
    lake_url, monkeypatch
):
    endpoint, _ = s3()
    for key, value in options(endpoint).items():
        monkeypatch.setenv(key.upper(), value)
    lake = lc.LakeCache()
    sql = "SELECT count(*) AS n FROM t"
    ctx = datafusion.SessionContext()
    ctx.register_table("t", lake.parquet_table(lake_url))
    assert rows(ctx, sql) == [{"n": FILES * 5000}]
    # The same URL and options in an environment with a key the server refuses: made from
    # other settings, so another store, which is served nothing the first one read.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-key")
    refused = datafusion.SessionContext()
    with pytest.raises(RuntimeError, match="403 Forbidden"):
        refused.register_table("t", lake.parquet_table(lake_url))
        rows(refused, sql)
    # Options win over the environment.
    fresh = lc.LakeCache()
    assert rows(cached(fresh, lake_url), sql) == [{"n": FILES * 5000}]


def test_a_delta_table_returns_the_rows_of_its_files_and_repeats_without_a_request():
    endpoint, bucket = s3()
    if not hasattr(_lakecache, "write_delta_table"):
        pytest.fail("the module was built without its testkit and delta features")
    url = f"s3://{bucket}/python-delta-{uuid.uuid4().hex}/"
    _lakecache.write_delta_table(url, 3, options(endpoint))
    lake = lc.LakeCache()
    ctx = datafusion.SessionContext()
    ctx.register_table("t", lake.delta_table(url, storage_options=options(endpoint)))
    # Three appends and nothing removed: every Parquet file of the table is live, so
    # datafusion-python over the files alone reads the same rows.
    alone = plain(url)
    sql = "SELECT category, count(*) AS n, round(sum(value), 3) AS total FROM t GROUP BY category"
    assert rows(ctx, sql) == rows(alone, sql)
    cold = requests(lake)
    assert rows(ctx, sql) == rows(alone, sql)
    assert requests(lake) == cold


def test_memory_limit_bounds_the_prefetching_of_the_tables_scans(lake_url):
    sql = (
        "SELECT category, count(*) AS n, round(sum(value), 3) AS total, max(name) AS name "
        "FROM t GROUP BY category"
    )
    unbounded = lc.LakeCache(range_enabled=False)
    want = rows(cached(unbounded, lake_url), sql)
    peak = unbounded.stats()["prefetch"]["peak_reserved_bytes"]
    assert peak > 0
    # A pool of what prefetching took without one: prefetching may take half of it (the
    # rest is the query's), half of what it took unbounded; the query is not refused.
    bounded = lc.LakeCache(range_enabled=False, memory_limit=peak)
    assert rows(cached(bounded, lake_url), sql) == want
    figures = bounded.stats()["prefetch"]
    assert figures["peak_reserved_bytes"] <= peak // 2, figures
