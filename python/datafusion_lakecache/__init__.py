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

from ._lakecache import DATAFUSION_PYTHON, DATAFUSION_VERSION, LakeCache, Table

__all__ = ["LakeCache", "Table", "DATAFUSION_VERSION", "DATAFUSION_PYTHON"]


def _release(version: str) -> str:
    return ".".join(version.split(".")[:2])


# A table crosses into datafusion-python as datafusion-ffi's FFI_TableProvider, whose own
# check compares major versions only, when a table is registered; its layout is known to
# match only the release built with the same datafusion-ffi. The release is compared here,
# at import, with an error that says what to install.
if _release(_datafusion.__version__) != DATAFUSION_PYTHON:
    raise ImportError(
        f"datafusion_lakecache is built with DataFusion {DATAFUSION_VERSION} (datafusion-ffi "
        f"{DATAFUSION_VERSION}) and works with the datafusion package {DATAFUSION_PYTHON}.x; "
        f"the installed datafusion is {_datafusion.__version__} "
        f"(pip install 'datafusion=={DATAFUSION_PYTHON}.*')"
    )
