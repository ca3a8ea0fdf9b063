"""The lake caches for DataFusion's Python users.

Handle, index and byte caching plus prefetching for scans of Parquet lakes, as tables
datafusion-python registers::

    import datafusion, datafusion_lakecache as lc
    lake = lc.LakeCache(range_memory="1GiB")
    ctx = datafusion.SessionContext()
    ctx.register_table("sales", lake.parquet_table("s3://bucket/sales/", storage_options={...}))
    ctx.sql("SELECT region, sum(amount) FROM sales GROUP BY region").show()
    lake.stats()
"""

import datafusion as _datafusion

from ._lakecache import DATAFUSION_VERSION, LakeCache, Table

__all__ = ["LakeCache", "Table", "DATAFUSION_VERSION"]


def _major(version: str) -> str:
    return version.split(".", 1)[0]


# A table crosses into datafusion-python as datafusion-ffi's FFI_TableProvider, whose own
# check compares major versions only when a table is registered: the versions are compared
# here, at import, with an error that says what to install.
if _major(_datafusion.__version__) != _major(DATAFUSION_VERSION):
    raise ImportError(
        f"datafusion_lakecache is built with DataFusion {DATAFUSION_VERSION} and works with the "
        f"datafusion package {_major(DATAFUSION_VERSION)}.x; the installed datafusion is "
        f"{_datafusion.__version__} (pip install 'datafusion>={_major(DATAFUSION_VERSION)},"
        f"<{int(_major(DATAFUSION_VERSION)) + 1}')"
    )
