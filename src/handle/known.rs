//! [`Known`]: what every store identity that has shown one object recorded of it and proved,
//! in one cache entry per object.
//!
//! A thousand identities reading one lake must not cost a thousand copies of each file's
//! metadata and a thousand cache entries per file: the identities of an object share one
//! entry, each a member with its recorded metadata (an `Arc` shared with the members that
//! recorded the same) and the versions it proved (its bytes: `--scenario entries` of benches/scale).

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectMeta;
use smallvec::SmallVec;

use crate::few_map::FewMap;
use crate::object::{ObjectVersion, StoreIdentity};

/// Identities an entry holds per unit of `lakecache.handle.capacity` beyond its first: an
/// object shown by 32 identities or fewer counts one, by 33 to 64 two, and so on.
pub(super) const MEMBERS_PER_UNIT: usize = 32;

/// One object's entry. Its state is behind a lock of its own: recordings of one object are
/// serialized there, recordings of different objects never wait for each other.
pub(super) struct Known {
    /// This entry's token in the path index: the removal of an entry takes out its own.
    pub(super) token: u64,
    pub(super) state: std::sync::Mutex<Members>,
}

impl Known {
    pub(super) fn new(token: u64) -> Self {
        Self {
            token,
            state: std::sync::Mutex::default(),
        }
    }

    /// What the cache weighs it: one, and one more per [`MEMBERS_PER_UNIT`] identities.
    pub(super) fn weight(&self) -> u32 {
        let members = super::lock(&self.state).by.len();
        u32::try_from(1 + members / MEMBERS_PER_UNIT).unwrap_or(u32::MAX)
    }
}

/// The identities that have shown an object.
#[derive(Default)]
pub(super) struct Members {
    /// Set once the cache let the entry go (evicted, expired, forgotten): what is recorded
    /// here is seen by nobody, so a recording that finds it set goes to a new entry.
    pub(super) gone: bool,
    pub(super) by: ByIdentity,
    /// The metadata recorded last, shared with the next member that records the same.
    last: Option<Arc<ObjectMeta>>,
    /// The member count when the cache last weighed the entry.
    pub(super) weighed: usize,
}

impl Members {
    /// `meta` in an allocation another holder keeps anyway: `given` (a listing's copy), else
    /// what the last recording kept if it is the same; a copy only if neither is.
    pub(super) fn shared(
        &mut self,
        meta: &ObjectMeta,
        given: Option<&Arc<ObjectMeta>>,
    ) -> Arc<ObjectMeta> {
        let same = |held: &&Arc<ObjectMeta>| held.as_ref() == meta;
        let meta = match given.filter(same).or(self.last.as_ref().filter(same)) {
            Some(held) => Arc::clone(held),
            None => Arc::new(meta.clone()),
        };
        self.last = Some(Arc::clone(&meta));
        meta
    }

    /// `identity`'s recording of `held` now holds `given`, an equal copy that a listing
    /// holds: one copy for both. The recording is otherwise unchanged (its token and time).
    pub(super) fn share(
        &mut self,
        identity: &StoreIdentity,
        held: &Arc<ObjectMeta>,
        given: &Arc<ObjectMeta>,
    ) {
        if let Some(recorded) = self.by.get_mut(identity).and_then(|m| m.meta.as_mut()) {
            recorded.meta = Arc::clone(given);
        }
        if self
            .last
            .as_ref()
            .is_some_and(|last| Arc::ptr_eq(last, held))
        {
            self.last = Some(Arc::clone(given));
        }
    }

    /// Whether the entry has grown by a unit since the cache last weighed it.
    pub(super) fn outgrew_weight(&mut self) -> bool {
        let grew = self.by.len() / MEMBERS_PER_UNIT > self.weighed / MEMBERS_PER_UNIT;
        if grew {
            self.weighed = self.by.len();
        }
        grew
    }
}

/// The members of one object's entry, by identity. Most objects are shown by one identity,
/// kept inside the entry; a thousand identities of one object still find theirs in one probe.
pub(super) type ByIdentity = FewMap<StoreIdentity, Member>;

/// What one identity recorded of an object and proved of its versions.
#[derive(Default)]
pub(super) struct Member {
    pub(super) meta: Option<Recorded>,
    /// Mostly one version: kept inline.
    pub(super) proofs: SmallVec<[Proof; 1]>,
}

impl Member {
    pub(super) fn is_empty(&self) -> bool {
        self.meta.is_none() && self.proofs.is_empty()
    }
}

/// Metadata as recorded, with the token of that recording: a recording newer than a
/// request's start is told from one older (see `Epoch`).
#[derive(Clone)]
pub(super) struct Recorded {
    pub(super) meta: Arc<ObjectMeta>,
    pub(super) token: u64,
    pub(super) at: Instant,
}

/// A proof of access: the identity's store answered a HEAD or a GET for this version.
pub(super) struct Proof {
    pub(super) version: ObjectVersion,
    pub(super) at: Instant,
}

/// Whether what was recorded `at` is past `ttl` (zero: never).
pub(super) fn expired(at: Instant, ttl: Duration) -> bool {
    !ttl.is_zero() && at.elapsed() >= ttl
}
