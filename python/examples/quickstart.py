"""A first look, with no cloud account: a lake of Parquet files in a temporary directory,
queried twice through datafusion-python with a table of `datafusion_lakecache`, then what
the caches did. The second run reads and decodes no footer again, and reads through the file
handles the first one opened (the script fails if it reads a footer). Bytes are kept for
remote stores only: a local file is read in place.

    python3 python/examples/quickstart.py
"""

import sys
import tempfile
import time

import datafusion
import pyarrow as pa
import pyarrow.parquet as pq

import datafusion_lakecache as lc

FILES, ROWS = 40, 10_000
REGIONS = ["north", "south", "east", "west"]
SQL = (
    "SELECT region, count(*) AS n, round(sum(amount), 1) AS amount "
    "FROM sales GROUP BY region ORDER BY region"
)


def write_lake(root):
    for i in range(FILES):
        ids = range(i * ROWS, (i + 1) * ROWS)
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "region": [REGIONS[n % len(REGIONS)] for n in ids],
                "amount": [(n % 997) / 10 for n in ids],
            }
        )
        pq.write_table(table, f"{root}/part-{i:03}.parquet", row_group_size=2_500)


def footers_read(lake):
    """Footers (with their page indexes) read and decoded so far."""
    return lake.stats()["index"]["footer_loads"]


with tempfile.TemporaryDirectory() as root:
    write_lake(root)
    # One LakeCache per process, shared by every session and table made from it.
    lake = lc.LakeCache()
    ctx = datafusion.SessionContext()
    read = []
    for run in ("first run (with the table's registration)", "second run"):
        before, started = footers_read(lake), time.perf_counter()
        if not read:
            ctx.register_table("sales", lake.parquet_table(f"{root}/"))
        result = ctx.sql(SQL).to_arrow_table()
        ms = (time.perf_counter() - started) * 1000
        read.append(footers_read(lake) - before)
        print(f"{run}: {ms:.1f} ms, {read[-1]} footers read")
    for row in result.to_pylist():
        print(row)
    figures = lake.stats()
    for cache in ("handle.files", "index"):
        print(f"{cache}: {figures[cache]['hits']} hits, {figures[cache]['misses']} misses")
    if read[0] == 0 or read[1] != 0:
        sys.exit(f"footers read by the two runs: {read}; the second should read none")
