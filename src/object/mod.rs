//! What an object is and which version of it a reader means: the bottom layer every cache keys
//! its entries by.
//!
//! - [`StoreKey`] names the namespace a store serves (`s3://bucket`, `file://`), and
//!   [`ObjectId`] one object in it.
//! - [`ObjectVersion`] is one version of one object: its id, its size and what tells its
//!   versions apart ([`Validator`]). Footers, bloom filters and bytes are kept per version, so
//!   a replaced object is a miss, never another version's entry. A version whose validator
//!   names the bytes (a content hash) is shared by every store identity that has shown it;
//!   any other (counters, times, log-named path and size) belongs to the [`StoreIdentity`]
//!   that saw it, since two stores at one URL could show it for different bytes.
//! - [`Validator::of`] is the one rule for turning what a store showed (`ObjectMeta` from a
//!   listing, a HEAD or a GET) into a version, and [`ObjectVersion::matches`] the one rule for
//!   checking a response against the version a reader asked for.
//!
//! The read itself, `read(version, ranges)`, is implemented by the store layer
//! (`crate::store::StoreReads`), the only way a scan's bytes move. When the object is no longer
//! at the version asked for, it fails with [`version_changed`]: an
//! [`object_store::Error::Precondition`] naming the path and both versions.

mod by_object;
mod identity;
mod lifecycle;

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use object_store::ObjectMeta;
use object_store::path::Path;
use url::Url;

pub(crate) use by_object::ByObject;
pub use identity::StoreIdentity;
pub(crate) use lifecycle::{Lifecycle, listing_changes};

/// The namespace a store serves: the scheme, host and port of the URL it is registered under
/// (`s3://bucket`, `file://`, `http://host:8080`), whatever path the URL was written with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreKey(Arc<str>);

impl StoreKey {
    /// The key of the store registered for `url`.
    pub fn of(url: &Url) -> Self {
        // Built from its parts: `memory://` and `memory:` (no authority) must name one store.
        let host = url.host_str().unwrap_or_default();
        let text = match url.port() {
            Some(port) => format!("{}://{host}:{port}", url.scheme()),
            None => format!("{}://{host}", url.scheme()),
        };
        Self(text.into())
    }

    /// The key as text.
    #[cfg(test)]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the store serves local files (`file://`), which the operating system's page
    /// cache keeps already.
    pub fn is_local(&self) -> bool {
        self.0.starts_with("file://")
    }
}

impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One object: the store namespace it lives in and its path there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectId {
    /// The store's namespace.
    pub store: StoreKey,
    /// The object's path in the store.
    pub path: Path,
}

/// What tells one version of an object from another, as far as the store shows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Validator {
    /// A strong e_tag: a different representation always has another one, and `If-Match` can
    /// guard a read with it.
    ETag(ETag),
    /// A version identifier (GCS generation, S3 or Azure version id) of an object whose
    /// responses carry no strong e_tag; responses are checked against it.
    Version(Arc<str>),
    /// An object known never to change once written, such as a Delta Lake data file named by
    /// its table's log: its path and size name its bytes.
    Immutable,
    /// Only a weak e_tag (or none): the modification time (in microseconds) and the weak
    /// e_tag, if any, are all there is. Nothing can guard a read of such a version, so its
    /// bytes are never kept.
    Unvalidated {
        /// Modification time, microseconds since the epoch.
        modified: i64,
        /// The weak e_tag, if any.
        weak: Option<Arc<str>>,
    },
}

impl Validator {
    /// The validator `meta` shows. One rule for every source of metadata:
    /// - a strong e_tag decides, even when `version` is also set: listings of GCS and of
    ///   versioned S3 or Azure buckets carry the e_tag but not the version, their GETs and
    ///   HEADs carry both, and both must name the same version;
    /// - else a version identifier;
    /// - else (a weak e_tag, or none) the modification time.
    pub fn of(meta: &ObjectMeta) -> Self {
        match (strong_e_tag(meta), &meta.version) {
            (Some(e), _) => Self::ETag(ETag::new(e)),
            (None, Some(v)) => Self::Version(v.as_str().into()),
            (None, None) => Self::Unvalidated {
                modified: meta.last_modified.timestamp_micros(),
                weak: meta.e_tag.as_deref().map(Arc::from),
            },
        }
    }

    /// Whether the bytes of a version with this validator can be told apart from any other
    /// version's: only then are they kept.
    pub fn pins_bytes(&self) -> bool {
        !matches!(self, Self::Unvalidated { .. })
    }

    /// Whether this validator names the bytes themselves, whoever serves them: an e_tag that
    /// is a content digest (S3's MD5, `<md5>-<parts>` for multipart uploads, or a longer hex
    /// digest). Two stores showing such a version hold the same bytes, so its entries are
    /// shared between them. Counters and times (the in-memory store's e_tags, Azure's, some
    /// S3-compatible servers'), version ids and log-named versions only tell one store's
    /// versions apart.
    pub fn names_content(&self) -> bool {
        match self {
            Self::ETag(e) => is_digest(&e.tag),
            _ => false,
        }
    }

    /// [`Validator::names_content`] of the validator of `meta`, without making it.
    pub fn names_content_of(meta: &ObjectMeta) -> bool {
        strong_e_tag(meta).is_some_and(|e| is_digest(e.trim_matches('"')))
    }

    /// The `If-Match` value that guards a read of this version, if there is one.
    pub fn if_match(&self) -> Option<String> {
        match self {
            Self::ETag(e) => Some(e.sent.to_string()),
            _ => None,
        }
    }

    /// A stable text for this validator: what the disk tier writes into each entry.
    fn canonical(&self) -> String {
        match self {
            Self::ETag(e) => format!("e:{}", e.tag),
            Self::Version(v) => format!("v:{v}"),
            Self::Immutable => "i".to_string(),
            Self::Unvalidated { modified, weak } => {
                format!("t:{modified}:{}", weak.as_deref().unwrap_or(""))
            }
        }
    }
}

impl fmt::Display for Validator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ETag(e) => write!(f, "e_tag {}", e.sent),
            Self::Version(v) => write!(f, "version {v}"),
            Self::Immutable => write!(f, "immutable"),
            Self::Unvalidated { modified, weak } => {
                let when = DateTime::<Utc>::from_timestamp_micros(*modified)
                    .map_or_else(|| modified.to_string(), |t| t.to_rfc3339());
                match weak {
                    Some(w) => write!(f, "weak e_tag {w}, modified {when}"),
                    None => write!(f, "modified {when}"),
                }
            }
        }
    }
}

/// Whether an e_tag (without its quotes) is a content digest; see [`Validator::names_content`].
fn is_digest(tag: &str) -> bool {
    let (digest, parts) = match tag.split_once('-') {
        Some((digest, parts)) => (digest, Some(parts)),
        None => (tag, None),
    };
    digest.len() >= 32
        && digest.bytes().all(|b| b.is_ascii_hexdigit())
        && parts.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The strong e_tag of `meta`, if it has one (not a weak `W/` one).
fn strong_e_tag(meta: &ObjectMeta) -> Option<&str> {
    meta.e_tag.as_deref().filter(|e| !e.starts_with("W/"))
}

/// A strong e_tag: compared without its quotes (`"abc"` and `abc` name one version; Azure
/// lists e_tags without the quotes its GETs have), sent in `If-Match` as the store showed it.
#[derive(Debug, Clone)]
pub struct ETag {
    tag: Arc<str>,
    sent: Arc<str>,
}

impl ETag {
    fn new(e_tag: &str) -> Self {
        Self {
            tag: e_tag.trim_matches('"').into(),
            sent: e_tag.into(),
        }
    }

    /// Whether `e_tag` (as a response shows it) is this one.
    fn is(&self, e_tag: &str) -> bool {
        e_tag.trim_matches('"') == self.tag.as_ref()
    }
}

impl PartialEq for ETag {
    fn eq(&self, other: &Self) -> bool {
        self.tag == other.tag
    }
}

impl Eq for ETag {}

impl std::hash::Hash for ETag {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.tag.hash(state)
    }
}

/// One version of one object. Cheap to clone; every index and range entry is keyed by it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ObjectVersion(Arc<VersionInner>);

#[derive(PartialEq, Eq, Hash)]
struct VersionInner {
    id: ObjectId,
    size: u64,
    validator: Validator,
    /// The identity this version belongs to; `None` for a version whose validator names its
    /// bytes ([`Validator::names_content`]), shared by every identity that has shown it.
    owner: Option<StoreIdentity>,
}

impl ObjectVersion {
    /// The version `meta` describes of an object in the store `store`, as a store of
    /// `identity` showed it.
    pub fn new(store: StoreKey, identity: &StoreIdentity, meta: &ObjectMeta) -> Self {
        let (path, validator) = (meta.location.clone(), Validator::of(meta));
        Self::with_validator(store, identity, path, meta.size, validator)
    }

    /// A version named by its parts, such as an immutable file of a table's log, as a store
    /// of `identity` knows it.
    pub fn with_validator(
        store: StoreKey,
        identity: &StoreIdentity,
        path: Path,
        size: u64,
        validator: Validator,
    ) -> Self {
        let owner = (!validator.names_content()).then(|| identity.clone());
        Self(Arc::new(VersionInner {
            id: ObjectId { store, path },
            size,
            validator,
            owner,
        }))
    }

    /// The version `meta` shows of the same object, for the same identity as this one
    /// (`identity` when this version is shared by all).
    pub fn reseen(&self, identity: &StoreIdentity, meta: &ObjectMeta) -> Self {
        let identity = self.owner().unwrap_or(identity);
        Self::new(self.store().clone(), identity, meta)
    }

    /// The object this is a version of.
    pub fn id(&self) -> &ObjectId {
        &self.0.id
    }

    /// The object's path.
    pub fn path(&self) -> &Path {
        &self.0.id.path
    }

    /// The store namespace.
    pub fn store(&self) -> &StoreKey {
        &self.0.id.store
    }

    /// The size of this version in bytes.
    pub fn size(&self) -> u64 {
        self.0.size
    }

    /// What tells this version from others.
    pub fn validator(&self) -> &Validator {
        &self.0.validator
    }

    /// Whether this version's bytes are kept ([`Validator::pins_bytes`]).
    pub fn pins_bytes(&self) -> bool {
        self.0.validator.pins_bytes()
    }

    /// The identity whose alone this version is, or `None` if every identity that has shown
    /// it shares its entries.
    pub fn owner(&self) -> Option<&StoreIdentity> {
        self.0.owner.as_ref()
    }

    /// Whether this version's entries may outlive the process (the disk tier): only a version
    /// named by its content is the same version in the next process.
    pub fn outlives_process(&self) -> bool {
        self.0.owner.is_none()
    }

    /// A text naming this version exactly, stable across processes (for versions that
    /// [outlive the process](Self::outlives_process)).
    pub fn canonical(&self) -> String {
        format!(
            "{}\n{}\n{}\n{}",
            self.0.id.store,
            self.0.id.path,
            self.0.size,
            self.0.validator.canonical()
        )
    }

    /// Whether `seen` (the metadata of a response, a listing or a HEAD) shows this version or
    /// could: sizes must agree, and each validator both sides carry must agree. A side that
    /// carries less (a listing without e_tags, a response without a version) is taken at its
    /// word for what it leaves out; modification times are compared only when neither side
    /// has a strong validator, to the second, since listings and HEADs round them differently.
    pub fn matches(&self, seen: &ObjectMeta) -> bool {
        if seen.size != self.0.size {
            return false;
        }
        match &self.0.validator {
            Validator::ETag(e) => match seen.e_tag.as_deref() {
                Some(s) if s.starts_with("W/") => false,
                Some(s) => e.is(s),
                None => true,
            },
            Validator::Version(v) => seen.version.as_deref().is_none_or(|s| s == v.as_ref()),
            Validator::Immutable => true,
            Validator::Unvalidated { modified, weak } => {
                if strong_e_tag(seen).is_some() {
                    // Seen with a strong e_tag: the same version only if its time agrees.
                    return near(*modified, seen.last_modified);
                }
                let weak_agrees = match (weak, seen.e_tag.as_deref()) {
                    (Some(w), Some(s)) => w.as_ref() == s,
                    _ => true,
                };
                weak_agrees && near(*modified, seen.last_modified)
            }
        }
    }
}

/// Whether a time in microseconds and `t` are less than a second apart.
fn near(micros: i64, t: DateTime<Utc>) -> bool {
    (micros - t.timestamp_micros()).abs() < 1_000_000
}

impl fmt::Debug for ObjectVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} ({} bytes, {})",
            self.store(),
            self.path(),
            self.size(),
            self.validator()
        )
    }
}

impl fmt::Display for ObjectVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes, {}", self.size(), self.validator())
    }
}

/// Why a read failed: the object is no longer at the version the reader planned with.
/// Carried as the source of an [`object_store::Error::Precondition`].
#[derive(Debug, Clone)]
pub struct VersionChanged {
    /// The object's path.
    pub path: String,
    /// The version the reader asked for.
    pub expected: String,
    /// What the store showed instead, if it said (an `If-Match` refusal does not).
    pub found: Option<String>,
}

impl fmt::Display for VersionChanged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} changed while the query read it: planned with {}, the store now has {}; \
             run the query again to read the new version",
            self.path,
            self.expected,
            self.found.as_deref().unwrap_or("another version")
        )
    }
}

impl std::error::Error for VersionChanged {}

/// The error of a read of `version` that found the object changed (`found` is what the
/// store showed, if it did).
pub fn version_changed(version: &ObjectVersion, found: Option<&ObjectMeta>) -> object_store::Error {
    let found = found.map(|m| format!("{} bytes, {}", m.size, Validator::of(m)));
    object_store::Error::Precondition {
        path: version.path().to_string(),
        source: Box::new(VersionChanged {
            path: version.path().to_string(),
            expected: version.to_string(),
            found,
        }),
    }
}

impl VersionChanged {
    /// The [`VersionChanged`] inside `error`, however deeply DataFusion and the Parquet
    /// reader wrapped it: how a caller tells "the lake changed under this query, run it again"
    /// from other failures.
    ///
    /// ```
    /// # use datafusion_lakecache::VersionChanged;
    /// let error = std::io::Error::other("something else");
    /// assert!(VersionChanged::find(&error).is_none());
    /// ```
    pub fn find<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a VersionChanged> {
        let mut current = Some(error);
        while let Some(e) = current {
            if let Some(changed) = e.downcast_ref::<VersionChanged>() {
                return Some(changed);
            }
            current = e.source();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn meta(size: u64, e_tag: Option<&str>, version: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            location: Path::from("a.parquet"),
            last_modified: Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
            size,
            e_tag: e_tag.map(str::to_string),
            version: version.map(str::to_string),
        }
    }

    fn key() -> StoreKey {
        StoreKey::of(&Url::parse("s3://bucket").unwrap())
    }

    fn me() -> StoreIdentity {
        StoreIdentity::named("me")
    }

    #[test]
    fn only_content_digests_are_shared_between_identities() {
        let md5 = "\"9e107d9d372bb6826bd81d3542a419d6\"";
        for (e_tag, shared) in [
            (md5, true),
            ("\"9e107d9d372bb6826bd81d3542a419d6-12\"", true),
            (
                "d7a8fbb307d7809469ca9abcb0082e4f8d5651e46d3cdb762d02d0bf37c9e592",
                true,
            ),
            ("\"0\"", false),
            ("\"17\"", false),
            ("\"0x8DBB0F7E1B4C2A1\"", false),
            ("\"9e107d9d372bb6826bd81d3542a419d6-\"", false),
            ("\"9e107d9d372bb6826bd81d3542a419d6-x\"", false),
            ("\"1a2b-5f00-2000\"", false),
        ] {
            let a = ObjectVersion::new(key(), &me(), &meta(10, Some(e_tag), None));
            let b = ObjectVersion::new(key(), &StoreIdentity::named("other"), &a_meta(e_tag));
            assert_eq!(a == b, shared, "{e_tag}");
            assert_eq!(a.owner().is_none(), shared, "{e_tag}");
            assert_eq!(a.outlives_process(), shared, "{e_tag}");
        }
        let versioned = ObjectVersion::new(key(), &me(), &meta(10, None, Some("7")));
        assert_eq!(
            versioned.owner(),
            Some(&me()),
            "version ids are times or counters"
        );
        let logged =
            ObjectVersion::with_validator(key(), &me(), "a".into(), 1, Validator::Immutable);
        assert_eq!(
            logged.owner(),
            Some(&me()),
            "path and size name nothing across stores"
        );
    }

    fn a_meta(e_tag: &str) -> ObjectMeta {
        meta(10, Some(e_tag), None)
    }

    #[test]
    fn a_store_is_named_by_scheme_host_and_port_alone() {
        for (a, b) in [
            ("memory://", "memory:"),
            ("s3://bucket", "s3://bucket/some/path/"),
            ("http://host:8080/x", "http://host:8080"),
            ("file:///", "file://"),
        ] {
            let key = |u: &str| StoreKey::of(&Url::parse(u).unwrap());
            assert_eq!(key(a), key(b), "{a} and {b}");
        }
        let key = |u: &str| StoreKey::of(&Url::parse(u).unwrap());
        assert_ne!(key("s3://a"), key("s3://b"));
        assert_ne!(key("http://h:1"), key("http://h:2"));
    }

    #[test]
    fn a_listing_without_the_version_and_a_get_with_it_name_one_version() {
        let listed = ObjectVersion::new(key(), &me(), &meta(10, Some("\"abc\""), None));
        let got = ObjectVersion::new(
            key(),
            &me(),
            &meta(10, Some("\"abc\""), Some("1700000000123")),
        );
        assert_eq!(listed, got, "the e_tag decides");
        assert!(listed.matches(&meta(10, Some("\"abc\""), Some("17"))));
        assert!(
            listed.matches(&meta(10, Some("abc"), None)),
            "quotes do not matter"
        );
        assert!(!listed.matches(&meta(10, Some("\"abd\""), None)));
        assert!(
            !listed.matches(&meta(11, Some("\"abc\""), None)),
            "sizes must agree"
        );
        assert_eq!(listed.validator().if_match().as_deref(), Some("\"abc\""));
    }

    #[test]
    fn weak_and_missing_e_tags_never_pin_bytes() {
        let weak = ObjectVersion::new(key(), &me(), &meta(10, Some("W/\"abc\""), None));
        assert!(!weak.pins_bytes());
        assert_eq!(weak.validator().if_match(), None);
        assert!(weak.matches(&meta(10, Some("W/\"abc\""), None)));
        assert!(!weak.matches(&meta(10, Some("W/\"abd\""), None)));
        let none = ObjectVersion::new(key(), &me(), &meta(10, None, None));
        assert!(!none.pins_bytes());
        let mut later = meta(10, None, None);
        later.last_modified = Utc.timestamp_opt(1_700_000_005, 0).unwrap();
        assert!(!none.matches(&later), "another modification time");
        let versioned = ObjectVersion::new(key(), &me(), &meta(10, None, Some("7")));
        assert!(versioned.pins_bytes());
        assert!(!versioned.matches(&meta(10, None, Some("8"))));
    }

    #[test]
    fn a_changed_version_is_a_precondition_error_naming_both_versions() {
        let v1 = ObjectVersion::new(key(), &me(), &meta(10, Some("\"one\""), None));
        let err = version_changed(&v1, Some(&meta(12, Some("\"two\""), None)));
        assert!(matches!(err, object_store::Error::Precondition { .. }));
        let text = err.to_string();
        for part in ["a.parquet", "\"one\"", "\"two\"", "12 bytes"] {
            assert!(text.contains(part), "{part} in {text}");
        }
        let changed = VersionChanged::find(&err).unwrap();
        assert_eq!(changed.path, "a.parquet");
    }
}
