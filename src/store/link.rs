//! What each store's link has shown: the bandwidth a scan measured once its downloads filled
//! the link, and the store's typical wait for a response. Their product, the bandwidth-delay
//! product, is how many bytes must be in flight to keep the link full; a new scan of the
//! store starts from it instead of probing up from a few downloads again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::object::StoreKey;

/// Stores whose links are remembered; past this many, the figures start over (they are only
/// a starting point).
const MAX_STORES: usize = 1024;

/// A store's link as a scan measured it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Link {
    /// Bytes per second the scan's downloads got once more of them no longer added any.
    pub bandwidth: f64,
    /// The typical wait for a response.
    pub latency: Duration,
}

impl Link {
    /// Bytes in flight that keep the link full.
    pub fn bdp(&self) -> f64 {
        self.bandwidth * self.latency.as_secs_f64()
    }
}

/// The last measured link of every store of a `LakeCache`, by namespace. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct Links(Arc<Mutex<HashMap<StoreKey, Link>>>);

impl Links {
    /// The last link measured for `store`.
    pub fn get(&self, store: &StoreKey) -> Option<Link> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(store)
            .copied()
    }

    /// Remembers `link` as `store`'s.
    pub fn record(&self, store: &StoreKey, link: Link) {
        self.update(store, link, |_| true);
    }

    /// Remembers `link`, a lower bound of `store`'s, unless more bandwidth is known.
    pub fn raise(&self, store: &StoreKey, link: Link) {
        self.update(store, link, |known| known.bandwidth < link.bandwidth);
    }

    fn update(&self, store: &StoreKey, link: Link, replaces: impl Fn(&Link) -> bool) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_STORES && !map.contains_key(store) {
            map.clear();
        }
        match map.get_mut(store) {
            Some(known) if !replaces(known) => {}
            Some(known) => *known = link,
            None => {
                map.insert(store.clone(), link);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use url::Url;

    #[test]
    fn links_are_kept_per_store_and_bounded() {
        let links = Links::default();
        let key = |i: usize| StoreKey::of(&Url::parse(&format!("s3://bucket-{i}")).unwrap());
        let link = Link {
            bandwidth: 125e6,
            latency: Duration::from_millis(100),
        };
        assert_eq!(link.bdp(), 12.5e6);
        links.record(&key(0), link);
        assert_eq!(links.get(&key(0)), Some(link));
        assert_eq!(links.get(&key(1)), None);
        let slower = Link {
            bandwidth: 1e6,
            ..link
        };
        links.raise(&key(0), slower);
        assert_eq!(
            links.get(&key(0)),
            Some(link),
            "a lower bound below the known is dropped"
        );
        links.record(&key(0), slower);
        assert_eq!(
            links.get(&key(0)),
            Some(slower),
            "a full link's measure replaces it"
        );
        links.raise(&key(0), link);
        assert_eq!(
            links.get(&key(0)),
            Some(link),
            "a higher lower bound raises it"
        );
        for i in 1..=MAX_STORES {
            links.record(&key(i), link);
        }
        assert!(links.0.lock().unwrap().len() <= MAX_STORES);
        assert_eq!(links.get(&key(MAX_STORES)), Some(link));
    }
}
