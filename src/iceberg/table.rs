//! [`IcebergTable`]: an Iceberg table as a DataFusion `TableProvider`, and its builder.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::datatypes::{DataType, SchemaRef};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::{DFSchema, ScalarValue, Statistics};
use datafusion::datasource::TableType;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use futures::TryStreamExt;
use iceberg::TableIdent;
use iceberg::scan::FileScanTask;
use iceberg::spec::{DataFileFormat, SnapshotRef, TableMetadata};
use iceberg::table::StaticTable;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore};
use url::Url;

use super::deletes::ScanDeletes;
use super::equality::{EqualityDeletes, group_field};
use super::exec::IcebergScanExec;
use super::field_ids::FieldIdAdapterFactory;
use super::locate::{is_metadata_file, newest_metadata};
use super::predicate::planning_predicate;
use super::schema::{arrow_schema, field_id};
use super::storage::StoreStorage;
use crate::table::balanced;

/// Which snapshot a table reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotChoice {
    /// The newest: the current snapshot of the newest metadata file, found again at each
    /// scan (within the handle cache's `list_ttl`).
    Latest,
    /// The snapshot of this id.
    Id(i64),
    /// The snapshot that was current at this time (milliseconds since the epoch): time travel.
    AsOf(i64),
}

/// Builds an [`IcebergTable`]; see [`crate::iceberg::table_builder`].
#[derive(Debug)]
pub struct IcebergTableBuilder {
    url: Url,
    root: Url,
    store: Arc<dyn ObjectStore>,
    snapshot: SnapshotChoice,
}

impl IcebergTableBuilder {
    /// The builder of the table at `url` (its directory, or one of its metadata files), read
    /// through `store`, the store of `root`.
    pub(crate) fn new(url: Url, root: Url, store: Arc<dyn ObjectStore>) -> Self {
        Self {
            url,
            root,
            store,
            snapshot: SnapshotChoice::Latest,
        }
    }

    /// Reads the snapshot of this id.
    pub fn snapshot_id(mut self, id: i64) -> Self {
        self.snapshot = SnapshotChoice::Id(id);
        self
    }

    /// Reads the snapshot that was current at `millis` since the epoch.
    pub fn as_of_timestamp_millis(mut self, millis: i64) -> Self {
        self.snapshot = SnapshotChoice::AsOf(millis);
        self
    }

    /// Reads the snapshot `choice` names.
    pub fn snapshot(mut self, choice: SnapshotChoice) -> Self {
        self.snapshot = choice;
        self
    }

    /// Reads the table's metadata and its schema at the chosen snapshot.
    pub async fn load(self) -> Result<IcebergTable> {
        let name = self.url.as_str().trim_end_matches('/').to_string();
        let storage = StoreStorage::new(self.root.clone(), Arc::clone(&self.store));
        let location = storage
            .path_of_url(&self.url)
            .map_err(|e| iceberg_error(&name, e))?;
        let (dir, metadata) = match is_metadata_file(self.url.path()) {
            true => (None, location),
            false => {
                let newest = newest_metadata(self.store.as_ref(), &location, &name).await?;
                (Some(location), newest)
            }
        };
        let mut table = IcebergTable {
            name,
            store_url: ObjectStoreUrl::parse(self.root.as_str())?,
            root: self.root,
            store: Some(self.store),
            dir,
            metadata: metadata.clone(),
            choice: self.snapshot,
            schema: Arc::new(arrow::datatypes::Schema::empty()),
            loaded: Mutex::new(None),
        };
        let loaded = table.load_metadata(&storage, metadata).await?;
        let snapshot = table.snapshot_of(&loaded)?;
        let schema = match (&snapshot, table.choice) {
            // A pinned snapshot is read with its own schema, the newest with the current one.
            (Some(snapshot), SnapshotChoice::Id(_) | SnapshotChoice::AsOf(_)) => snapshot
                .schema(loaded.table.metadata())
                .map_err(|e| iceberg_error(&table.name, e))?,
            _ => loaded.table.metadata().current_schema().clone(),
        };
        table.schema = arrow_schema(&schema, &table.name)?;
        *lock(&table.loaded) = Some(loaded);
        Ok(table)
    }
}

/// An Iceberg table, planned by the iceberg crate and read by DataFusion's Parquet scan
/// through the caches; see the `iceberg` module.
#[derive(Debug)]
pub struct IcebergTable {
    /// The table's URL, for errors and `EXPLAIN`.
    name: String,
    root: Url,
    store_url: ObjectStoreUrl,
    /// The store it was opened with; `None` for a table decoded in another process, which
    /// reads through the store its session has for `root`.
    store: Option<Arc<dyn ObjectStore>>,
    /// The table's directory, when opened by it (the newest metadata file is found again),
    /// `None` when opened by a metadata file.
    dir: Option<Path>,
    /// The metadata file read when the table was opened: the one a chosen snapshot is read
    /// from.
    metadata: Path,
    choice: SnapshotChoice,
    /// The table's columns: those of the snapshot read when one was chosen, else the
    /// current schema when the table was opened; each field carries its Iceberg id.
    schema: SchemaRef,
    /// The metadata last read, and the file it was read from.
    loaded: Mutex<Option<Arc<Loaded>>>,
}

/// A metadata file, read.
#[derive(Debug)]
struct Loaded {
    location: Path,
    table: iceberg::table::Table,
}

impl IcebergTable {
    /// The table's URL.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The metadata of the table as last read.
    pub fn metadata(&self) -> Option<Arc<TableMetadata>> {
        lock(&self.loaded).as_ref().map(|l| l.table.metadata_ref())
    }

    /// What another process needs to open this table as it is here (its schema travels
    /// beside): its URL, its store's root, the metadata file it was read from, its directory
    /// and the snapshot it reads, one per line.
    pub fn to_parts(&self) -> String {
        let choice = match self.choice {
            SnapshotChoice::Latest => "latest".to_string(),
            SnapshotChoice::Id(id) => format!("id {id}"),
            SnapshotChoice::AsOf(millis) => format!("as-of {millis}"),
        };
        let dir = self.dir.as_ref().map_or("-", |d| d.as_ref());
        [
            self.name.as_str(),
            self.root.as_str(),
            self.metadata.as_ref(),
            dir,
            &choice,
        ]
        .join("\n")
    }

    /// The table [`IcebergTable::to_parts`] described, with `schema`: it reads its metadata
    /// at its first scan, through the store the scanning session has for its root.
    pub fn from_parts(parts: &str, schema: SchemaRef) -> Result<Self> {
        let bad = || DataFusionError::Plan(format!("not an encoded Iceberg table: {parts:?}"));
        let [name, root, metadata, dir, choice] = parts
            .split('\n')
            .collect::<Vec<_>>()
            .try_into()
            .map_err(|_| bad())?;
        let root = Url::parse(root).map_err(|_| bad())?;
        let number = |n: &str| n.parse::<i64>().map_err(|_| bad());
        let choice = match choice.split_once(' ') {
            None if choice == "latest" => SnapshotChoice::Latest,
            Some(("id", id)) => SnapshotChoice::Id(number(id)?),
            Some(("as-of", millis)) => SnapshotChoice::AsOf(number(millis)?),
            _ => return Err(bad()),
        };
        // The paths as `to_parts` wrote them (`Path::from` would encode their `%` again).
        let path = |p: &str| Path::parse(p).map_err(|_| bad());
        Ok(Self {
            name: name.to_string(),
            store_url: ObjectStoreUrl::parse(root.as_str())?,
            root,
            store: None,
            dir: (dir != "-").then(|| path(dir)).transpose()?,
            metadata: path(metadata)?,
            choice,
            schema,
            loaded: Mutex::new(None),
        })
    }

    /// The storage the table reads through in `state`: the store it was opened with, else
    /// the one the session has for its root (registered with it when it has none).
    fn storage(&self, state: &dyn Session) -> Result<StoreStorage> {
        let runtime = state.runtime_env();
        let store = match (&self.store, runtime.object_store(&self.store_url)) {
            (Some(own), Err(_)) => {
                runtime.register_object_store(&self.root, Arc::clone(own));
                Arc::clone(own)
            }
            (Some(own), Ok(_)) => Arc::clone(own),
            (None, found) => found?,
        };
        Ok(StoreStorage::new(self.root.clone(), store))
    }

    async fn load_metadata(&self, storage: &StoreStorage, location: Path) -> Result<Arc<Loaded>> {
        let url = storage.location_of(&location);
        let ident = TableIdent::from_strs(["lakecache", self.name.as_str()])
            .map_err(|e| iceberg_error(&self.name, e))?;
        let table = StaticTable::from_metadata_file(url.as_str(), ident, storage.file_io())
            .await
            .map_err(|e| iceberg_error(&self.name, e))?;
        Ok(Arc::new(Loaded {
            location,
            table: table.into_table(),
        }))
    }

    /// The metadata to plan with: for the newest snapshot, that of the newest metadata file
    /// (read again only when it changed); else the one the table was opened with.
    async fn current(&self, storage: &StoreStorage) -> Result<Arc<Loaded>> {
        let held = lock(&self.loaded).clone();
        let location = match (&self.dir, self.choice) {
            (Some(dir), SnapshotChoice::Latest) => {
                newest_metadata(storage.store().as_ref(), dir, &self.name).await?
            }
            _ => self.metadata.clone(),
        };
        if let Some(held) = held
            && held.location == location
        {
            return Ok(held);
        }
        let loaded = self.load_metadata(storage, location).await?;
        *lock(&self.loaded) = Some(Arc::clone(&loaded));
        Ok(loaded)
    }

    /// The snapshot the table reads in `loaded`; `None` for a table with no snapshot yet.
    fn snapshot_of(&self, loaded: &Loaded) -> Result<Option<SnapshotRef>> {
        let metadata = loaded.table.metadata();
        let missing = |what: String| {
            DataFusionError::Plan(format!("Iceberg table {} has no {what}", self.name))
        };
        let id = match self.choice {
            SnapshotChoice::Latest => return Ok(metadata.current_snapshot().cloned()),
            SnapshotChoice::Id(id) => id,
            // The snapshot log: which snapshot was current from when.
            SnapshotChoice::AsOf(millis) => metadata
                .history()
                .iter()
                .filter(|log| log.timestamp_ms <= millis)
                .max_by_key(|log| log.timestamp_ms)
                .map(|log| log.snapshot_id)
                .ok_or_else(|| missing(format!("snapshot at or before {millis} ms")))?,
        };
        let snapshot = metadata.snapshot_by_id(id).cloned();
        // A snapshot of the log may have expired since.
        snapshot
            .map(Some)
            .ok_or_else(|| missing(format!("snapshot {id}")))
    }

    /// The files of `snapshot` that may hold rows matching `filters`, planned by the library.
    async fn plan(
        &self,
        loaded: &Loaded,
        snapshot: &SnapshotRef,
        filters: &[Expr],
    ) -> Result<Vec<FileScanTask>> {
        let metadata = loaded.table.metadata();
        let snapshot_schema = snapshot
            .schema(metadata)
            .map_err(|e| iceberg_error(&self.name, e))?;
        let mut scan = loaded.table.scan().snapshot_id(snapshot.snapshot_id());
        if let Some(predicate) = planning_predicate(filters, &self.schema, &snapshot_schema) {
            scan = scan.with_filter(predicate);
        }
        let scan = scan.build().map_err(|e| iceberg_error(&self.name, e))?;
        let tasks = scan
            .plan_files()
            .await
            .map_err(|e| iceberg_error(&self.name, e))?;
        let tasks: Vec<FileScanTask> = tasks
            .try_collect()
            .await
            .map_err(|e| iceberg_error(&self.name, e))?;
        for task in &tasks {
            self.check_supported(task)?;
        }
        Ok(tasks)
    }

    /// Refuses to read the newest snapshot as the schema the table was registered with when a
    /// column of it changed type since: its files' values would be cast back to the old
    /// type. (A column renamed, added or dropped since reads right by field id.)
    fn check_schema(&self, loaded: &Loaded) -> Result<()> {
        if self.choice != SnapshotChoice::Latest {
            return Ok(());
        }
        let current = arrow_schema(loaded.table.metadata().current_schema(), &self.name)?;
        let now: HashMap<i32, &DataType> = current
            .fields()
            .iter()
            .filter_map(|f| Some((field_id(f)?, f.data_type())))
            .collect();
        for field in self.schema.fields() {
            let Some(id) = field_id(field) else { continue };
            if let Some(ty) = now.get(&id)
                && *ty != field.data_type()
            {
                return Err(DataFusionError::Plan(format!(
                    "Iceberg table {}: column {} is {ty} now, {} when the table was registered; \
                     register the table again",
                    self.name,
                    field.name(),
                    field.data_type()
                )));
            }
        }
        Ok(())
    }

    /// Refuses what the scan cannot read right yet, naming the table and the file.
    fn check_supported(&self, task: &FileScanTask) -> Result<()> {
        if task.data_file_format != DataFileFormat::Parquet {
            return Err(DataFusionError::NotImplemented(format!(
                "Iceberg table {}: {} is a {:?} file; the iceberg feature reads Parquet data files",
                self.name, task.data_file_path, task.data_file_format
            )));
        }
        Ok(())
    }

    /// `task`'s file as DataFusion scans it: its size and row count from the manifest, the
    /// rows its position deletes leave, and its group of equality deletes when the scan has
    /// any (`Some(None)`: none applies to it).
    fn partitioned_file(
        &self,
        storage: &StoreStorage,
        deletes: &ScanDeletes,
        task: &FileScanTask,
        equality_group: Option<Option<u32>>,
    ) -> Result<PartitionedFile> {
        let path = storage
            .path_of(&task.data_file_path)
            .map_err(|e| iceberg_error(&self.name, e))?;
        // The path as it is (`PartitionedFile::new` would encode a `%` in its name again).
        let mut file = PartitionedFile::new_from_meta(ObjectMeta {
            location: path,
            last_modified: DateTime::<Utc>::UNIX_EPOCH,
            size: task.file_size_in_bytes,
            e_tag: None,
            version: None,
        });
        let whole = task.start == 0 && task.length == task.file_size_in_bytes;
        if !whole {
            let (Ok(start), Ok(end)) = (
                i64::try_from(task.start),
                i64::try_from(task.start.saturating_add(task.length)),
            ) else {
                return Err(DataFusionError::Execution(format!(
                    "Iceberg table {}: {} has a split beyond its size",
                    self.name, task.data_file_path
                )));
            };
            file = file.with_range(start, end);
        }
        if let Some(group) = equality_group {
            file.partition_values = vec![ScalarValue::UInt32(group)];
        }
        if let Some(survivors) = deletes.surviving_rows(task) {
            // The manifest's row count is the file's, not what its deletes leave.
            return Ok(file.with_extension(survivors));
        }
        // Nor when equality deletes drop rows above the scan.
        let rows = task
            .record_count
            .filter(|_| equality_group.flatten().is_none());
        if let (true, Some(rows)) = (whole, rows) {
            let mut statistics = Statistics::new_unknown(&self.schema);
            statistics.num_rows = Precision::Exact(rows as usize);
            file = file.with_statistics(Arc::new(statistics));
        }
        Ok(file)
    }
}

#[async_trait]
impl TableProvider for IcebergTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        // Planning prunes files and the Parquet scan prunes row groups and pages, and with
        // `pushdown_filters` rows; DataFusion keeps its own filter above.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let storage = self.storage(state)?;
        let loaded = self.current(&storage).await?;
        self.check_schema(&loaded)?;
        let Some(snapshot) = self.snapshot_of(&loaded)? else {
            let schema = match projection {
                Some(p) => Arc::new(self.schema.project(p)?),
                None => Arc::clone(&self.schema),
            };
            return Ok(Arc::new(EmptyExec::new(schema)));
        };
        let tasks = self.plan(&loaded, &snapshot, filters).await?;
        let deletes = ScanDeletes::read(&self.name, &storage, &tasks).await?;
        let equality = EqualityDeletes::read(&self.name, &storage, &self.schema, &tasks).await?;
        let files = tasks
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let group = equality.as_ref().map(|e| e.group_of_task(i));
                self.partitioned_file(&storage, &deletes, t, group)
            })
            .collect::<Result<Vec<_>>>()?;
        let count = files.len();
        let groups = balanced(files, state.config().target_partitions());

        // With equality deletes the scan reads their key columns too, and each file's group
        // (a hidden partition column, last), for the filter above it; and no limit.
        let (table_schema, projection, limit, equality) = match equality {
            None => (
                TableSchema::from(Arc::clone(&self.schema)),
                projection.cloned(),
                limit,
                None,
            ),
            Some(equality) => {
                let (read, filter) = equality.scan(projection, self.schema.fields().len());
                let schema = TableSchema::builder(Arc::clone(&self.schema))
                    .with_table_partition_cols(vec![group_field()])
                    .build();
                (schema, Some(read), None, Some(Arc::new(filter)))
            }
        };

        // No reader factory: the query planner of an installed session (a Ballista
        // executor's codec too) gives the scan the caches' reader, versioned by the
        // manifests, and a prefetcher.
        let mut source = ParquetSource::new(table_schema)
            .with_table_parquet_options(state.table_options().parquet.clone());
        if let Some(filter) = conjunction(filters.iter().cloned()) {
            let df_schema = DFSchema::try_from(Arc::clone(&self.schema))?;
            source = source.with_predicate(state.create_physical_expr(filter, &df_schema)?);
        }
        let config = FileScanConfigBuilder::new(self.store_url.clone(), Arc::new(source))
            .with_file_groups(groups)
            .with_projection_indices(projection)?
            .with_limit(limit)
            .with_expr_adapter(Some(Arc::new(FieldIdAdapterFactory)))
            .build();
        let scan = DataSourceExec::from_data_source(config);
        Ok(Arc::new(IcebergScanExec::new(
            self.name.clone(),
            snapshot.snapshot_id(),
            count,
            scan,
            equality,
        )))
    }

    fn get_table_definition(&self) -> Option<&str> {
        None
    }

    fn get_logical_plan(&self) -> Option<Cow<'_, datafusion::logical_expr::LogicalPlan>> {
        None
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An error of the iceberg crate, naming the table.
pub(crate) fn iceberg_error(table: &str, e: iceberg::Error) -> DataFusionError {
    DataFusionError::External(format!("Iceberg table {table}: {e}").into())
}
