//! Iceberg tables written by the iceberg crate's own writer and catalog (its in-memory
//! catalog, its Parquet data-file writer, its fast-append and schema transactions) into any
//! object store: tables of a real writer for the tests of the `iceberg` feature that run
//! without Python (the Python tests read tables pyiceberg wrote).
//!
//! Equality deletes are written by the crate's equality-delete writer; its transaction API
//! commits data files only, so their snapshot is committed from the crate's own parts (its
//! manifest writer, manifest-list writer and table-metadata builder), as its transactions
//! commit theirs: a delete manifest, a manifest list of the parent's manifests and it, a new
//! metadata file that makes the snapshot current.

use std::collections::HashMap;
use std::sync::Arc;

use std::str::FromStr;

use iceberg::arrow::{arrow_schema_to_schema, schema_to_arrow_schema};
use iceberg::memory::{MEMORY_CATALOG_WAREHOUSE, MemoryCatalogBuilder};
use iceberg::spec::{
    DataFile, DataFileFormat, FormatVersion, MAIN_BRANCH, ManifestList, ManifestListWriter,
    ManifestWriterBuilder, NestedField, Operation, PrimitiveType, Schema, Snapshot, Summary, Type,
};
use iceberg::table::Table;
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::base_writer::equality_delete_writer::{
    EqualityDeleteFileWriterBuilder, EqualityDeleteWriterConfig,
};
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter as _, IcebergWriterBuilder};
use iceberg::{
    Catalog, CatalogBuilder, MetadataLocation, NamespaceIdent, TableCreation, TableIdent,
};
use iceberg_arrow_array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use iceberg_parquet::file::properties::WriterProperties;
use object_store::ObjectStore;
use url::Url;

/// One column of rows to append, in the table's current column order.
#[derive(Debug, Clone)]
pub enum Values {
    /// An `int` column.
    Int(Vec<Option<i32>>),
    /// A `long` column.
    Long(Vec<Option<i64>>),
    /// A `double` column.
    Double(Vec<Option<f64>>),
    /// A `string` column.
    Str(Vec<Option<String>>),
}

/// An Iceberg table the iceberg crate writes; see the module docs.
pub struct IcebergWriter {
    catalog: iceberg::memory::MemoryCatalog,
    table: Table,
    files: usize,
}

impl std::fmt::Debug for IcebergWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IcebergWriter")
            .field("table", self.table.identifier())
            .finish()
    }
}

/// The schema of the tests' tables: `id long, city string, value double`.
pub fn cities_schema() -> Schema {
    Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "city", Type::Primitive(PrimitiveType::String)).into(),
            NestedField::optional(3, "value", Type::Primitive(PrimitiveType::Double)).into(),
        ])
        .build()
        .expect("a valid schema")
}

/// `n` rows of [`cities_schema`] from `first`: ids, cities of a seven-city cycle, values.
pub fn cities(first: i64, n: usize) -> Vec<Values> {
    let ids: Vec<i64> = (first..first + n as i64).collect();
    let names = ["Oslo", "Lima", "Pune", "Kyiv", "Nice", "Bonn", "Cork"];
    vec![
        Values::Long(ids.iter().map(|i| Some(*i)).collect()),
        Values::Str(
            ids.iter()
                .map(|i| Some(names[(*i as usize) % names.len()].to_string()))
                .collect(),
        ),
        Values::Double(ids.iter().map(|i| Some(*i as f64 * 0.5)).collect()),
    ]
}

/// The tables of the tests, at `location` (under `root`, the root of `store`): three appends
/// of [`cities`] (ids 0..175); a column `extra` (long) added and an append with it (ids
/// 175..195, `extra` = id * 10); `value` dropped and a last append (ids 195..200). Returns
/// the writer and the snapshot ids, oldest first.
pub async fn evolving_table(
    store: Arc<dyn ObjectStore>,
    root: &Url,
    location: &str,
) -> iceberg::Result<(IcebergWriter, Vec<i64>)> {
    let mut w = IcebergWriter::create(store, root, location, "table", cities_schema()).await?;
    let mut snapshots = Vec::new();
    for (first, n) in [(0, 100), (100, 50), (150, 25)] {
        snapshots.push(w.append(cities(first, n)).await?);
    }
    w.add_column("extra", PrimitiveType::Long).await?;
    let mut columns = cities(175, 20);
    columns.push(Values::Long((175..195).map(|i| Some(i * 10)).collect()));
    snapshots.push(w.append(columns).await?);
    w.drop_column("value").await?;
    let mut columns = cities(195, 5);
    columns.remove(2);
    columns.push(Values::Long((195..200).map(|i| Some(i * 10)).collect()));
    snapshots.push(w.append(columns).await?);
    Ok((w, snapshots))
}

impl IcebergWriter {
    /// Creates the table `db.<name>` at `location` (an URL under `root`, the root of
    /// `store`) with `schema`, unpartitioned, format v2.
    pub async fn create(
        store: Arc<dyn ObjectStore>,
        root: &Url,
        location: &str,
        name: &str,
        schema: Schema,
    ) -> iceberg::Result<Self> {
        let factory = crate::iceberg::storage_factory(root.clone(), store);
        let catalog = MemoryCatalogBuilder::default()
            .with_storage_factory(factory)
            .load(
                "tests",
                HashMap::from([(MEMORY_CATALOG_WAREHOUSE.to_string(), location.to_string())]),
            )
            .await?;
        let namespace = NamespaceIdent::new("db".to_string());
        catalog.create_namespace(&namespace, HashMap::new()).await?;
        let creation = TableCreation::builder()
            .name(name.to_string())
            .location(location.to_string())
            .schema(schema)
            .build();
        let table = catalog.create_table(&namespace, creation).await?;
        Ok(Self {
            catalog,
            table,
            files: 0,
        })
    }

    /// The table as last committed.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Appends one data file of `columns` as a new snapshot; returns its id.
    pub async fn append(&mut self, columns: Vec<Values>) -> iceberg::Result<i64> {
        self.append_files(vec![columns]).await
    }

    /// Appends a data file of each of `files` (columns, as [`IcebergWriter::append`] takes
    /// them) in one new snapshot, one manifest; returns its id.
    pub async fn append_files(&mut self, files: Vec<Vec<Values>>) -> iceberg::Result<i64> {
        let schema = self.table.metadata().current_schema().clone();
        let mut written = Vec::with_capacity(files.len());
        for columns in files {
            let batch = batch(&schema, columns)?;
            let parquet =
                ParquetWriterBuilder::new(WriterProperties::builder().build(), schema.clone());
            let mut writer = DataFileWriterBuilder::new(self.rolling(parquet, "part")?)
                .build(None)
                .await?;
            writer.write(batch).await?;
            written.extend(writer.close().await?);
        }
        let files = written;
        let tx = Transaction::new(&self.table);
        let tx = tx.fast_append().add_data_files(files).apply(tx)?;
        self.table = tx.commit(&self.catalog).await?;
        self.current_snapshot()
    }

    /// Deletes, by equality on the columns `keys`, the rows whose values in them equal one
    /// of `rows`'s (all the table's columns, in its order; the others are not written): one
    /// equality delete file committed as a new snapshot, whose id it returns. It applies to
    /// the rows of every earlier snapshot, and not to rows appended after it.
    pub async fn delete_where_equal(
        &mut self,
        keys: &[&str],
        rows: Vec<Values>,
    ) -> iceberg::Result<i64> {
        let schema = self.table.metadata().current_schema().clone();
        let ids = keys
            .iter()
            .map(|k| {
                schema.field_by_name(k).map(|f| f.id).ok_or_else(|| {
                    iceberg::Error::new(iceberg::ErrorKind::DataInvalid, format!("no column {k}"))
                })
            })
            .collect::<iceberg::Result<Vec<i32>>>()?;
        let config = EqualityDeleteWriterConfig::new(ids, Arc::clone(&schema))?;
        let delete_schema = arrow_schema_to_schema(config.projected_arrow_schema_ref())?;
        let parquet =
            ParquetWriterBuilder::new(WriterProperties::builder().build(), Arc::new(delete_schema));
        let rolling = self.rolling(parquet, "eq-delete")?;
        let mut writer = EqualityDeleteFileWriterBuilder::new(rolling, config)
            .build(None)
            .await?;
        writer.write(batch(&schema, rows)?).await?;
        let files = writer.close().await?;
        self.commit_deletes(files).await
    }

    /// A writer of files named `<prefix>-<n>` in the table's data directory.
    fn rolling<B: iceberg::writer::file_writer::FileWriterBuilder>(
        &mut self,
        inner: B,
        prefix: &str,
    ) -> iceberg::Result<
        RollingFileWriterBuilder<B, DefaultLocationGenerator, DefaultFileNameGenerator>,
    > {
        self.files += 1;
        Ok(RollingFileWriterBuilder::new_with_default_file_size(
            inner,
            self.table.file_io().clone(),
            DefaultLocationGenerator::new(self.table.metadata())?,
            DefaultFileNameGenerator::new(
                format!("{prefix}-{}", self.files),
                None,
                DataFileFormat::Parquet,
            ),
        ))
    }

    /// Commits `deletes` as a new snapshot of the main branch: a delete manifest of them
    /// (sequence number the table's next), the parent's manifests and it in a new manifest
    /// list, and the next metadata file, registered with the catalog.
    async fn commit_deletes(&mut self, deletes: Vec<DataFile>) -> iceberg::Result<i64> {
        let metadata = self.table.metadata();
        let file_io = self.table.file_io();
        let parent = metadata.current_snapshot().ok_or_else(|| {
            iceberg::Error::new(iceberg::ErrorKind::DataInvalid, "deletes of no snapshot")
        })?;
        let id = metadata
            .snapshots()
            .map(|s| s.snapshot_id())
            .max()
            .unwrap_or(0)
            + 1;
        let sequence = metadata.next_sequence_number();
        let dir = format!("{}/metadata", metadata.location());

        let output = file_io.new_output(format!("{dir}/{id}-deletes-m0.avro"))?;
        let mut manifest = ManifestWriterBuilder::new(
            output,
            Some(id),
            metadata.current_schema().clone(),
            metadata.default_partition_spec().as_ref().clone(),
        )
        .build_v2_deletes();
        for file in deletes {
            manifest.add_file(file, sequence)?;
        }
        let manifest = manifest.write_manifest_file().await?;

        let parents = file_io.new_input(parent.manifest_list())?.read().await?;
        let mut manifests = ManifestList::parse_with_version(&parents, FormatVersion::V2)?
            .consume_entries()
            .into_iter()
            .collect::<Vec<_>>();
        manifests.push(manifest);
        let list_path = format!("{dir}/snap-{id}-1.avro");
        let mut list = ManifestListWriter::v2(
            file_io.new_output(&list_path)?.writer().await?,
            id,
            Some(parent.snapshot_id()),
            sequence,
        );
        list.add_manifests(manifests.into_iter())?;
        list.close().await?;

        let snapshot = Snapshot::builder()
            .with_snapshot_id(id)
            .with_parent_snapshot_id(Some(parent.snapshot_id()))
            .with_sequence_number(sequence)
            .with_timestamp_ms(parent.timestamp_ms() + 1)
            .with_manifest_list(list_path)
            .with_summary(Summary {
                operation: Operation::Delete,
                additional_properties: HashMap::new(),
            })
            .with_schema_id(metadata.current_schema_id())
            .build();
        let current = self.table.metadata_location_result()?;
        let next = metadata
            .clone()
            .into_builder(Some(current.to_string()))
            .set_branch_snapshot(snapshot, MAIN_BRANCH)?
            .build()?
            .metadata;
        let location = MetadataLocation::from_str(current)?
            .with_next_version()
            .with_new_metadata(&next);
        next.write_to(file_io, &location).await?;
        let ident = self.table.identifier().clone();
        self.catalog.drop_table(&ident).await?;
        self.table = self
            .catalog
            .register_table(&ident, location.to_string())
            .await?;
        Ok(id)
    }

    /// Adds the optional column `name` of `ty` (a new field id).
    pub async fn add_column(&mut self, name: &str, ty: PrimitiveType) -> iceberg::Result<()> {
        let tx = Transaction::new(&self.table);
        let tx = tx
            .update_schema()
            .add_column(AddColumn::optional(name, Type::Primitive(ty)))
            .apply(tx)?;
        self.table = tx.commit(&self.catalog).await?;
        Ok(())
    }

    /// Drops the column `name`.
    pub async fn drop_column(&mut self, name: &str) -> iceberg::Result<()> {
        let tx = Transaction::new(&self.table);
        let tx = tx.update_schema().delete_column(name).apply(tx)?;
        self.table = tx.commit(&self.catalog).await?;
        Ok(())
    }

    fn current_snapshot(&self) -> iceberg::Result<i64> {
        self.table.metadata().current_snapshot_id().ok_or_else(|| {
            iceberg::Error::new(iceberg::ErrorKind::Unexpected, "no snapshot after a commit")
        })
    }

    /// The table's identifier.
    pub fn ident(&self) -> &TableIdent {
        self.table.identifier()
    }
}

/// `columns` as a batch of `schema`'s arrow schema.
fn batch(schema: &Schema, columns: Vec<Values>) -> iceberg::Result<RecordBatch> {
    let arrow_schema = Arc::new(schema_to_arrow_schema(schema)?);
    let arrays: Vec<ArrayRef> = columns
        .into_iter()
        .map(|c| match c {
            Values::Int(v) => Arc::new(Int32Array::from(v)) as ArrayRef,
            Values::Long(v) => Arc::new(Int64Array::from(v)) as ArrayRef,
            Values::Double(v) => Arc::new(Float64Array::from(v)) as ArrayRef,
            Values::Str(v) => Arc::new(StringArray::from(v)) as ArrayRef,
        })
        .collect();
    RecordBatch::try_new(arrow_schema, arrays)
        .map_err(|e| iceberg::Error::new(iceberg::ErrorKind::DataInvalid, e.to_string()))
}
