//! [`AwaitingPlan`]: the readers an installed session's tables gave their scans, until the
//! session's query planner finds them in the final plan and gives each its prefetcher.
//!
//! A prefetcher needs the final plan (the predicate and projection pushed into the scan, the
//! file groups after repartitioning), but giving a scan its reader only then means rebuilding
//! the scan, and with it every node above it: DataFusion recomputes a node's properties when
//! a child is new. On a warm lake of a few files that rebuild was most of what the installed
//! session's planning cost over vanilla DataFusion's. So the table gives each scan its reader
//! as it plans it (the scan alone is built again, before anything is above it), and the
//! final plan only binds the reader's prefetcher: the plan is left as it is.
//!
//! Reader factories are not `Any`, so the query planner tells one of these from any other
//! by its address: an entry holds the factory weakly, which keeps its allocation (and so its
//! address) from being reused while the entry exists. A factory is taken once: a second scan
//! of the final plan with the same reader gets a new one of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use datafusion::datasource::physical_plan::ParquetFileReaderFactory;

use super::LakeReaderFactory;

/// Dead entries (plans dropped before their final pass) are swept once the entries are the
/// larger of this many and twice as many as were alive at the last sweep.
const SWEEP_FROM: usize = 64;

/// See the module docs. Cheap to clone; clones share the entries.
#[derive(Debug, Clone, Default)]
pub(crate) struct AwaitingPlan(Arc<Mutex<Entries>>);

#[derive(Debug, Default)]
struct Entries {
    by_address: HashMap<usize, Weak<LakeReaderFactory>>,
    alive_at_sweep: usize,
}

impl AwaitingPlan {
    /// Records `factory` as given to a scan whose final plan is still to come.
    pub(crate) fn add(&self, factory: &Arc<LakeReaderFactory>) {
        let mut entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if entries.by_address.len() >= SWEEP_FROM.max(2 * entries.alive_at_sweep) {
            entries.by_address.retain(|_, f| f.strong_count() > 0);
            entries.alive_at_sweep = entries.by_address.len();
        }
        entries
            .by_address
            .insert(address(factory), Arc::downgrade(factory));
    }

    /// The factory `current` is, if it was added and not taken yet; taking it ends its entry.
    pub(crate) fn take(
        &self,
        current: &Arc<dyn ParquetFileReaderFactory>,
    ) -> Option<Arc<LakeReaderFactory>> {
        let mut entries = self.0.lock().unwrap_or_else(|e| e.into_inner());
        entries.by_address.remove(&address(current))?.upgrade()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap().by_address.len()
    }
}

/// Where `arc`'s value lives, whatever the pointer's type.
pub(crate) fn address<T: ?Sized>(arc: &Arc<T>) -> usize {
    Arc::as_ptr(arc).cast::<()>() as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LakeCache;
    use crate::store::StoreReads;
    use crate::table::ScanCaches;
    use object_store::memory::InMemory;

    fn factory(lake: &LakeCache) -> Arc<LakeReaderFactory> {
        let scans: &ScanCaches = lake.as_ref();
        let store = Arc::new(InMemory::new());
        let url = url::Url::parse("memory://").unwrap();
        let reads = StoreReads::foreign(store, crate::object::StoreKey::of(&url), &scans.caches);
        Arc::new(LakeReaderFactory::new(
            reads,
            scans.caches.index.clone(),
            None,
            None,
        ))
    }

    #[test]
    fn a_factory_is_found_once_and_no_other_is() {
        let lake = LakeCache::builder().build().unwrap();
        let awaiting = AwaitingPlan::default();
        let (given, other) = (factory(&lake), factory(&lake));
        awaiting.add(&given);
        let as_dyn: Arc<dyn ParquetFileReaderFactory> = given.clone();
        let other: Arc<dyn ParquetFileReaderFactory> = other;
        assert!(awaiting.take(&other).is_none());
        let found = awaiting.take(&as_dyn).expect("the factory added");
        assert!(Arc::ptr_eq(&found, &given));
        assert!(awaiting.take(&as_dyn).is_none(), "taken once");
    }

    #[test]
    fn entries_of_dropped_factories_are_swept() {
        let lake = LakeCache::builder().build().unwrap();
        let awaiting = AwaitingPlan::default();
        let kept = factory(&lake);
        awaiting.add(&kept);
        for _ in 0..10 * SWEEP_FROM {
            awaiting.add(&factory(&lake));
        }
        assert!(awaiting.len() <= SWEEP_FROM, "{} entries", awaiting.len());
        let kept_dyn: Arc<dyn ParquetFileReaderFactory> = kept.clone();
        assert!(
            awaiting.take(&kept_dyn).is_some(),
            "a live factory is never swept"
        );
    }
}
