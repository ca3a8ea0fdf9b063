//! [`IcebergTableFactory`]: `CREATE EXTERNAL TABLE ... STORED AS ICEBERG LOCATION '...'`.

use std::sync::Arc;

use async_trait::async_trait;
use std::any::Any;
use std::collections::HashMap;

use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::CreateExternalTable;

use super::table::{IcebergTableBuilder, SnapshotChoice};

/// Makes Iceberg tables in SQL, read with the session's stores (an installed session's
/// stores are the caches' wrappers). `install()` registers it for `ICEBERG`, and
/// [`IcebergOptions`] as table options, so that clients that check `OPTIONS` against the
/// session's table options (datafusion-cli, the `lakecache` tool) take them.
///
/// `LOCATION` is the table's directory (its newest snapshot is read, found again within
/// `list_ttl`) or one of its metadata files. `OPTIONS ('iceberg.snapshot_id' '...')` reads
/// one snapshot; `OPTIONS ('iceberg.as_of' '...')` the one current at a time, in
/// milliseconds since the epoch or RFC 3339 (`2026-12-01T10:00:00Z`). Options of other
/// prefixes (`aws.`, `gcp.`, ...) are the stores' and are left to the session.
#[derive(Debug, Default)]
pub struct IcebergTableFactory;

/// The options of an Iceberg table in `CREATE EXTERNAL TABLE ... OPTIONS (...)`, under the
/// prefix `iceberg.` (unprefixed, DataFusion names them `format.`). Written by hand rather
/// than with `extensions_options!`: table options hand an extension its keys with their
/// prefix, config options without.
#[derive(Debug, Clone, Default)]
pub struct IcebergOptions {
    /// The id of the snapshot to read (default: the newest).
    pub snapshot_id: Option<String>,
    /// Reads the snapshot current at this time: milliseconds since the epoch, or RFC 3339.
    pub as_of: Option<String>,
}

impl ConfigExtension for IcebergOptions {
    const PREFIX: &'static str = "iceberg";
}

impl ExtensionOptions for IcebergOptions {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let key = key.strip_prefix("iceberg.").unwrap_or(key);
        let field = match key {
            "snapshot_id" => &mut self.snapshot_id,
            "as_of" => &mut self.as_of,
            _ => {
                return Err(DataFusionError::Configuration(format!(
                    "unknown Iceberg table option {key:?} (options: iceberg.snapshot_id, \
                     iceberg.as_of)"
                )));
            }
        };
        *field = Some(value.to_string());
        Ok(())
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        vec![
            ConfigEntry {
                key: "iceberg.snapshot_id".into(),
                value: self.snapshot_id.clone(),
                description: "The id of the snapshot to read (default: the newest)",
            },
            ConfigEntry {
                key: "iceberg.as_of".into(),
                value: self.as_of.clone(),
                description: "Reads the snapshot current at this time (ms since the epoch, or RFC 3339)",
            },
        ]
    }
}

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
        let choice = choice_of(&cmd.options, name)?;
        let table = IcebergTableBuilder::new(url, root, store)
            .snapshot(choice)
            .load()
            .await?;
        Ok(Arc::new(table))
    }
}

/// The snapshot `options` choose for the table `name`.
fn choice_of(options: &HashMap<String, String>, name: &str) -> Result<SnapshotChoice> {
    let mut parsed = IcebergOptions::default();
    for (key, value) in options {
        let Some(key) = key
            .strip_prefix("iceberg.")
            .or_else(|| key.strip_prefix("format."))
        else {
            continue;
        };
        parsed
            .set(key, value)
            .map_err(|e| DataFusionError::Plan(format!("Iceberg table {name}: {e}")))?;
    }
    Ok(match (parsed.snapshot_id, parsed.as_of) {
        (Some(_), Some(_)) => {
            return Err(DataFusionError::Plan(format!(
                "Iceberg table {name}: give iceberg.snapshot_id or iceberg.as_of, not both"
            )));
        }
        (Some(id), None) => SnapshotChoice::Id(id.trim().parse().map_err(|_| {
            DataFusionError::Plan(format!(
                "Iceberg table {name}: iceberg.snapshot_id is {id:?}, not a snapshot id (an integer)"
            ))
        })?),
        (None, Some(at)) => SnapshotChoice::AsOf(millis_of(&at).ok_or_else(|| {
            DataFusionError::Plan(format!(
                "Iceberg table {name}: iceberg.as_of is {at:?}, not milliseconds since the epoch \
                 or an RFC 3339 time"
            ))
        })?),
        (None, None) => SnapshotChoice::Latest,
    })
}

fn millis_of(value: &str) -> Option<i64> {
    value.trim().parse().ok().or_else(|| {
        chrono::DateTime::parse_from_rfc3339(value.trim())
            .ok()
            .map(|t| t.timestamp_millis())
    })
}
