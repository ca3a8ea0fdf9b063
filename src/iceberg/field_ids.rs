//! [`FieldIdAdapterFactory`]: a file's columns matched to the table's by Iceberg field id.
//!
//! DataFusion's Parquet scan matches a file's columns to the table's by name, through a
//! `PhysicalExprAdapter` it makes for each file. An Iceberg table's names change while its
//! ids do not: a renamed column keeps its id, a dropped and re-added one gets a new one, and
//! an old file's column of the name a new column took is another column. So for each file
//! this factory renames the table's top-level columns to the names their ids have in that
//! file (a column the file does not have gets a name no file column has, and reads as null),
//! then lets DataFusion's default adapter do the rest by name: the casts of the promotions
//! the spec allows (int to long, float to double, wider decimals), nulls for what is missing.
//! Pruning, the page index, bloom filters and filter pushdown then work on the file's own
//! columns as for any Parquet table. A file column without an id (a file imported into a
//! table) is matched by name.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr_adapter::{
    DefaultPhysicalExprAdapterFactory, PhysicalExprAdapter, PhysicalExprAdapterFactory,
};

use super::schema::field_id;

/// Matches a file's columns to the table's by field id; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct FieldIdAdapterFactory;

impl PhysicalExprAdapterFactory for FieldIdAdapterFactory {
    fn create(
        &self,
        logical_file_schema: SchemaRef,
        physical_file_schema: SchemaRef,
    ) -> Result<Arc<dyn PhysicalExprAdapter>> {
        let names = names_in_file(&logical_file_schema, &physical_file_schema);
        let renamed = Arc::new(Schema::new_with_metadata(
            logical_file_schema
                .fields()
                .iter()
                .zip(&names)
                .map(|(f, name)| Arc::new(Field::clone(f).with_name(name.clone())))
                .collect::<Vec<_>>(),
            logical_file_schema.metadata().clone(),
        ));
        let inner = DefaultPhysicalExprAdapterFactory.create(renamed, physical_file_schema)?;
        Ok(Arc::new(FieldIdAdapter {
            logical: logical_file_schema,
            names,
            inner,
        }))
    }
}

/// For each table column, the name of the file column with its id: its own name when the
/// file has no ids, a name no file column has when the file lacks it.
fn names_in_file(logical: &Schema, physical: &Schema) -> Vec<String> {
    let by_id: HashMap<i32, &str> = physical
        .fields()
        .iter()
        .filter_map(|f| Some((field_id(f)?, f.name().as_str())))
        .collect();
    logical
        .fields()
        .iter()
        .map(|f| match field_id(f) {
            Some(id) if !by_id.is_empty() => match by_id.get(&id) {
                Some(name) => (*name).to_string(),
                None => format!("\u{0}iceberg field {id} not in this file"),
            },
            _ => f.name().clone(),
        })
        .collect()
}

#[derive(Debug)]
struct FieldIdAdapter {
    logical: SchemaRef,
    names: Vec<String>,
    inner: Arc<dyn PhysicalExprAdapter>,
}

impl PhysicalExprAdapter for FieldIdAdapter {
    fn rewrite(&self, expr: Arc<dyn PhysicalExpr>) -> Result<Arc<dyn PhysicalExpr>> {
        let renamed = expr
            .transform(|e| {
                let Some(column) = e.downcast_ref::<Column>() else {
                    return Ok(Transformed::no(e));
                };
                match self.logical.index_of(column.name()) {
                    Ok(i) if i == column.index() => {
                        Ok(Transformed::yes(
                            Arc::new(Column::new(&self.names[i], i)) as _
                        ))
                    }
                    _ => Ok(Transformed::no(e)),
                }
            })
            .data()?;
        self.inner.rewrite(renamed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::DataType;
    use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

    fn field(name: &str, ty: DataType, id: Option<i32>) -> Field {
        let f = Field::new(name, ty, true);
        match id {
            Some(id) => f.with_metadata(HashMap::from([(
                PARQUET_FIELD_ID_META_KEY.to_string(),
                id.to_string(),
            )])),
            None => f,
        }
    }

    #[test]
    fn a_column_is_read_from_the_file_column_of_its_id_whatever_the_names() {
        // The table renamed `a` (id 1) to `b`, dropped the old `b` (id 2) and re-added `a`
        // (id 3); the file was written before.
        let logical = Arc::new(Schema::new(vec![
            field("b", DataType::Int64, Some(1)),
            field("a", DataType::Int64, Some(3)),
        ]));
        let physical = Arc::new(Schema::new(vec![
            field("a", DataType::Int32, Some(1)),
            field("b", DataType::Int32, Some(2)),
        ]));
        let adapter = FieldIdAdapterFactory
            .create(Arc::clone(&logical), physical)
            .unwrap();
        let b = adapter.rewrite(Arc::new(Column::new("b", 0))).unwrap();
        // Read from the file's `a`, promoted from int to long.
        assert_eq!(b.to_string(), "CAST(a@0 AS Int64)");
        let a = adapter.rewrite(Arc::new(Column::new("a", 1))).unwrap();
        assert_eq!(a.to_string(), "NULL");
    }

    #[test]
    fn a_file_without_ids_is_matched_by_name() {
        let logical = Arc::new(Schema::new(vec![field("x", DataType::Int64, Some(1))]));
        let physical = Arc::new(Schema::new(vec![field("x", DataType::Int64, None)]));
        let adapter = FieldIdAdapterFactory.create(logical, physical).unwrap();
        let x = adapter.rewrite(Arc::new(Column::new("x", 0))).unwrap();
        // The field's id is metadata the file's field lacks: a cast of the same type.
        assert_eq!(x.to_string(), "CAST(x@0 AS Int64)");
    }
}
