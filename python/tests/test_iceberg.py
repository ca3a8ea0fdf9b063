"""Iceberg tables pyiceberg wrote, read through the module (`LakeCache.iceberg_table`): every
snapshot's rows equal pyiceberg's own scan of it, on the local disk and on the S3 server; a
filter on partitions and bounds returns pyiceberg's rows; a repeated query makes no request,
metadata included; a snapshot is found by time."""

import uuid

import datafusion
import pytest
from iceberg_tables import canonical, catalog, write_evolving, write_partitioned
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan
from s3_server import options, requests, server

import datafusion_lakecache as lc


def warehouses(tmp_path):
    """(name, catalog, storage options) of a local warehouse and, when the S3 server runs,
    one on it (in CI the server must run)."""
    found = [("local", catalog(tmp_path, f"file://{tmp_path}/warehouse"), None)]
    s3 = server()
    if s3 is not None:
        endpoint, bucket = s3
        # Short keys: the S3 server of the tests stores an object under a temporary file
        # named after its whole key, within the file system's 255 bytes.
        warehouse = f"s3://{bucket}/ice-{uuid.uuid4().hex[:10]}"
        s3_dir = tmp_path / "s3"
        s3_dir.mkdir()
        found.append(("s3", catalog(s3_dir, warehouse, endpoint), options(endpoint)))
    else:
        import os

        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and no S3 server: run under scripts/with-s3")
    return found


def session(lake, table, storage, **choice):
    ctx = datafusion.SessionContext()
    ctx.register_table("t", lake.iceberg_table(table.location(), storage, **choice))
    return ctx


def ours(ctx, sql="SELECT * FROM t"):
    return canonical(ctx.sql(sql).to_arrow_table())


@pytest.mark.parametrize("writer", [write_evolving, write_partitioned])
def test_every_snapshot_returns_the_rows_of_pyicebergs_scan(tmp_path, writer):
    for name, cat, storage in warehouses(tmp_path):
        table = writer(cat, f"t{uuid.uuid4().hex[:6]}")
        snapshots = table.snapshots()
        assert len(snapshots) >= 5
        lake = lc.LakeCache()
        for snapshot in snapshots:
            want = canonical(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow())
            ctx = session(lake, table, storage, snapshot_id=snapshot.snapshot_id)
            assert ours(ctx) == want, (name, snapshot.snapshot_id, snapshot.summary.operation)
        newest = session(lake, table, storage)
        assert ours(newest) == canonical(table.scan().to_arrow()), name
        # Time travel: the snapshot current at the second one's commit time.
        second = snapshots[1]
        ctx = session(lake, table, storage, as_of_millis=second.timestamp_ms)
        assert ours(ctx) == canonical(table.scan(snapshot_id=second.snapshot_id).to_arrow())


def test_filters_on_partitions_and_bounds_return_pyicebergs_rows(tmp_path):
    for name, cat, storage in warehouses(tmp_path):
        table = write_partitioned(cat, f"f{uuid.uuid4().hex[:6]}")
        ctx = session(lc.LakeCache(), table, storage)
        cases = [
            ("category = 'alpha'", EqualTo("category", "alpha")),
            ("id >= 40 AND id < 70", And(GreaterThanOrEqual("id", 40), LessThan("id", 70))),
            (
                "ts >= TIMESTAMP '2026-11-05 00:00:00' AND ts < TIMESTAMP '2026-11-09 00:00:00'",
                And(
                    GreaterThanOrEqual("ts", "2026-11-05T00:00:00"),
                    LessThan("ts", "2026-11-09T00:00:00"),
                ),
            ),
            ("amount < 100.0", LessThan("amount", 100.0)),
        ]
        for sql, expression in cases:
            want = canonical(table.scan(row_filter=expression).to_arrow())
            assert want, (name, sql)
            assert ours(ctx, f"SELECT * FROM t WHERE {sql}") == want, (name, sql)


def test_a_repeated_query_of_an_iceberg_table_makes_no_request(tmp_path):
    s3 = server()
    if s3 is None:
        pytest.skip("no S3 server (run under scripts/with-s3)")
    named = [w for w in warehouses(tmp_path) if w[0] == "s3"]
    _, cat, storage = named[0]
    table = write_evolving(cat, f"w{uuid.uuid4().hex[:6]}")
    lake = lc.LakeCache()
    sql = "SELECT label, count(*) AS n, sum(qty) AS q FROM t GROUP BY label"
    first = ours(session(lake, table, storage), sql)
    cold = requests(lake)
    # A new table over the same lake, in a new session: metadata, manifests and data from
    # the caches.
    assert ours(session(lake, table, storage), sql) == first
    assert requests(lake) == cold


def test_an_unknown_snapshot_is_an_error_naming_the_table(tmp_path):
    _, cat, storage = warehouses(tmp_path)[0]
    table = write_evolving(cat, f"u{uuid.uuid4().hex[:6]}")
    with pytest.raises(Exception, match="has no snapshot 12345"):
        lc.LakeCache().iceberg_table(table.location(), storage, snapshot_id=12345)


def test_position_deletes_duckdb_wrote_are_applied_at_every_snapshot(tmp_path):
    """Merge-on-read: DuckDB's iceberg extension (through a REST catalog over the same SQL
    catalog, python/tests/rest_catalog.py) deletes and updates rows by writing position
    delete files; every snapshot's rows equal pyiceberg's, which applies them too."""
    s3 = server()
    if s3 is None:
        pytest.skip("no S3 server (run under scripts/with-s3)")
    import duckdb
    import duckdb_extensions
    from rest_catalog import serve
    from s3_server import KEY

    named = [w for w in warehouses(tmp_path) if w[0] == "s3"]
    _, cat, storage = named[0]
    table = write_evolving(cat, f"m{uuid.uuid4().hex[:6]}")
    table.transaction().set_properties({"write.delete.mode": "merge-on-read"}).commit_transaction()
    rest, http = serve(cat)
    try:
        con = duckdb.connect()
        for extension in ("httpfs", "avro", "iceberg"):
            duckdb_extensions.import_extension(extension, con=con)
        endpoint, _ = s3
        host = endpoint.split("://", 1)[1]
        con.sql(
            f"CREATE SECRET (TYPE s3, KEY_ID '{KEY}', SECRET '{KEY}', ENDPOINT '{host}', "
            "URL_STYLE 'path', USE_SSL false, REGION 'us-east-1')"
        )
        con.sql(f"ATTACH 'warehouse' AS ice (TYPE iceberg, ENDPOINT '{rest}', AUTHORIZATION_TYPE 'none')")
        name = table.name()[-1]
        con.sql(f"DELETE FROM ice.db.{name} WHERE id % 7 = 0")
        con.sql(f"UPDATE ice.db.{name} SET label = 'updated' WHERE id % 10 = 1")
        con.sql(f"DELETE FROM ice.db.{name} WHERE id BETWEEN 80 AND 84")
    finally:
        http.shutdown()
    table = cat.load_table(table.name())
    deletes = [
        s for s in table.snapshots() if int(s.summary.get("added-position-deletes") or 0) > 0
    ]
    assert len(deletes) >= 3, [s.summary for s in table.snapshots()]
    lake = lc.LakeCache()
    for snapshot in table.snapshots():
        want = canonical(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow())
        ctx = session(lake, table, storage, snapshot_id=snapshot.snapshot_id)
        assert ours(ctx) == want, (snapshot.snapshot_id, snapshot.summary.operation)
    newest = session(lake, table, storage)
    assert ours(newest) == canonical(table.scan().to_arrow())
    assert ours(newest, "SELECT count(*) AS n FROM t") == [{"n": len(table.scan().to_arrow())}]



def test_a_column_promoted_after_registration_is_an_error_naming_the_table(tmp_path):
    import time

    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, LongType, NestedField

    _, cat, storage = warehouses(tmp_path)[0]
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "n", IntegerType()))
    table = cat.create_table(f"db.p{uuid.uuid4().hex[:6]}", schema=schema)
    table.append(pa.table({"id": pa.array([1, 2], pa.int64()), "n": pa.array([1, 2], pa.int32())}, schema=table.schema().as_arrow()))
    # The newest metadata file is looked for again once the listing (kept 10 ms) expires.
    ctx = session(lc.LakeCache(handle_list_ttl="10ms"), table, storage)
    assert ours(ctx, "SELECT sum(n) AS s FROM t") == [{"s": 3}]
    with table.update_schema() as update:
        update.update_column("n", field_type=LongType())
    table.append(pa.table({"id": pa.array([3], pa.int64()), "n": pa.array([2**40], pa.int64())}, schema=table.schema().as_arrow()))
    time.sleep(0.05)
    with pytest.raises(Exception, match="column n is Int64 now, Int32 when the table was registered"):
        ours(ctx, "SELECT sum(n) AS s FROM t")
