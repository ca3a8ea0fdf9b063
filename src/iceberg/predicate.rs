//! A query's filters as the iceberg crate's planning predicate, so that manifests, partitions
//! (through their transforms) and data files are pruned by the library before DataFusion
//! sees a file. Planning only skips what cannot match: DataFusion still evaluates every
//! filter (row groups, pages, rows), so a filter converted in part, or not at all, costs
//! pruning, never rows. Only comparisons whose literal has exactly the column's type are
//! converted; a cast or a function of a column is left to DataFusion.

use arrow::datatypes::Schema as ArrowSchema;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::{Datum, PrimitiveType, Schema, Type};

use super::schema::field_id;

/// The conjunction of what can be converted of `filters`, whose columns are those of
/// `table` (the Arrow schema the table was registered with, its fields carrying their
/// Iceberg ids), as a predicate on the columns of `snapshot` (the schema of the snapshot
/// planned, which names a renamed column by its name of then); `None` when nothing can be
/// converted.
pub(crate) fn planning_predicate(
    filters: &[Expr],
    table: &ArrowSchema,
    snapshot: &Schema,
) -> Option<Predicate> {
    let schemas = Schemas { table, snapshot };
    filters
        .iter()
        .filter_map(|f| convert(f, &schemas, false))
        .reduce(Predicate::and)
}

/// The schema a filter's columns are named in, and the one the predicate is bound to.
struct Schemas<'a> {
    table: &'a ArrowSchema,
    snapshot: &'a Schema,
}

/// `expr` as a predicate. With `exact`, all of it or nothing (under NOT and OR, dropping a
/// conjunct would no longer select a superset); without, an AND keeps the sides it can.
fn convert(expr: &Expr, schema: &Schemas<'_>, exact: bool) -> Option<Predicate> {
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::And => {
                let l = convert(left, schema, exact);
                let r = convert(right, schema, exact);
                match (l, r) {
                    (Some(l), Some(r)) => Some(l.and(r)),
                    (Some(one), None) | (None, Some(one)) if !exact => Some(one),
                    _ => None,
                }
            }
            Operator::Or => Some(convert(left, schema, true)?.or(convert(right, schema, true)?)),
            _ => comparison(left, *op, right, schema)
                .or_else(|| comparison(right, flip(*op)?, left, schema)),
        },
        Expr::Not(inner) => Some(convert(inner, schema, true)?.negate()),
        Expr::IsNull(inner) => Some(reference(inner, schema)?.0.is_null()),
        Expr::IsNotNull(inner) => Some(reference(inner, schema)?.0.is_not_null()),
        Expr::InList(list) => {
            let (column, ty) = reference(&list.expr, schema)?;
            let values = list
                .list
                .iter()
                .map(|v| match v {
                    Expr::Literal(value, _) => datum(value, &ty),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?;
            Some(match list.negated {
                false => column.is_in(values),
                true => column.is_not_in(values),
            })
        }
        _ => None,
    }
}

/// `column op literal`, if `left` is a column of a primitive type and `right` a literal of it.
fn comparison(left: &Expr, op: Operator, right: &Expr, schema: &Schemas<'_>) -> Option<Predicate> {
    let (column, ty) = reference(left, schema)?;
    let Expr::Literal(value, _) = right else {
        return None;
    };
    let value = datum(value, &ty)?;
    Some(match op {
        Operator::Eq => column.equal_to(value),
        Operator::NotEq => column.not_equal_to(value),
        Operator::Lt => column.less_than(value),
        Operator::LtEq => column.less_than_or_equal_to(value),
        Operator::Gt => column.greater_than(value),
        Operator::GtEq => column.greater_than_or_equal_to(value),
        _ => return None,
    })
}

/// `a op b` as `b flipped(op) a`.
fn flip(op: Operator) -> Option<Operator> {
    Some(match op {
        Operator::Eq | Operator::NotEq => op,
        Operator::Lt => Operator::Gt,
        Operator::LtEq => Operator::GtEq,
        Operator::Gt => Operator::Lt,
        Operator::GtEq => Operator::LtEq,
        _ => return None,
    })
}

/// A top-level column of a primitive type, and that type.
fn reference(expr: &Expr, schema: &Schemas<'_>) -> Option<(Reference, PrimitiveType)> {
    let Expr::Column(column) = expr else {
        return None;
    };
    let field = schema.table.field_with_name(&column.name).ok()?;
    let then = schema.snapshot.field_by_id(field_id(field)?)?;
    let Type::Primitive(ty) = then.field_type.as_ref() else {
        return None;
    };
    // The literal has the column's type now; `datum` converts it only if that is the type
    // the snapshot had (a promoted column is pruned by DataFusion alone).
    Some((Reference::new(&then.name), ty.clone()))
}

/// `value` as a datum of `ty`, if it has exactly that type (NULL is never converted).
fn datum(value: &ScalarValue, ty: &PrimitiveType) -> Option<Datum> {
    Some(match (ty, value) {
        (PrimitiveType::Boolean, ScalarValue::Boolean(Some(v))) => Datum::bool(*v),
        (PrimitiveType::Int, ScalarValue::Int32(Some(v))) => Datum::int(*v),
        (PrimitiveType::Long, ScalarValue::Int64(Some(v))) => Datum::long(*v),
        (PrimitiveType::Float, ScalarValue::Float32(Some(v))) => Datum::float(*v),
        (PrimitiveType::Double, ScalarValue::Float64(Some(v))) => Datum::double(*v),
        (
            PrimitiveType::String,
            ScalarValue::Utf8(Some(v))
            | ScalarValue::Utf8View(Some(v))
            | ScalarValue::LargeUtf8(Some(v)),
        ) => Datum::string(v),
        (PrimitiveType::Date, ScalarValue::Date32(Some(v))) => Datum::date(*v),
        (PrimitiveType::Timestamp, ScalarValue::TimestampMicrosecond(Some(v), None)) => {
            Datum::timestamp_micros(*v)
        }
        (PrimitiveType::Timestamptz, ScalarValue::TimestampMicrosecond(Some(v), Some(_))) => {
            Datum::timestamptz_micros(*v)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iceberg::schema::arrow_schema;
    use datafusion::prelude::{col, lit};
    use iceberg::spec::NestedField;

    fn schema() -> Schema {
        Schema::builder()
            .with_fields(vec![
                NestedField::optional(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(2, "city", Type::Primitive(PrimitiveType::String)).into(),
            ])
            .build()
            .unwrap()
    }

    #[test]
    fn what_converts_is_kept_and_what_does_not_costs_pruning_only() {
        let s = schema();
        let planning_predicate =
            |f: &[Expr], s: &Schema| planning_predicate(f, &arrow_schema(s, "t").unwrap(), s);
        let p = planning_predicate(&[col("id").gt(lit(5i64)), col("city").eq(lit("Oslo"))], &s)
            .unwrap();
        assert_eq!(p.to_string(), "(id > 5) AND (city = \"Oslo\")");
        // An Int32 literal against a long column is not the column's type: left to DataFusion.
        assert!(planning_predicate(&[col("id").gt(lit(5i32))], &s).is_none());
        // One side of an AND is kept; under NOT or OR, all or nothing.
        let half = col("id").lt(lit(3i64)).and(col("id").eq(col("city")));
        assert_eq!(
            planning_predicate(std::slice::from_ref(&half), &s)
                .unwrap()
                .to_string(),
            "id < 3"
        );
        assert!(planning_predicate(&[Expr::Not(Box::new(half.clone()))], &s).is_none());
        assert!(planning_predicate(&[half.or(col("city").is_null())], &s).is_none());
        let flipped = planning_predicate(&[lit(7i64).lt_eq(col("id"))], &s).unwrap();
        assert_eq!(flipped.to_string(), "id >= 7");
    }

    #[test]
    fn a_renamed_column_is_named_as_the_snapshot_named_it() {
        let then = schema();
        let now = Schema::builder()
            .with_fields(vec![
                NestedField::optional(1, "key", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(3, "city", Type::Primitive(PrimitiveType::String)).into(),
            ])
            .build()
            .unwrap();
        let now = arrow_schema(&now, "t").unwrap();
        let p = planning_predicate(&[col("key").eq(lit(1i64))], &now, &then).unwrap();
        assert_eq!(p.to_string(), "id = 1");
        // `city` now is another column than the snapshot's `city`: not in that snapshot.
        assert!(planning_predicate(&[col("city").eq(lit("Oslo"))], &now, &then).is_none());
    }
}
