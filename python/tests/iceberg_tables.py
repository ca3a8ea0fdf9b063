"""Iceberg tables pyiceberg writes, for the tests and the benchmark: a SQL catalog (SQLite)
over a warehouse on the local disk or on the S3 server, and two tables whose snapshots cover
what a reader must get right: appends, a copy-on-write delete and overwrites, a schema
changed by rename, add, drop and type promotion, partitions by identity, day and bucket,
and list and struct columns."""

import datetime

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import EqualTo, LessThan
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform
from pyiceberg.types import (
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from s3_server import KEY


def catalog(directory, warehouse, endpoint=None):
    """A SQL catalog whose database is in `directory`, over `warehouse` (`file:///...` or
    `s3://bucket/prefix`, then on the S3 server at `endpoint`)."""
    properties = {"uri": f"sqlite:///{directory}/catalog.db", "warehouse": warehouse}
    if endpoint is not None:
        properties.update(
            {
                # s3fs rather than pyarrow's S3 filesystem, which sends every file as a
                # multipart upload the S3 server of the tests refuses; s3fs sends a small
                # file as one PUT.
                "py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO",
                "s3.endpoint": endpoint,
                "s3.access-key-id": KEY,
                "s3.secret-access-key": KEY,
                "s3.region": "us-east-1",
            }
        )
    found = SqlCatalog("tests", **properties)
    found.create_namespace_if_not_exists("db")
    return found


def _evolving_rows(table, first, n):
    """`n` rows from id `first` in the table's current schema (whatever its names)."""
    ids = list(range(first, first + n))
    columns = {}
    for field in table.schema().fields:
        if field.field_id == 1:
            columns[field.name] = pa.array(ids, pa.int64())
        elif field.field_id == 2:
            columns[field.name] = [f"name-{i}" if i % 5 else None for i in ids]
        elif field.field_id == 3:
            columns[field.name] = [i % 17 for i in ids]
        elif field.field_id == 4:
            columns[field.name] = [i / 8 for i in ids]
        elif field.field_id == 5:
            columns[field.name] = [f"gone-{i}" for i in ids]
        else:
            columns[field.name] = [f"note-{i}" if i % 3 else None for i in ids]
    return pa.table(columns, schema=table.schema().as_arrow())


def write_evolving(cat, name):
    """A table of `id long, name string, qty int, score float, dropped string`: two appends;
    then `name` renamed to `label`, `qty` promoted to long, `score` to double, `dropped`
    dropped and `note` added; an append; a copy-on-write delete of ids below 25; a
    `dropped` added again (a new column of an old name); an overwrite of ids 60 to 69."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType()),
        NestedField(3, "qty", IntegerType()),
        NestedField(4, "score", FloatType()),
        NestedField(5, "dropped", StringType()),
    )
    table = cat.create_table(f"db.{name}", schema=schema)
    table.append(_evolving_rows(table, 0, 40))
    table.append(_evolving_rows(table, 40, 30))
    with table.update_schema() as update:
        update.rename_column("name", "label")
        update.update_column("qty", field_type=LongType())
        update.update_column("score", field_type=DoubleType())
        update.delete_column("dropped")
        update.add_column("note", StringType())
    table.append(_evolving_rows(table, 70, 20))
    table.delete(delete_filter=LessThan("id", 25))
    with table.update_schema() as update:
        update.add_column("dropped", StringType())
    table.overwrite(
        _evolving_rows(table, 1000, 5),
        overwrite_filter=EqualTo("id", 60),
    )
    return table


BASE = datetime.datetime(2026, 11, 1)


def _partitioned_rows(table, first, n):
    ids = list(range(first, first + n))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            # The last value needs escaping in a partition path: its files' keys hold
            # `a+b%2Fc%25`, which a reader must not decode.
            "category": [("alpha", "beta", "gamma", "a b/c%")[i % 4] for i in ids],
            "ts": [BASE + datetime.timedelta(hours=7 * i) for i in ids],
            "at": [
                (BASE + datetime.timedelta(minutes=13 * i)).replace(tzinfo=datetime.timezone.utc)
                for i in ids
            ],
            "amount": [i * 1.5 for i in ids],
            "tags": [[f"t{i % 3}", f"u{i % 5}"] if i % 4 else None for i in ids],
            "point": [{"x": i * 0.5, "y": -float(i)} if i % 6 else None for i in ids],
        },
        schema=table.schema().as_arrow(),
    )


def write_partitioned(cat, name):
    """A table partitioned by identity(category), day(ts) and bucket(4, id), with a list and a
    struct column: two appends, an
    overwrite of the `beta` partition, a delete of the `gamma` partition (metadata only) and
    a copy-on-write delete of amounts below 30."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "category", StringType()),
        NestedField(3, "ts", TimestampType()),
        NestedField(4, "at", TimestamptzType()),
        NestedField(5, "amount", DoubleType()),
        NestedField(6, "tags", ListType(7, StringType(), element_required=True)),
        NestedField(
            8, "point", StructType(NestedField(9, "x", DoubleType()), NestedField(10, "y", DoubleType()))
        ),
    )
    spec = PartitionSpec(
        PartitionField(2, 1000, IdentityTransform(), "category"),
        PartitionField(3, 1001, DayTransform(), "ts_day"),
        PartitionField(1, 1002, BucketTransform(4), "id_bucket"),
    )
    table = cat.create_table(f"db.{name}", schema=schema, partition_spec=spec)
    table.append(_partitioned_rows(table, 0, 60))
    table.append(_partitioned_rows(table, 60, 30))
    table.overwrite(_partitioned_rows(table, 1000, 9), overwrite_filter=EqualTo("category", "beta"))
    table.delete(delete_filter=EqualTo("category", "gamma"))
    table.delete(delete_filter=LessThan("amount", 30.0))
    return table


def canonical(arrow_table):
    """Rows as a sorted list of dicts, as both readers' results are compared."""
    return sorted(arrow_table.to_pylist(), key=repr)
