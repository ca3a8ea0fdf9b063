use super::*;
use chrono::{TimeZone, Utc};

fn meta(path: &str, size: u64, e_tag: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        location: Path::from(path),
        last_modified: Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
        size,
        e_tag: e_tag.map(str::to_string),
        version: None,
    }
}

fn store() -> StoreKey {
    StoreKey::of(&url::Url::parse("memory://").unwrap())
}

fn id(path: &str) -> ObjectId {
    ObjectId {
        store: store(),
        path: Path::from(path),
    }
}

#[test]
fn capacity_bounds_the_metadata_entries() {
    let cache = HandleCache::try_new(HandleConfig {
        capacity: 10,
        ..HandleConfig::default()
    })
    .unwrap();
    for i in 0..100 {
        let m = meta(&format!("f{i}"), i, Some("e"));
        cache.record(&store(), &m);
        // Touch it again so frequency-based admission lets later keys in.
        cache.meta(&id(&format!("f{i}")), true);
    }
    let stats = cache.stats();
    assert!(stats.metadata.entries <= 10, "{stats:?}");
    assert!(stats.metadata.evictions > 0, "{stats:?}");
    let indexed = lock(&cache.inner.paths).len();
    assert!(indexed <= 10, "the path index follows evictions: {indexed}");
}

#[test]
fn a_new_version_replaces_the_entry_and_drops_listings() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let key = ListKey {
        store: store(),
        prefix: Some(Path::from("dir")),
        kind: ListKind::Recursive,
    };
    let other = ListKey {
        prefix: Some(Path::from("dirx")),
        ..key.clone()
    };
    let old = meta("dir/a", 10, Some("v1"));
    cache.record(&store(), &old);
    for k in [&key, &other] {
        let listing = Listing {
            objects: vec![old.clone()],
            common_prefixes: vec![],
        };
        cache.record_listing(k.clone(), listing, cache.epoch());
    }
    cache.record(&store(), &meta("dir/a", 12, Some("v2")));
    assert_eq!(cache.meta(&id("dir/a"), true).unwrap().size, 12);
    assert!(
        cache.listing(&key, true).is_none(),
        "listing of the parent dropped"
    );
    assert!(
        cache.listing(&other, true).is_some(),
        "unrelated prefix kept"
    );
    assert_eq!(cache.stats().version_changes, 1);
}

#[test]
fn a_listing_that_began_before_an_invalidation_records_nothing() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let epoch = cache.epoch();
    cache.invalidate(&id("dir/a"));
    cache.record_listed(&store(), &meta("dir/a", 10, Some("old")), epoch);
    assert!(cache.peek(&id("dir/a")).is_none());
    cache.record_listed(&store(), &meta("dir/a", 10, Some("new")), cache.epoch());
    assert!(cache.peek(&id("dir/a")).is_some());
}

#[test]
fn a_response_with_a_version_but_the_same_e_tag_is_the_same_version() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    cache.record(&store(), &meta("a", 10, Some("\"x\"")));
    let mut got = meta("a", 10, Some("\"x\""));
    got.version = Some("1700000000123456".into());
    cache.record(&store(), &got);
    assert_eq!(cache.stats().version_changes, 0);
}

#[test]
fn a_listed_version_without_e_tag_is_completed_by_a_head() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let listed = meta("a", 10, None);
    cache.record(&store(), &listed);
    let (v, _) = cache.version_of(&store(), &listed);
    assert!(!v.pins_bytes());
    cache.record(&store(), &meta("a", 10, Some("\"x\"")));
    assert_eq!(cache.stats().version_changes, 0);
    let (v, hit) = cache.version_of(&store(), &listed);
    assert!(hit && v.pins_bytes(), "{v:?}");
}

#[test]
fn entries_keyed_by_path_alone_are_checked_against_every_store() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let other = StoreKey::of(&url::Url::parse("s3://other").unwrap());
    cache.record(&store(), &meta("t/a", 10, Some("one")));
    assert!(!cache.contradicts(&Path::from("t/a"), &meta("t/a", 10, Some("one"))));
    cache.record(&other, &meta("t/a", 10, Some("two")));
    assert!(cache.contradicts(&Path::from("t/a"), &meta("t/a", 10, Some("one"))));
    assert!(!cache.contradicts(&Path::from("t/b"), &meta("t/b", 10, Some("one"))));
}

#[test]
fn ttl_zero_never_expires_and_the_idle_timeout_does() {
    let forever = HandleCache::try_new(HandleConfig {
        ttl: Duration::ZERO,
        ..HandleConfig::default()
    })
    .unwrap();
    let idle = HandleCache::try_new(HandleConfig {
        ttl: Duration::ZERO,
        idle_timeout: Some(Duration::from_millis(60)),
        ..HandleConfig::default()
    })
    .unwrap();
    for cache in [&forever, &idle] {
        cache.record(&store(), &meta("a", 1, Some("e")));
    }
    std::thread::sleep(Duration::from_millis(150));
    assert!(forever.meta(&id("a"), true).is_some());
    assert!(idle.meta(&id("a"), true).is_none());
    assert_eq!(idle.stats().metadata.expirations, 1);
    assert_eq!(forever.stats().metadata.expirations, 0);
}
