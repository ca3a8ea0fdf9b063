//! Listings through the handle cache: a repeated listing of a prefix is served from it (to
//! the identity whose store listed it), and a listing streamed from the store is recorded as
//! it goes, so every object it shows is known by its version when a reader asks for it. A
//! listing proves no read access: a store may be allowed to list and not to read.
//!
//! Listings of a table log ([`listing_changes`]) always come from the store, since they show
//! new commits; what they show is still recorded.
//!
//! A listing races with writes: a page fetched before a write through the wrapper but
//! consumed after it shows the old version. Every record therefore carries the cache's
//! invalidation epoch from when the listing began; after an invalidation, the rest of that
//! listing is passed through but recorded nowhere.

use std::future::Future;

use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{ListResult, ObjectMeta, Result};

use super::StoreReads;
use super::reads::naming;
use crate::handle::{ListKey, ListKind, Listing};
use crate::object::listing_changes;

impl StoreReads {
    fn list_key(&self, prefix: Option<&Path>, kind: ListKind) -> ListKey {
        ListKey {
            identity: self.identity().clone(),
            store: self.store_key().clone(),
            prefix: prefix.cloned(),
            kind,
        }
    }

    /// A recursive listing of `prefix` (after `offset`, if given): from the cache, or from
    /// `listing` (called only on a miss) while recording it.
    pub(super) fn list(
        &self,
        prefix: Option<&Path>,
        offset: Option<&Path>,
        listing: impl FnOnce() -> BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let kind = match offset {
            Some(o) => ListKind::After(o.clone()),
            None => ListKind::Recursive,
        };
        let key = self.list_key(prefix, kind);
        let handles = &self.caches().handles;
        let changes = listing_changes(prefix);
        if !changes && let Some(cached) = handles.listing(&key) {
            return stream::iter(cached.objects.clone().into_iter().map(Ok)).boxed();
        }
        let what = format!("listing {}", prefix.map_or("", |p| p.as_ref()));
        let listing = listing().map(move |item| item.map_err(|e| naming(e, &what)));
        self.recording((!changes).then_some(key), listing.boxed())
    }

    /// A delimited listing of `prefix`: from the cache, or from `listing` (called only on a
    /// miss), recorded.
    pub(super) async fn list_with_delimiter<F>(
        &self,
        prefix: Option<&Path>,
        listing: impl FnOnce() -> F,
    ) -> Result<ListResult>
    where
        F: Future<Output = Result<ListResult>>,
    {
        let key = self.list_key(prefix, ListKind::Delimited);
        let handles = &self.caches().handles;
        let changes = listing_changes(prefix);
        if !changes && let Some(cached) = handles.listing(&key) {
            return Ok(cached.to_list_result());
        }
        let epoch = handles.epoch();
        let what = || format!("listing {}", prefix.map_or("", |p| p.as_ref()));
        let result = listing().await.map_err(|e| naming(e, what()))?;
        for meta in &result.objects {
            self.observe_listed(meta, epoch);
        }
        if changes {
            return Ok(result);
        }
        let listing = Listing {
            objects: result.objects.clone(),
            common_prefixes: result.common_prefixes.clone(),
        };
        handles.record_listing(key, listing, epoch);
        Ok(result)
    }

    /// Passes a listing through while recording what it shows; with a `key`, a listing that
    /// completes without error and without an invalidation since it began is cached.
    fn recording(
        &self,
        key: Option<ListKey>,
        listing: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        struct State {
            listing: BoxStream<'static, Result<ObjectMeta>>,
            reads: StoreReads,
            seen: Option<Vec<ObjectMeta>>,
            key: Option<ListKey>,
            epoch: u64,
        }
        let state = State {
            listing,
            reads: self.clone(),
            seen: key.as_ref().map(|_| Vec::new()),
            key,
            epoch: self.caches().handles.epoch(),
        };
        stream::unfold(state, |mut s| async move {
            let handles = &s.reads.caches().handles;
            match s.listing.next().await {
                Some(Ok(meta)) => {
                    s.reads.observe_listed(&meta, s.epoch);
                    match &mut s.seen {
                        Some(seen) if handles.listing_fits(seen.len() + 1) => {
                            seen.push(meta.clone())
                        }
                        _ => s.seen = None,
                    }
                    Some((Ok(meta), s))
                }
                Some(Err(e)) => {
                    s.seen = None;
                    Some((Err(e), s))
                }
                None => {
                    if let (Some(objects), Some(key)) = (s.seen.take(), s.key.take()) {
                        let listing = Listing {
                            objects,
                            common_prefixes: vec![],
                        };
                        handles.record_listing(key, listing, s.epoch);
                    }
                    None
                }
            }
        })
        .boxed()
    }
}
