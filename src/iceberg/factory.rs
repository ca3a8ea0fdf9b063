//! [`IcebergTableFactory`]: `CREATE EXTERNAL TABLE ... STORED AS ICEBERG LOCATION '...'`.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::CreateExternalTable;

use super::table::{IcebergTableBuilder, SnapshotChoice};

/// Makes Iceberg tables in SQL, read with the session's stores (an installed session's
/// stores are the caches' wrappers). `install()` registers it for `ICEBERG`.
///
/// `LOCATION` is the table's directory (its newest snapshot is read, found again within
/// `list_ttl`) or one of its metadata files. `OPTIONS ('snapshot_id' '...')` reads one
/// snapshot; `OPTIONS ('as_of' '...')` the one current at a time, in milliseconds since the
/// epoch or RFC 3339 (`2026-12-01T10:00:00Z`).
#[derive(Debug, Default)]
pub struct IcebergTableFactory;

#[async_trait]
impl TableProviderFactory for IcebergTableFactory {
    async fn create(
        &self,
        state: &dyn Session,
        cmd: &CreateExternalTable,
    ) -> Result<Arc<dyn TableProvider>> {
        let [location] = cmd.locations.as_slice() else {
            return Err(DataFusionError::Plan(format!(
                "an Iceberg table has one location, given {:?}",
                cmd.locations
            )));
        };
        let name = location.as_str();
        let location = ListingTableUrl::parse(location)?;
        let url: url::Url = AsRef::<url::Url>::as_ref(&location).clone();
        let store = state.runtime_env().object_store(&location)?;
        let root = super::root_of(&url)?;
        let mut choice = SnapshotChoice::Latest;
        for (key, value) in &cmd.options {
            let key = key.strip_prefix("format.").unwrap_or(key);
            choice = match key {
                "snapshot_id" | "snapshot-id" => SnapshotChoice::Id(
                    value
                        .parse()
                        .map_err(|_| bad_option(name, key, value, "a snapshot id (an integer)"))?,
                ),
                "as_of" | "as-of" => SnapshotChoice::AsOf(millis_of(value).ok_or_else(|| {
                    bad_option(
                        name,
                        key,
                        value,
                        "milliseconds since the epoch or an RFC 3339 time",
                    )
                })?),
                _ => {
                    return Err(DataFusionError::Plan(format!(
                        "Iceberg table {}: unknown option {key:?} (known: snapshot_id, as_of)",
                        name
                    )));
                }
            };
        }
        let table = IcebergTableBuilder::new(url, root, store)
            .snapshot(choice)
            .load()
            .await?;
        Ok(Arc::new(table))
    }
}

fn millis_of(value: &str) -> Option<i64> {
    value.trim().parse().ok().or_else(|| {
        chrono::DateTime::parse_from_rfc3339(value.trim())
            .ok()
            .map(|t| t.timestamp_millis())
    })
}

fn bad_option(table: &str, key: &str, value: &str, want: &str) -> DataFusionError {
    DataFusionError::Plan(format!(
        "Iceberg table {table}: option {key} is {value:?}, not {want}"
    ))
}
