"""An Iceberg table of 200 data files on the S3 server behind a proxy that holds every
request (one delay per real request) for an S3-like wait around `LAKECACHE_S3_LATENCY_MS`
(`LAKECACHE_S3_LATENCY_SPREAD=s3`: log-normal, one in a hundred 20 times longer), read three
ways in one run:
datafusion-python with the module's table (`LakeCache.iceberg_table`), pyiceberg's own scan
(`table.scan(...).to_arrow()`, then pyarrow for the aggregate), and DuckDB with its iceberg
extension (`iceberg_scan` of the table's metadata file). The table is written by pyiceberg
(10 appends of 20 identity partitions: 200 files, 10 manifests).

Run by `bash scripts/bench-iceberg` (a release build of the module, the S3 server at 25 ms):

    bash scripts/bench-iceberg [--appends 10] [--partitions 20] [--rows 2000] [--runs 3] [--warm 5]

First contact: a new state (a new session and table; for the module a new LakeCache; for
pyiceberg the table loaded from its catalog; for DuckDB a new connection) and the first
query, median of `--runs`. Warm: the same state queried again, median of `--warm`. Requests
are counted at the proxy (every HTTP request any reader sends), for the last state.
"""

import argparse
import os
import statistics
import tempfile
import time
import uuid

import datafusion
import duckdb
import duckdb_extensions
import pyarrow as pa
import pyarrow.compute as pc
from iceberg_tables import catalog
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType
from s3_server import KEY, options, server

import datafusion_lakecache as lc

QUERIES = {
    "group-by": (
        "SELECT category, count(*) AS n, round(sum(amount), 3) AS total FROM t GROUP BY category",
        None,
    ),
    "filter": (
        "SELECT count(*) AS n, round(sum(amount), 3) AS total FROM t WHERE id BETWEEN 150000 AND 151999",
        (150000, 151999),
    ),
}


def requests():
    """Requests the proxy has seen so far."""
    with open(os.environ["LAKECACHE_PROXY_COUNTS"], "rb") as f:
        return sum(1 for _ in f)


def timed(f):
    start = time.perf_counter()
    result = f()
    return (time.perf_counter() - start) * 1000, result


def write_table(cat, appends, partitions, rows):
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "part", LongType()),
        NestedField(3, "category", StringType()),
        NestedField(4, "amount", DoubleType()),
    )
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "part"))
    table = cat.create_table(f"db.b{uuid.uuid4().hex[:6]}", schema=schema, partition_spec=spec)
    per_file = rows
    for a in range(appends):
        first = a * partitions * per_file
        ids = list(range(first, first + partitions * per_file))
        batch = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "part": pa.array([i // per_file % partitions for i in ids], pa.int64()),
                "category": [("alpha", "beta", "gamma", "delta")[i % 4] for i in ids],
                "amount": [(i % 1000) * 0.25 for i in ids],
            },
            schema=table.schema().as_arrow(),
        )
        table.append(batch)
    return table


def pyiceberg_query(table, bounds):
    scan = table.scan(selected_fields=("id", "category", "amount"))
    if bounds is not None:
        scan = table.scan(
            row_filter=And(GreaterThanOrEqual("id", bounds[0]), LessThanOrEqual("id", bounds[1])),
            selected_fields=("id", "category", "amount"),
        )
    arrow = scan.to_arrow()
    if bounds is None:
        grouped = arrow.group_by("category").aggregate([("id", "count"), ("amount", "sum")])
        return sorted((r["category"], r["id_count"], round(r["amount_sum"], 3)) for r in grouped.to_pylist())
    total = pc.sum(arrow["amount"]).as_py()
    return [(len(arrow), None if total is None else round(total, 3))]


def canonical(rows):
    return sorted(tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in rows)


def side(new_state, query, runs, warm):
    """(first contact ms, warm ms, rows, requests of the last first contact, per warm run)."""
    firsts = []
    for _ in range(runs):
        before = requests()
        ms, (state, rows) = timed(lambda: new_state_and_query(new_state, query))
        firsts.append(ms)
        cold = requests() - before
    before = requests()
    warms = [timed(lambda: query(state))[0] for _ in range(warm)]
    per_warm = (requests() - before) / max(warm, 1)
    return statistics.median(firsts), statistics.median(warms), rows, cold, per_warm


def new_state_and_query(new_state, query):
    state = new_state()
    return state, query(state)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--appends", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warm", type=int, default=5)
    args = parser.parse_args()
    endpoint, bucket = server()
    latency = os.environ.get("LAKECACHE_S3_LATENCY_MS", "0") + " ms"
    if os.environ.get("LAKECACHE_S3_LATENCY_SPREAD") == "s3":
        latency += " (the median of S3-like waits)"
    directory = tempfile.mkdtemp()
    cat = catalog(directory, f"s3://{bucket}/ib-{uuid.uuid4().hex[:8]}", endpoint)
    table = write_table(cat, args.appends, args.partitions, args.rows)
    files = len(list(table.scan().plan_files()))
    metadata = table.metadata_location
    print(
        f"{files} data files in {args.appends} manifests, {files * args.rows} rows, at {latency} "
        f"per request; datafusion {datafusion.__version__}, duckdb {duckdb.__version__}; first "
        f"contact: median of {args.runs} new states; warm: median of {args.warm} runs"
    )
    print("| query | reader | first contact | warm | requests first / per warm run |")
    print("|---|---|---|---|---|")
    host = endpoint.split("://", 1)[1]

    def ours():
        lake = lc.LakeCache()
        ctx = datafusion.SessionContext()
        ctx.register_table("t", lake.iceberg_table(table.location(), options(endpoint)))
        return ctx

    def pyiceberg():
        return cat.load_table(table.name())

    def duck():
        con = duckdb.connect()
        duckdb_extensions.import_extension("httpfs", con=con)
        duckdb_extensions.import_extension("avro", con=con)
        duckdb_extensions.import_extension("iceberg", con=con)
        con.sql(
            f"CREATE SECRET (TYPE s3, KEY_ID '{KEY}', SECRET '{KEY}', ENDPOINT '{host}', "
            "URL_STYLE 'path', USE_SSL false, REGION 'us-east-1')"
        )
        con.sql(f"CREATE VIEW t AS SELECT * FROM iceberg_scan('{metadata}')")
        return con

    for name, (sql, bounds) in QUERIES.items():
        readers = {
            "datafusion + lakecache": (ours, lambda ctx: canonical(ctx.sql(sql).to_arrow_table().to_pylist())),
            "pyiceberg scan": (pyiceberg, lambda t: pyiceberg_query(t, bounds)),
            "duckdb iceberg_scan": (duck, lambda con: canonical(con.sql(sql).fetchall())),
        }
        results = {}
        for reader, (new_state, query) in readers.items():
            first, warm, rows, cold, per_warm = side(new_state, query, args.runs, args.warm)
            results[reader] = rows
            print(
                f"| {name} | {reader} | {first:.1f} ms | {warm:.1f} ms | {cold} / {per_warm:.0f} |"
            )
        answers = {repr(canonical(rows)) for rows in results.values()}
        assert len(answers) == 1, results


if __name__ == "__main__":
    main()
