//! One [`SchemaDescriptor`] for every footer of one schema.
//!
//! Each decoded footer carries its file's Parquet schema: the type tree, and a descriptor
//! with the path of every column. The files of one table almost always share their schema,
//! and on a table of many small files that copy per footer is a large part of what the index
//! cache holds (a fifth of a two-column footer; more of a wide one). So before a footer is
//! decoded, its schema is decoded alone (`ParquetMetaDataReader::decode_schema`) and looked
//! up here among the schemas footers already hold; an equal one is given to the decoder
//! (`ParquetMetaDataOptions::with_schema`), which then builds the footer on it instead of a
//! copy. Only an equal schema is shared, compared in full, so the footer is the one its
//! bytes describe.
//!
//! Entries are weak: a schema lives as long as a footer holds it. Dead entries are swept
//! once the entries are the larger of [`SWEEP_FROM`] and twice as many as were alive at the
//! last sweep, and a schema inserted takes the place of a dead one of the same hash: the map
//! holds at most about twice the most schemas alive at once.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use parquet::schema::types::SchemaDescriptor;

/// See the module docs.
const SWEEP_FROM: usize = 64;

/// The schemas of the process's footers: schemas are values, and a footer built on a shared
/// one is the footer its bytes describe, so one set serves every cache of the process.
static SCHEMAS: LazyLock<Schemas> = LazyLock::new(Schemas::default);

/// The schema held for footers equal to `schema`, or `schema` itself, now held.
pub(crate) fn shared(schema: SchemaDescriptor) -> Arc<SchemaDescriptor> {
    SCHEMAS.shared(schema)
}

/// A set of schemas, by a hash of their columns; see the module docs.
#[derive(Debug, Default)]
struct Schemas {
    hasher: RandomState,
    entries: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    by_hash: HashMap<u64, Vec<Weak<SchemaDescriptor>>>,
    held: usize,
    alive_at_sweep: usize,
}

impl Schemas {
    fn shared(&self, schema: SchemaDescriptor) -> Arc<SchemaDescriptor> {
        let hash = self.hash(&schema);
        // Compared outside the lock: a wide schema's comparison is long, and loads of
        // footers of other tables take the lock meanwhile.
        let candidates: Vec<Arc<SchemaDescriptor>> = self
            .lock()
            .by_hash
            .get(&hash)
            .map(|same_hash| same_hash.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        if let Some(found) = candidates.into_iter().find(|held| **held == schema) {
            return found;
        }
        // Two loads of a new schema at once may each insert it: each footer is still right,
        // and the second copy goes once its footers do.
        let schema = Arc::new(schema);
        let mut entries = self.lock();
        if entries.held >= SWEEP_FROM.max(2 * entries.alive_at_sweep) {
            entries.sweep();
        }
        let same_hash = entries.by_hash.entry(hash).or_default();
        match same_hash.iter_mut().find(|s| s.strong_count() == 0) {
            Some(dead) => *dead = Arc::downgrade(&schema),
            None => {
                same_hash.push(Arc::downgrade(&schema));
                entries.held += 1;
            }
        }
        schema
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A hash of what tells schemas apart most often (their columns' paths and physical
    /// types); equal schemas hash the same, and a lookup compares in full.
    fn hash(&self, schema: &SchemaDescriptor) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        schema.name().hash(&mut hasher);
        for column in schema.columns() {
            column.path().hash(&mut hasher);
            column.physical_type().hash(&mut hasher);
        }
        hasher.finish()
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.lock().held
    }
}

impl Entries {
    fn sweep(&mut self) {
        self.by_hash.retain(|_, same_hash| {
            same_hash.retain(|s| s.strong_count() > 0);
            !same_hash.is_empty()
        });
        self.held = self.by_hash.values().map(Vec::len).sum();
        self.alive_at_sweep = self.held;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::schema::parser::parse_message_type;

    fn schema(text: &str) -> SchemaDescriptor {
        SchemaDescriptor::new(Arc::new(parse_message_type(text).expect("a schema")))
    }

    const TWO: &str = "message m { required int64 id; required int64 v; }";

    #[test]
    fn equal_schemas_are_one() {
        let schemas = Schemas::default();
        let a = schemas.shared(schema(TWO));
        let b = schemas.shared(schema(TWO));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(schemas.held(), 1);
    }

    #[test]
    fn schemas_that_differ_in_anything_are_not_shared() {
        let schemas = Schemas::default();
        let base = schemas.shared(schema(TWO));
        // Each differs from TWO in one thing only; the first two hash as TWO does.
        for other in [
            "message m { required int64 id; optional int64 v; }",
            "message m { required int64 id (TIMESTAMP(MILLIS,true)); required int64 v; }",
            "message m { required int64 id; required int32 v; }",
            "message m { required int64 id; required int64 w; }",
            "message n { required int64 id; required int64 v; }",
        ] {
            let shared = schemas.shared(schema(other));
            assert!(!Arc::ptr_eq(&base, &shared), "{other}");
            assert_eq!(*shared, schema(other), "{other}");
        }
    }

    #[test]
    fn a_schema_no_footer_holds_is_dropped_and_swept() {
        let schemas = Schemas::default();
        let kept = schemas.shared(schema(TWO));
        for i in 0..10 * SWEEP_FROM {
            drop(schemas.shared(schema(&format!("message m {{ required int64 c{i}; }}"))));
        }
        assert!(schemas.held() <= SWEEP_FROM, "{} held", schemas.held());
        assert!(Arc::ptr_eq(&kept, &schemas.shared(schema(TWO))));
    }
}
