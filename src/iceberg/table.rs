//! [`IcebergTable`]: an Iceberg table as a DataFusion `TableProvider`, and its builder.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::{DFSchema, Statistics};
use datafusion::datasource::TableType;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
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
use iceberg::spec::{DataContentType, DataFileFormat, SnapshotRef, TableMetadata};
use iceberg::table::StaticTable;
use object_store::ObjectStore;
use object_store::path::Path;
use url::Url;

use super::exec::IcebergScanExec;
use super::field_ids::FieldIdAdapterFactory;
use super::locate::{is_metadata_file, newest_metadata};
use super::predicate::planning_predicate;
use super::schema::arrow_schema;
use super::storage::StoreStorage;

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
            .path_of(self.url.as_str())
            .map_err(|e| iceberg_error(&name, e))?;
        let (dir, metadata) = match is_metadata_file(self.url.path()) {
            true => (None, location),
            false => {
                let newest = newest_metadata(self.store.as_ref(), &location, &name).await?;
                (Some(location), newest)
            }
        };
        let store_url = ObjectStoreUrl::parse(self.root.as_str())?;
        let mut table = IcebergTable {
            name,
            root: self.root,
            store_url,
            storage,
            dir,
            choice: self.snapshot,
            iceberg_schema: Arc::new(empty_schema()?),
            schema: Arc::new(arrow::datatypes::Schema::empty()),
            loaded: Mutex::new(None),
        };
        let loaded = table.load_metadata(metadata).await?;
        let snapshot = table.snapshot_of(&loaded)?;
        let schema = match (&snapshot, table.choice) {
            // A pinned snapshot is read with its own schema, the newest with the current one.
            (Some(snapshot), SnapshotChoice::Id(_) | SnapshotChoice::AsOf(_)) => snapshot
                .schema(loaded.table.metadata())
                .map_err(|e| iceberg_error(&table.name, e))?,
            _ => loaded.table.metadata().current_schema().clone(),
        };
        table.schema = arrow_schema(&schema, &table.name)?;
        table.iceberg_schema = schema;
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
    storage: StoreStorage,
    /// The table's directory, when opened by it (the newest metadata file is found again),
    /// `None` when opened by a metadata file.
    dir: Option<Path>,
    choice: SnapshotChoice,
    /// The table's columns (those of the snapshot read when one was chosen, else the
    /// current schema), as Iceberg and as Arrow.
    iceberg_schema: iceberg::spec::SchemaRef,
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

    async fn load_metadata(&self, location: Path) -> Result<Arc<Loaded>> {
        let url = self
            .root
            .join(location.as_ref())
            .map_err(|e| DataFusionError::Execution(format!("{}: {e}", self.name)))?;
        let ident = TableIdent::from_strs(["lakecache", self.name.as_str()])
            .map_err(|e| iceberg_error(&self.name, e))?;
        let table = StaticTable::from_metadata_file(url.as_str(), ident, self.storage.file_io())
            .await
            .map_err(|e| iceberg_error(&self.name, e))?;
        Ok(Arc::new(Loaded {
            location,
            table: table.into_table(),
        }))
    }

    /// The metadata to plan with: for the newest snapshot, that of the newest metadata file
    /// (read again only when it changed).
    async fn current(&self) -> Result<Arc<Loaded>> {
        let held = lock(&self.loaded).clone();
        let (Some(dir), SnapshotChoice::Latest) = (&self.dir, self.choice) else {
            if let Some(held) = held {
                return Ok(held);
            }
            return Err(DataFusionError::Internal(format!(
                "{} was not loaded",
                self.name
            )));
        };
        let newest = newest_metadata(self.storage.store().as_ref(), dir, &self.name).await?;
        if let Some(held) = held
            && held.location == newest
        {
            return Ok(held);
        }
        let loaded = self.load_metadata(newest).await?;
        *lock(&self.loaded) = Some(Arc::clone(&loaded));
        Ok(loaded)
    }

    /// The snapshot the table reads in `loaded`; `None` for a table with no snapshot yet.
    fn snapshot_of(&self, loaded: &Loaded) -> Result<Option<SnapshotRef>> {
        let metadata = loaded.table.metadata();
        match self.choice {
            SnapshotChoice::Latest => Ok(metadata.current_snapshot().cloned()),
            SnapshotChoice::Id(id) => {
                metadata
                    .snapshot_by_id(id)
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| {
                        DataFusionError::Plan(format!(
                            "Iceberg table {} has no snapshot {id}",
                            self.name
                        ))
                    })
            }
            SnapshotChoice::AsOf(millis) => {
                let id = metadata
                    .history()
                    .iter()
                    .filter(|log| log.timestamp_ms <= millis)
                    .max_by_key(|log| log.timestamp_ms)
                    .map(|log| log.snapshot_id)
                    .ok_or_else(|| {
                        DataFusionError::Plan(format!(
                            "Iceberg table {} has no snapshot at or before {millis} ms",
                            self.name
                        ))
                    })?;
                metadata
                    .snapshot_by_id(id)
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| {
                        DataFusionError::Plan(format!(
                            "Iceberg table {}: snapshot {id} of its history has expired",
                            self.name
                        ))
                    })
            }
        }
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
        if let Some(predicate) = planning_predicate(filters, &self.iceberg_schema, &snapshot_schema)
        {
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

    /// Refuses what the scan cannot read right yet, naming the table and the file.
    fn check_supported(&self, task: &FileScanTask) -> Result<()> {
        if task.data_file_format != DataFileFormat::Parquet {
            return Err(DataFusionError::NotImplemented(format!(
                "Iceberg table {}: {} is a {:?} file; the iceberg feature reads Parquet data files",
                self.name, task.data_file_path, task.data_file_format
            )));
        }
        if let Some(delete) = task.deletes.first() {
            let kind = match delete.file_type {
                DataContentType::PositionDeletes => "position deletes",
                DataContentType::EqualityDeletes => "equality deletes",
                DataContentType::Data => "deletes",
            };
            return Err(DataFusionError::NotImplemented(format!(
                "Iceberg table {}: {} has {kind} ({}); merge-on-read deletes are not read by the \
                 iceberg feature yet (tables whose deletes rewrite data files are)",
                self.name, task.data_file_path, delete.file_path
            )));
        }
        Ok(())
    }

    /// `task`'s file as DataFusion scans it: its size and row count from the manifest.
    fn partitioned_file(&self, task: &FileScanTask) -> Result<PartitionedFile> {
        let path = self
            .storage
            .path_of(&task.data_file_path)
            .map_err(|e| iceberg_error(&self.name, e))?;
        let mut file = PartitionedFile::new(path.to_string(), task.file_size_in_bytes);
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
        if let (true, Some(rows)) = (whole, task.record_count) {
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
        let loaded = self.current().await?;
        let Some(snapshot) = self.snapshot_of(&loaded)? else {
            let schema = match projection {
                Some(p) => Arc::new(self.schema.project(p)?),
                None => Arc::clone(&self.schema),
            };
            return Ok(Arc::new(EmptyExec::new(schema)));
        };
        let tasks = self.plan(&loaded, &snapshot, filters).await?;
        let files = tasks
            .iter()
            .map(|t| self.partitioned_file(t))
            .collect::<Result<Vec<_>>>()?;
        let count = files.len();
        let groups = balanced(files, state.config().target_partitions());

        let runtime = state.runtime_env();
        if runtime.object_store(&self.store_url).is_err() {
            runtime.register_object_store(&self.root, self.storage.store());
        }
        let mut source = ParquetSource::new(TableSchema::from(Arc::clone(&self.schema)))
            .with_table_parquet_options(state.table_options().parquet.clone());
        if let Some(filter) = conjunction(filters.iter().cloned()) {
            let df_schema = DFSchema::try_from(Arc::clone(&self.schema))?;
            source = source.with_predicate(state.create_physical_expr(filter, &df_schema)?);
        }
        let config = FileScanConfigBuilder::new(self.store_url.clone(), Arc::new(source))
            .with_file_groups(groups)
            .with_projection_indices(projection.cloned())?
            .with_limit(limit)
            .with_expr_adapter(Some(Arc::new(FieldIdAdapterFactory)))
            .build();
        let scan = DataSourceExec::from_data_source(config);
        Ok(Arc::new(IcebergScanExec::new(
            self.name.clone(),
            snapshot.snapshot_id(),
            count,
            scan,
        )))
    }

    fn get_table_definition(&self) -> Option<&str> {
        None
    }

    fn get_logical_plan(&self) -> Option<Cow<'_, datafusion::logical_expr::LogicalPlan>> {
        None
    }
}

/// `files` in at most `n` groups of about equal bytes (largest first, each to the lightest).
fn balanced(mut files: Vec<PartitionedFile>, n: usize) -> Vec<FileGroup> {
    let n = n.max(1).min(files.len().max(1));
    files.sort_by_key(|f| std::cmp::Reverse(f.object_meta.size));
    let mut groups: Vec<(u64, Vec<PartitionedFile>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for file in files {
        if let Some(lightest) = groups.iter_mut().min_by_key(|(bytes, _)| *bytes) {
            lightest.0 += file.object_meta.size;
            lightest.1.push(file);
        }
    }
    groups
        .into_iter()
        .filter(|(_, files)| !files.is_empty())
        .map(|(_, files)| FileGroup::new(files))
        .collect()
}

fn empty_schema() -> Result<iceberg::spec::Schema> {
    iceberg::spec::Schema::builder()
        .build()
        .map_err(|e| DataFusionError::Internal(e.to_string()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An error of the iceberg crate, naming the table.
pub(crate) fn iceberg_error(table: &str, e: iceberg::Error) -> DataFusionError {
    DataFusionError::External(format!("Iceberg table {table}: {e}").into())
}
