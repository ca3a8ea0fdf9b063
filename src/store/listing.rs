//! Listings through the handle cache: a repeated listing of a prefix is served from it (to
//! the identity whose store listed it), and a listing streamed from the store is recorded as
//! it goes, so every object it shows is known by its version when a reader asks for it. A
//! listing proves no read access: a store may be allowed to list and not to read.
//!
//! Listings of a table log ([`listing_changes`]) always come from the store, since they show
//! new commits; what they show is still recorded.
//!
//! A listing that shows Parquet files is, as likely as not, one a table is registered or
//! scanned with, and the footers of every file it shows are read next, 32 at a time by
//! DataFusion. So before a listing streamed from the store ends, the layers above may load
//! those footers, all at once ([`AfterListing`], installed with the `LakeCache`): the
//! reads that follow find them cached.
//!
//! A listing races with writes: a page fetched before a write through the wrapper but
//! consumed after it shows the old version. Every record therefore carries the cache's
//! invalidation epoch from when the listing began; after an invalidation, the rest of that
//! listing is passed through but recorded nowhere.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{ListResult, ObjectMeta, Result};
use tokio::sync::watch;

use super::StoreReads;
use super::reads::naming;
use crate::handle::{Epoch, ListKey, ListKind, Listing, listed_bytes};
use crate::object::listing_changes;

/// What the layers above do with the Parquet files a listing showed, before its end is
/// handed on: the prefetch layer loads their footers (`crate::prefetch::FooterWarmup`).
pub(crate) trait AfterListing: std::fmt::Debug + Send + Sync {
    /// Runs once a listing made through `reads` ends, with what it showed (the listing as it
    /// is cached, no copy of it; [`is_parquet`] tells the files a table reads); the listing
    /// ends for its consumer when the future does. Failures are not the listing's: whoever
    /// reads a file later meets them.
    fn listed(&self, reads: StoreReads, listed: Arc<Listing>) -> BoxFuture<'static, ()>;
}

/// Whether a table of Parquet files would read `meta` (its name ends in `.parquet`).
pub(crate) fn is_parquet(meta: &ObjectMeta) -> bool {
    meta.size > 0
        && meta
            .location
            .filename()
            .is_some_and(|n| n.to_ascii_lowercase().ends_with(".parquet"))
}

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
    /// the store while recording it. A listing of the same prefix already under way is
    /// waited for, then taken from the cache.
    pub(super) fn list(
        &self,
        prefix: Option<&Path>,
        offset: Option<&Path>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let kind = match offset {
            Some(o) => ListKind::After(o.clone()),
            None => ListKind::Recursive,
        };
        let key = self.list_key(prefix, kind);
        let handles = &self.caches().handles;
        let changes = listing_changes(prefix);
        if !changes && let Some(cached) = handles.listing(&key) {
            return stream::iter(Listing::stream(cached).map(Ok)).boxed();
        }
        let fresh = {
            let inner = Arc::clone(&self.inner().inner);
            let (prefix, offset) = (prefix.cloned(), offset.cloned());
            move || {
                let what = format!("listing {}", prefix.as_ref().map_or("", |p| p.as_ref()));
                let listing = match &offset {
                    Some(o) => inner.list_with_offset(prefix.as_ref(), o),
                    None => inner.list(prefix.as_ref()),
                };
                listing
                    .map(move |item| item.map_err(|e| naming(e, &what)))
                    .boxed()
            }
        };
        if changes {
            return self.recording(None, fresh());
        }
        let Some(mut under_way) = self.listing_under_way(&key) else {
            return self.recording(Some(key), fresh());
        };
        // Another listing of this prefix is under way (or one its consumer stopped reading is
        // read to its end, as DataFusion reads ten files of a table to find its partitions,
        // then lists it again): wait for it, then take what it recorded.
        let this = self.clone();
        stream::once(async move {
            let _ = under_way.wait_for(|ended| *ended).await;
            match this.caches().handles.listing(&key) {
                Some(cached) => stream::iter(Listing::stream(cached).map(Ok)).boxed(),
                None => this.recording(Some(key), fresh()),
            }
        })
        .flatten()
        .boxed()
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
        let objects: Vec<Arc<ObjectMeta>> =
            result.objects.iter().map(|m| Arc::new(m.clone())).collect();
        for meta in &objects {
            self.observe_listed(meta, epoch);
        }
        if changes {
            return Ok(result);
        }
        let listing = Listing {
            objects,
            common_prefixes: result.common_prefixes.clone(),
        };
        handles.record_listing(key, Arc::new(listing), epoch);
        Ok(result)
    }

    /// Passes a listing through while recording what it shows; with a `key`, a listing that
    /// completes without error and without an invalidation since it began is cached. If its
    /// consumer stops reading it early, the rest is read in the background (as long as it
    /// can still be cached or its files' footers loaded), so the listing that follows finds
    /// it cached.
    fn recording(
        &self,
        key: Option<ListKey>,
        listing: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        // Never for a table log's listings (no key): they are read as the log says.
        let warm = key.is_some() && self.caches().after_listing.is_some();
        let under_way = key.as_ref().map(|k| self.start_listing(k));
        let state = Recording {
            // Fused: a consumer may go away while the end is under way (footers loading),
            // and the rest is then finished in the background, which asks for the next item
            // again. A cloud store's listing panics when polled past its end.
            listing: listing.fuse().boxed(),
            reads: self.clone(),
            seen: key.as_ref().map(|_| (Vec::new(), 0)),
            warm,
            parquet: Vec::new(),
            ended_as: None,
            key,
            epoch: self.caches().handles.epoch(),
            under_way,
            ended: false,
            draining: false,
        };
        stream::unfold(state, |mut s| async move {
            match s.listing.next().await {
                Some(Ok(meta)) => {
                    s.saw(&meta);
                    Some((Ok(meta), s))
                }
                Some(Err(e)) => {
                    s.failed();
                    Some((Err(e), s))
                }
                None => {
                    s.end().await;
                    None
                }
            }
        })
        .boxed()
    }

    /// A listing of `key` under way, if there is one: its end is signalled on the receiver.
    fn listing_under_way(&self, key: &ListKey) -> Option<watch::Receiver<bool>> {
        let map = self.listings().lock().unwrap_or_else(|e| e.into_inner());
        map.get(key).cloned()
    }

    /// Notes that a listing of `key` is under way, until the returned sender is dropped or
    /// signals its end.
    fn start_listing(&self, key: &ListKey) -> UnderWay {
        let (ended, receiver) = watch::channel(false);
        let mut map = self.listings().lock().unwrap_or_else(|e| e.into_inner());
        map.insert(key.clone(), receiver.clone());
        UnderWay { ended, receiver }
    }
}

/// A listing under way, and how whoever waits for it learns it ended.
struct UnderWay {
    ended: watch::Sender<bool>,
    receiver: watch::Receiver<bool>,
}

/// The state of a listing being passed through and recorded.
struct Recording {
    listing: BoxStream<'static, Result<ObjectMeta>>,
    reads: StoreReads,
    /// Everything shown so far, and its bytes, while it can still be cached.
    seen: Option<(Vec<Arc<ObjectMeta>>, u64)>,
    /// Whether [`AfterListing`] is to see the listing's Parquet files.
    warm: bool,
    /// The Parquet files shown, for [`AfterListing`], once `seen` is no longer kept (while it
    /// is, they are in it).
    parquet: Vec<Arc<ObjectMeta>>,
    /// The listing as it is cached, once it ended (built from `seen` before its footers are
    /// loaded, so that a listing whose consumer went away meanwhile still records it).
    ended_as: Option<Arc<Listing>>,
    key: Option<ListKey>,
    epoch: Epoch,
    under_way: Option<UnderWay>,
    ended: bool,
    /// Read on in the background already: dropped again (the runtime shutting down), it is
    /// given up, never handed to the runtime once more (a closed runtime drops a task it is
    /// given at once, on the caller's stack, so each drop would spawn the next).
    draining: bool,
}

impl Recording {
    fn saw(&mut self, meta: &ObjectMeta) {
        // One copy, shared by the listing as cached and the object's handle entry.
        let meta = Arc::new(meta.clone());
        self.reads.observe_listed(&meta, self.epoch);
        let handles = &self.reads.caches().handles;
        match &mut self.seen {
            Some((seen, bytes)) if handles.listing_fits(*bytes + listed_bytes(&meta)) => {
                *bytes += listed_bytes(&meta);
                seen.push(meta);
                return;
            }
            Some((seen, _)) => {
                // Too large to cache: only what the footers' loading needs is kept.
                if self.warm {
                    self.parquet = std::mem::take(seen);
                    self.parquet.retain(|m| is_parquet(m));
                }
                self.seen = None;
            }
            None => {}
        }
        if self.warm && is_parquet(&meta) {
            self.parquet.push(meta);
        }
    }

    fn failed(&mut self) {
        self.seen = None;
        self.warm = false;
        self.parquet = Vec::new();
    }

    /// Whether reading on is of use: the listing can still be cached, or its files' footers
    /// loaded.
    fn useful(&self) -> bool {
        self.seen.is_some() || self.warm || self.ended_as.is_some()
    }

    /// The listing ended: its Parquet files' footers are loaded, then it is cached (so that
    /// a listing served from the cache finds them loaded too), and whoever waits for it told.
    async fn end(&mut self) {
        if let Some((objects, _)) = self.seen.take() {
            self.ended_as = Some(Arc::new(Listing {
                objects,
                common_prefixes: vec![],
            }));
        }
        let listing = self.ended_as.clone();
        let hook = self.reads.caches().after_listing.clone();
        if let Some(hook) = hook.filter(|_| self.warm) {
            let listed = match &listing {
                Some(listing) => Arc::clone(listing),
                None => Arc::new(Listing {
                    objects: std::mem::take(&mut self.parquet),
                    common_prefixes: vec![],
                }),
            };
            if listed.objects.iter().any(|m| is_parquet(m)) {
                hook.listed(self.reads.clone(), listed).await;
            }
        }
        let handles = self.reads.caches().handles.clone();
        if let (Some(listing), Some(key)) = (self.ended_as.take(), self.key.take()) {
            handles.record_listing(key, listing, self.epoch);
        }
        self.ended = true;
        self.signal();
    }

    /// Tells whoever waits for this listing that it ended (or was given up).
    fn signal(&mut self) {
        let Some(under_way) = self.under_way.take() else {
            return;
        };
        under_way.ended.send_replace(true);
        let mut map = self
            .reads
            .listings()
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        map.retain(|_, r| !r.same_channel(&under_way.receiver));
    }

    /// Reads the rest of the listing, recording it, while that can still be of use.
    async fn drain(mut self) {
        while self.useful() {
            match self.listing.next().await {
                Some(Ok(meta)) => self.saw(&meta),
                Some(Err(_)) => self.failed(),
                None => break,
            }
        }
        self.end().await;
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let useful = self.useful();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if useful && !self.draining => {
                let rest = Recording {
                    listing: std::mem::replace(&mut self.listing, stream::empty().boxed()),
                    reads: self.reads.clone(),
                    seen: self.seen.take(),
                    warm: std::mem::take(&mut self.warm),
                    parquet: std::mem::take(&mut self.parquet),
                    ended_as: self.ended_as.take(),
                    key: self.key.take(),
                    epoch: self.epoch,
                    under_way: self.under_way.take(),
                    ended: false,
                    draining: true,
                };
                runtime.spawn(rest.drain());
            }
            // Nobody reads it on: whoever waits for it lists for itself.
            _ => self.signal(),
        }
    }
}
