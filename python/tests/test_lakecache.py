"""The module through the published datafusion and pyarrow packages, over the S3 server the
Rust tests use (scripts/with-s3): the rows of datafusion-python alone, no request for a
repeated query, no rows for a store that may not read."""

import gc
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import datafusion
import pyarrow as pa
import pyarrow.parquet as pq
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


def file_of(url, index):
    """The URL of file `index` of the seeded lake at `url` (LakeSpec::file_name)."""
    return f"{url}part-{index:05d}.parquet"


def disk_process(mode, url, disk):
    """Runs disk_process.py in a Python process of its own; its JSON."""
    endpoint, _ = s3()
    script = Path(__file__).with_name("disk_process.py")
    done = subprocess.run(
        [sys.executable, str(script), mode, url, str(disk), endpoint],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_flush_leaves_the_disk_tier_to_the_next_process_which_reads_it_without_a_get(
    lake_url, tmp_path
):
    disk = tmp_path / "disk"
    # A process reads the lake once, flushes and exits at once: what it fetched is on disk.
    first = disk_process("write", lake_url, disk)
    wrote = first["after"]["range.disk"]
    assert first["after"]["store"]["gets"] > 0
    assert wrote["writes"] > 0 and wrote["write_errors"] == 0, wrote
    assert wrote["entries"] > 0
    # The next process over the directory finds every entry, and answers the same query
    # from disk: its store only lists and proves access (one HEAD per file), sends no GET.
    second = disk_process("read", lake_url, disk)
    assert second["opened"]["range.disk"]["entries"] == wrote["entries"]
    assert second["opened"]["range.disk"]["bytes"] == wrote["bytes"]
    assert second["rows"] == first["rows"]
    figures = second["after"]
    assert figures["range.disk"]["hits"] > 0
    assert figures["range.disk"]["bytes_served"] > 0
    assert figures["store"]["gets"] == 0, figures
    assert figures["handle.proofs"]["heads"] >= FILES


def test_processes_open_one_disk_tier_at_once_and_read_what_the_others_wrote(
    lake_url, tmp_path
):
    disk = tmp_path / "disk"
    endpoint, _ = s3()
    script = Path(__file__).with_name("disk_process.py")
    # A worker opens the directory and holds it open...
    holder = subprocess.Popen(
        [sys.executable, str(script), "hold", lake_url, str(disk), endpoint],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "opened", holder.stderr.read()
        # ...while another opens it too, reads the lake and flushes...
        other = disk_process("write", lake_url, disk)
        assert other["after"]["range.disk"]["writes"] > 0, other["after"]["range.disk"]
        # ...and the first, opened before those bytes were there, reads them from disk:
        # no GET, only the proofs of its own store's access (one HEAD per file).
        out, err = holder.communicate(input="", timeout=300)
    finally:
        holder.kill()
    assert holder.returncode == 0, err
    held = json.loads(out)
    assert held["rows"] == other["rows"]
    figures = held["after"]
    assert figures["range.disk"]["hits"] > 0, figures["range.disk"]
    assert figures["store"]["gets"] == 0, figures
    assert figures["handle.proofs"]["heads"] >= FILES


def test_flush_without_a_disk_tier_returns_at_once():
    lake = lc.LakeCache()
    lake.flush()
    assert lake.stats()["range.disk"]["writes"] == 0


def test_invalidate_sends_the_next_read_of_an_object_or_a_prefix_to_the_store(lake_url):
    lake = lc.LakeCache()
    ctx = cached(lake, lake_url)
    sql = "SELECT count(*) AS n, round(sum(value), 3) AS total, max(name) AS name FROM t"
    want = rows(ctx, sql)
    cold = lake.stats()["store"]["gets"]
    listed = lake.stats()["handle.listings"]["misses"]
    assert rows(ctx, sql) == want
    assert lake.stats()["store"]["gets"] == cold, "warm: no GET"

    def gets_after(url):
        before = lake.stats()
        lake.invalidate(url)
        assert rows(ctx, sql) == want
        after = lake.stats()
        relisted = after["handle.listings"]["misses"] - before["handle.listings"]["misses"]
        return after["store"]["gets"] - before["store"]["gets"], relisted

    # One object: its footer and bytes are fetched again (and the listing that holds it is
    # listed again); the other files' are not.
    one, relisted = gets_after(file_of(lake_url, 3))
    assert 0 < one < cold / 2, (one, cold)
    assert relisted >= 1
    # A prefix: every object below it.
    every, relisted = gets_after(lake_url)
    assert every >= FILES and every > one, (every, one, cold)
    assert relisted >= 1
    # Read again, all of it is cached again.
    settled = lake.stats()["store"]["gets"]
    assert rows(ctx, sql) == want
    assert lake.stats()["store"]["gets"] == settled
    assert lake.stats()["handle.listings"]["misses"] > listed


def write_local(path, values):
    pq.write_table(pa.table({"id": pa.array(values, pa.int64())}), path)


def test_invalidate_shows_files_added_and_rewritten_behind_the_cache(tmp_path):
    lake_dir = tmp_path / "lake"
    lake_dir.mkdir()
    write_local(lake_dir / "a.parquet", [1, 2, 3])
    write_local(lake_dir / "b.parquet", [10])
    lake = lc.LakeCache()
    ctx = datafusion.SessionContext()
    ctx.register_table("t", lake.parquet_table(f"{lake_dir}/"))
    sql = "SELECT count(*) AS n, sum(id) AS total FROM t"
    assert rows(ctx, sql) == [{"n": 4, "total": 16}]
    # A file added: the cached listing (lakecache.handle.list_ttl, a minute) does not show it.
    write_local(lake_dir / "c.parquet", [100, 200])
    assert rows(ctx, sql) == [{"n": 4, "total": 16}]
    # Forgetting the directory lists it again.
    lake.invalidate(f"{lake_dir}/")
    assert rows(ctx, sql) == [{"n": 6, "total": 316}]
    # One file rewritten, then forgotten: the next query reads it as it is now.
    write_local(lake_dir / "b.parquet", [20, 30, 40])
    lake.invalidate(str(lake_dir / "b.parquet"))
    assert rows(ctx, sql) == [{"n": 8, "total": 396}]
    # The directory without its `/` names it too, as it exists.
    (lake_dir / "c.parquet").unlink()
    lake.invalidate(str(lake_dir))
    assert rows(ctx, sql) == [{"n": 6, "total": 96}]


def test_invalidate_refuses_what_names_no_object_or_prefix(tmp_path):
    lake = lc.LakeCache()
    for bad in ["http://[::1", f"{tmp_path}/*.parquet"]:
        with pytest.raises(ValueError, match="invalidate") as refused:
            lake.invalidate(bad)
        assert bad in str(refused.value)
    # A URL the cache holds nothing of is nothing to forget.
    lake.invalidate("s3://some-bucket/sales/")
    lake.invalidate("s3://some-bucket/sales/a.parquet")


def test_drop_stores_drops_the_stores_no_table_uses_and_the_caches_stay(lake_url):
    endpoint, _ = s3()
    lake = lc.LakeCache()
    sql = "SELECT category, count(*) AS n FROM t GROUP BY category"
    assert lake.drop_stores() == 0
    ctx = cached(lake, lake_url)
    want = rows(ctx, sql)
    # A key no longer valid: its table fails, and it is another store the cache keeps.
    with pytest.raises(RuntimeError, match="403 Forbidden"):
        lake.parquet_table(lake_url, storage_options=options(endpoint, key="not-a-key"))
    # The refused key made no table, so its store is used by none: it goes; the table in use
    # keeps its own.
    assert lake.drop_stores() == 1
    assert lake.drop_stores() == 0
    assert rows(ctx, sql) == want
    # Once the table is gone, so may its store.
    ctx.deregister_table("t")
    del ctx
    gc.collect()
    assert lake.drop_stores() == 1
    # A new store over the same URL and key lists again and proves each file with a HEAD;
    # footers and bytes (named by their content, as S3's MD5 e_tags do) come from the caches.
    before = lake.stats()
    assert rows(cached(lake, lake_url), sql) == want
    after = lake.stats()
    assert after["store"]["gets"] == before["store"]["gets"], (before["store"], after["store"])
    assert after["handle.proofs"]["heads"] - before["handle.proofs"]["heads"] >= FILES
    assert after["handle.listings"]["misses"] > before["handle.listings"]["misses"]
