//! An Iceberg schema as the Arrow schema DataFusion plans with: the types the spec maps to
//! Arrow, each field carrying its Iceberg field id as Parquet writers record it
//! (`PARQUET:field_id`), which is how a file's columns are matched to the table's.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, SchemaRef, TimeUnit};
use datafusion::error::{DataFusionError, Result};
use iceberg::spec::{NestedFieldRef, PrimitiveType, Type};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

/// The Arrow schema of `schema`, for the table `table` (named in errors).
pub(crate) fn arrow_schema(schema: &iceberg::spec::Schema, table: &str) -> Result<SchemaRef> {
    let fields = schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| arrow_field(f, table))
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

/// The Iceberg field id an Arrow field carries, if any.
pub(crate) fn field_id(field: &Field) -> Option<i32> {
    field
        .metadata()
        .get(PARQUET_FIELD_ID_META_KEY)?
        .parse()
        .ok()
}

/// The position among `fields` of the one of Iceberg field id `id`.
pub(crate) fn position_of_id(fields: &Fields, id: i32) -> Option<usize> {
    fields.iter().position(|f| field_id(f) == Some(id))
}

fn arrow_field(field: &NestedFieldRef, table: &str) -> Result<FieldRef> {
    let data_type = arrow_type(&field.field_type, table)?;
    let metadata = HashMap::from([(PARQUET_FIELD_ID_META_KEY.to_string(), field.id.to_string())]);
    Ok(Arc::new(
        Field::new(&field.name, data_type, !field.required).with_metadata(metadata),
    ))
}

fn arrow_type(ty: &Type, table: &str) -> Result<DataType> {
    Ok(match ty {
        Type::Primitive(p) => match p {
            PrimitiveType::Boolean => DataType::Boolean,
            PrimitiveType::Int => DataType::Int32,
            PrimitiveType::Long => DataType::Int64,
            PrimitiveType::Float => DataType::Float32,
            PrimitiveType::Double => DataType::Float64,
            PrimitiveType::Decimal { precision, scale } => {
                let (Ok(precision), Ok(scale)) = ((*precision).try_into(), (*scale).try_into())
                else {
                    return Err(unsupported(table, &format!("{ty}")));
                };
                DataType::Decimal128(precision, scale)
            }
            PrimitiveType::Date => DataType::Date32,
            PrimitiveType::Time => DataType::Time64(TimeUnit::Microsecond),
            PrimitiveType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            PrimitiveType::Timestamptz => {
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
            }
            PrimitiveType::TimestampNs => DataType::Timestamp(TimeUnit::Nanosecond, None),
            PrimitiveType::TimestamptzNs => {
                DataType::Timestamp(TimeUnit::Nanosecond, Some("+00:00".into()))
            }
            PrimitiveType::String => DataType::Utf8,
            PrimitiveType::Uuid => DataType::FixedSizeBinary(16),
            PrimitiveType::Fixed(n) => match i32::try_from(*n) {
                Ok(n) => DataType::FixedSizeBinary(n),
                Err(_) => return Err(unsupported(table, &format!("{ty}"))),
            },
            PrimitiveType::Binary => DataType::Binary,
        },
        Type::Struct(s) => DataType::Struct(Fields::from(
            s.fields()
                .iter()
                .map(|f| arrow_field(f, table))
                .collect::<Result<Vec<_>>>()?,
        )),
        Type::List(list) => DataType::List(arrow_field(&list.element_field, table)?),
        Type::Map(map) => {
            let key = arrow_field(&map.key_field, table)?;
            let value = arrow_field(&map.value_field, table)?;
            let entries = Field::new(
                "key_value",
                DataType::Struct(Fields::from(vec![
                    Arc::new(key.as_ref().clone().with_name("key")),
                    Arc::new(value.as_ref().clone().with_name("value")),
                ])),
                false,
            );
            DataType::Map(Arc::new(entries), false)
        }
    })
}

fn unsupported(table: &str, what: &str) -> DataFusionError {
    DataFusionError::NotImplemented(format!(
        "Iceberg table {table}: the type {what} is not supported by the iceberg feature yet"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{ListType, NestedField, StructType};

    #[test]
    fn fields_keep_their_ids_and_types_map_as_the_spec_says() {
        let schema = iceberg::spec::Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(
                    2,
                    "price",
                    Type::Primitive(PrimitiveType::Decimal {
                        precision: 10,
                        scale: 2,
                    }),
                )
                .into(),
                NestedField::optional(3, "at", Type::Primitive(PrimitiveType::Timestamptz)).into(),
                NestedField::optional(
                    4,
                    "tags",
                    Type::List(ListType::new(
                        NestedField::list_element(5, Type::Primitive(PrimitiveType::String), false)
                            .into(),
                    )),
                )
                .into(),
                NestedField::optional(
                    6,
                    "point",
                    Type::Struct(StructType::new(vec![
                        NestedField::required(7, "x", Type::Primitive(PrimitiveType::Double))
                            .into(),
                    ])),
                )
                .into(),
            ])
            .build()
            .unwrap();
        let arrow = arrow_schema(&schema, "t").unwrap();
        assert_eq!(arrow.field(0).data_type(), &DataType::Int64);
        assert!(!arrow.field(0).is_nullable());
        assert_eq!(field_id(arrow.field(0)), Some(1));
        assert_eq!(arrow.field(1).data_type(), &DataType::Decimal128(10, 2));
        assert_eq!(
            arrow.field(2).data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
        );
        let DataType::List(element) = arrow.field(3).data_type() else {
            panic!("a list: {:?}", arrow.field(3));
        };
        assert_eq!(field_id(element), Some(5));
        let DataType::Struct(inner) = arrow.field(4).data_type() else {
            panic!("a struct: {:?}", arrow.field(4));
        };
        assert_eq!(field_id(&inner[0]), Some(7));
    }
}
