//! Iceberg tables written by the iceberg crate's own writer and catalog (its in-memory
//! catalog, its Parquet data-file writer, its fast-append and schema transactions) into any
//! object store: tables of a real writer for the tests of the `iceberg` feature that run
//! without Python (the Python tests read tables pyiceberg wrote).

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::arrow::schema_to_arrow_schema;
use iceberg::memory::{MEMORY_CATALOG_WAREHOUSE, MemoryCatalogBuilder};
use iceberg::spec::{DataFileFormat, NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter as _, IcebergWriterBuilder};
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
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
        let schema = self.table.metadata().current_schema().clone();
        let arrow_schema = Arc::new(schema_to_arrow_schema(&schema)?);
        let arrays: Vec<ArrayRef> = columns
            .into_iter()
            .map(|c| match c {
                Values::Int(v) => Arc::new(Int32Array::from(v)) as ArrayRef,
                Values::Long(v) => Arc::new(Int64Array::from(v)) as ArrayRef,
                Values::Double(v) => Arc::new(Float64Array::from(v)) as ArrayRef,
                Values::Str(v) => Arc::new(StringArray::from(v)) as ArrayRef,
            })
            .collect();
        let batch = RecordBatch::try_new(arrow_schema, arrays)
            .map_err(|e| iceberg::Error::new(iceberg::ErrorKind::DataInvalid, e.to_string()))?;
        self.files += 1;
        let parquet = ParquetWriterBuilder::new(WriterProperties::builder().build(), schema);
        let rolling = RollingFileWriterBuilder::new_with_default_file_size(
            parquet,
            self.table.file_io().clone(),
            DefaultLocationGenerator::new(self.table.metadata())?,
            DefaultFileNameGenerator::new(
                format!("part-{}", self.files),
                None,
                DataFileFormat::Parquet,
            ),
        );
        let mut writer = DataFileWriterBuilder::new(rolling).build(None).await?;
        writer.write(batch).await?;
        let files = writer.close().await?;
        let tx = Transaction::new(&self.table);
        let tx = tx.fast_append().add_data_files(files).apply(tx)?;
        self.table = tx.commit(&self.catalog).await?;
        self.current_snapshot()
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
