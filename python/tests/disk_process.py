"""One process of the disk tier's test (test_lakecache.py): reads the lake at URL on the S3
server at ENDPOINT through a LakeCache whose disk tier is DIR, and prints as JSON the rows
and the figures of the cache when opened and after the query. With `write`, it calls
`flush()` after the query; either way it then exits at once (`os._exit`, no interpreter
teardown), as a process that is killed would: what is on disk is what `flush` waited for.
With `hold`, it opens the cache, prints `opened` and waits for its stdin to close before
the query (as `read`): another process can use the directory meanwhile.

    python disk_process.py write|read|hold URL DIR ENDPOINT
"""

import json
import os
import sys

from s3_server import lake_table

import datafusion_lakecache as lc

SQL = (
    "SELECT category, count(*) AS n, round(sum(value), 3) AS total, max(name) AS name "
    "FROM t GROUP BY category ORDER BY category"
)


def main(mode, url, disk, endpoint):
    lake = lc.LakeCache(range_disk=(disk, "256MiB"))
    opened = lake.stats()
    if mode == "hold":
        print("opened")
        sys.stdout.flush()
        sys.stdin.read()
    ctx = lake_table(lake, url, endpoint)
    rows = ctx.sql(SQL).to_arrow_table().to_pylist()
    if mode == "write":
        lake.flush()
    print(json.dumps({"opened": opened, "after": lake.stats(), "rows": rows}))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:])
