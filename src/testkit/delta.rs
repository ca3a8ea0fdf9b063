//! Delta Lake fixtures (`testkit` with `delta`): the log store delta-rs needs for `s3://`
//! tables, which deltalake-aws brings in a product. The tests' S3 server and the benches'
//! simulated store take put-if-absent commits, so delta-rs's default log store serves.

use std::sync::{Arc, Once};

use deltalake_core::DeltaResult;
use deltalake_core::logstore::{
    LogStore, LogStoreFactory, ObjectStoreRef, StorageConfig, default_logstore, logstore_factories,
};
use url::Url;

struct DefaultLogStores;

impl LogStoreFactory for DefaultLogStores {
    fn with_options(
        &self,
        prefixed_store: ObjectStoreRef,
        root_store: ObjectStoreRef,
        location: &Url,
        options: &StorageConfig,
    ) -> DeltaResult<Arc<dyn LogStore>> {
        Ok(default_logstore(
            prefixed_store,
            root_store,
            location,
            options,
        ))
    }
}

/// Registers delta-rs's default log store for `s3://` URLs, once per process, unless one is
/// registered already.
pub fn register_s3_log_store() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let s3 = Url::parse("s3://").expect("static URL");
        if !logstore_factories().contains_key(&s3) {
            logstore_factories().insert(s3, Arc::new(DefaultLogStores));
        }
    });
}
