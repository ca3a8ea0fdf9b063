"""datafusion-python alone against its tables from `datafusion_lakecache`, side by side in one
run: first contact (a new session registers the lake and runs the query once) and warm
(the same session runs it again), over the S3 server behind a proxy that holds every request
`LAKECACHE_S3_LATENCY_MS` (one delay per real request, as a remote store's round trip).

Run by `bash scripts/bench-python` (a release build of the module, the S3 server at 25 ms;
the server's helpers are python/tests/s3_server.py):

    bash scripts/bench-python [--files 200] [--runs 3] [--warm 5]

Each first-contact figure is the median of `--runs` fresh states (a new SessionContext; for
the caches a new LakeCache too); each warm figure the median of `--warm` runs in the last of
them. GETs are the library's own count of requests that reached the store.
"""

import argparse
import os
import statistics
import time
import uuid

import datafusion
from s3_server import lake_table, options, server, vanilla

import datafusion_lakecache as lc
from datafusion_lakecache import _lakecache

QUERIES = {
    "group-by": "SELECT category, round(sum(value), 3) AS total FROM t GROUP BY category",
    "filter": "SELECT count(*), round(sum(value), 3) FROM t WHERE id BETWEEN 185000 AND 194999",
}


def timed(f):
    start = time.perf_counter()
    result = f()
    return (time.perf_counter() - start) * 1000, result


def side(sql, new_state, runs, warm):
    """First contact (median of `runs` new states: registration and the first query) and
    warm (median of `warm` further runs in the last state) in ms, the rows, and the GETs of
    the last state's first contact and of its warm runs (None where nothing counts them)."""
    firsts = []
    for _ in range(runs):
        ms_register, (ctx, gets) = timed(new_state)
        ms_query, rows = timed(lambda: ctx.sql(sql).to_arrow_table())
        firsts.append(ms_register + ms_query)
    cold = gets()
    warms = [timed(lambda: ctx.sql(sql).to_arrow_table())[0] for _ in range(warm)]
    warm_gets = None if cold is None else gets() - cold
    return statistics.median(firsts), statistics.median(warms), rows, cold, warm_gets


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warm", type=int, default=5)
    args = parser.parse_args()
    endpoint, bucket = server()
    latency = os.environ.get("LAKECACHE_S3_LATENCY_MS", "0")
    url = f"s3://{bucket}/bench-{uuid.uuid4().hex}/"
    _lakecache.write_small_files(url, args.files, options(endpoint))
    print(
        f"{args.files} small files at {latency} ms per request; datafusion "
        f"{datafusion.__version__}; first contact: median of {args.runs} new states; warm: "
        f"median of {args.warm} runs"
    )
    print("| query | side | first contact | warm | GETs first / warm |")
    print("|---|---|---|---|---|")

    def plain():
        return vanilla(url, endpoint, bucket), lambda: None

    def with_caches():
        lake = lc.LakeCache()
        return lake_table(lake, url, endpoint), lambda: lake.stats()["store"]["gets"]

    for name, sql in QUERIES.items():
        p_first, p_warm, want, _, _ = side(sql, plain, args.runs, args.warm)
        c_first, c_warm, got, cold, warm = side(sql, with_caches, args.runs, args.warm)
        assert sorted(got.to_pylist(), key=repr) == sorted(want.to_pylist(), key=repr), name
        print(f"| {name} | datafusion-python | {p_first:.1f} ms | {p_warm:.1f} ms | |")
        print(
            f"| {name} | with the caches | {c_first:.1f} ms ({p_first / c_first:.1f}x) | "
            f"{c_warm:.1f} ms ({p_warm / c_warm:.1f}x) | {cold} / {warm} |"
        )


if __name__ == "__main__":
    main()
