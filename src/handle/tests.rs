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

fn me() -> StoreIdentity {
    StoreIdentity::named("me")
}

fn seen(path: &str) -> Seen {
    Seen {
        identity: me(),
        id: id(path),
    }
}

fn list_key(prefix: &str) -> ListKey {
    ListKey {
        identity: me(),
        store: store(),
        prefix: Some(Path::from(prefix)),
        kind: ListKind::Recursive,
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
        cache.record(&me(), &store(), &m, cache.epoch());
        // Touch it again so frequency-based admission lets later keys in.
        cache.meta(&seen(&format!("f{i}")), |_| true);
    }
    let stats = cache.stats();
    assert!(stats.metadata.entries <= 10, "{stats:?}");
    assert!(stats.metadata.evictions > 0, "{stats:?}");
    let indexed = cache.inner.paths.paths();
    assert!(indexed <= 10, "the path index follows evictions: {indexed}");
}

#[test]
fn a_new_version_replaces_the_entry_and_drops_listings() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let key = list_key("dir");
    let other = list_key("dirx");
    let old = meta("dir/a", 10, Some("v1"));
    cache.record(&me(), &store(), &old, cache.epoch());
    for k in [&key, &other] {
        let listing = Listing {
            objects: vec![Arc::new(old.clone())],
            common_prefixes: vec![],
        };
        cache.record_listing(k.clone(), Arc::new(listing), cache.epoch());
    }
    cache.record(
        &me(),
        &store(),
        &meta("dir/a", 12, Some("v2")),
        cache.epoch(),
    );
    assert_eq!(cache.meta(&seen("dir/a"), |_| true).unwrap().size, 12);
    assert!(
        cache.listing(&key).is_none(),
        "listing of the parent dropped"
    );
    assert!(cache.listing(&other).is_some(), "unrelated prefix kept");
    assert_eq!(cache.stats().version_changes, 1);
}

#[test]
fn a_listing_that_began_before_an_invalidation_records_nothing() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let epoch = cache.epoch();
    cache.invalidate_seen(&seen("dir/a"));
    cache.record_listed(
        &me(),
        &store(),
        &Arc::new(meta("dir/a", 10, Some("old"))),
        epoch,
    );
    assert!(cache.peek(&seen("dir/a")).is_none());
    cache.record_listed(
        &me(),
        &store(),
        &Arc::new(meta("dir/a", 10, Some("new"))),
        cache.epoch(),
    );
    assert!(cache.peek(&seen("dir/a")).is_some());
}

#[test]
fn a_response_with_a_version_but_the_same_e_tag_is_the_same_version() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    cache.record(
        &me(),
        &store(),
        &meta("a", 10, Some("\"x\"")),
        cache.epoch(),
    );
    let mut got = meta("a", 10, Some("\"x\""));
    got.version = Some("1700000000123456".into());
    cache.record(&me(), &store(), &got, cache.epoch());
    assert_eq!(cache.stats().version_changes, 0);
}

#[test]
fn a_listed_version_without_e_tag_is_completed_by_a_head() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let listed = meta("a", 10, None);
    cache.record(&me(), &store(), &listed, cache.epoch());
    let (v, _) = cache.version_of(&me(), &store(), &listed);
    assert!(!v.pins_bytes());
    cache.record(
        &me(),
        &store(),
        &meta("a", 10, Some("\"x\"")),
        cache.epoch(),
    );
    assert_eq!(cache.stats().version_changes, 0);
    let (v, hit) = cache.version_of(&me(), &store(), &listed);
    assert!(hit && v.pins_bytes(), "{v:?}");
}

#[test]
fn entries_keyed_by_path_alone_are_checked_against_every_store() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let other = StoreKey::of(&url::Url::parse("s3://other").unwrap());
    cache.record(
        &me(),
        &store(),
        &meta("t/a", 10, Some("one")),
        cache.epoch(),
    );
    assert!(!cache.contradicts(&Path::from("t/a"), &meta("t/a", 10, Some("one")), None));
    cache.record(&me(), &other, &meta("t/a", 10, Some("two")), cache.epoch());
    assert!(cache.contradicts(&Path::from("t/a"), &meta("t/a", 10, Some("one")), None));
    assert!(!cache.contradicts(&Path::from("t/b"), &meta("t/b", 10, Some("one")), None));
}

#[test]
fn a_check_by_path_sees_an_entry_until_the_cache_lets_it_go() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let other = StoreKey::of(&url::Url::parse("s3://other").unwrap());
    let one = meta("t/a", 10, Some("one"));
    cache.record(&me(), &store(), &one, cache.epoch());
    // Another time, the same e_tag: metadata that differs, of the same version.
    let mut later = one.clone();
    later.last_modified += chrono::Duration::hours(1);
    assert!(!cache.contradicts(&Path::from("t/a"), &later, None));
    cache.record(&me(), &other, &meta("t/a", 10, Some("two")), cache.epoch());
    assert!(cache.contradicts(&Path::from("t/a"), &one, None));
    let at_other = ObjectId {
        store: other,
        path: Path::from("t/a"),
    };
    cache.invalidate(&at_other);
    assert!(
        !cache.contradicts(&Path::from("t/a"), &one, None),
        "the other store's entry, let go, shows no version"
    );
}

#[test]
fn a_counter_e_tag_two_stores_show_alike_is_no_ones_entry() {
    // Two stores (in-memory ones number their writes alike) show one path at the same size
    // and e_tag "0": an entry keyed by that path alone may be either one's bytes.
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let (one, two) = (StoreIdentity::named("one"), StoreIdentity::named("two"));
    let (at_one, at_two) = (
        StoreKey::of(&url::Url::parse("memory://one").unwrap()),
        StoreKey::of(&url::Url::parse("memory://two").unwrap()),
    );
    let counter = meta("t/f0", 10, Some("0"));
    cache.record(&one, &at_one, &counter, cache.epoch());
    let path = Path::from("t/f0");
    assert!(
        !cache.contradicts(&path, &counter, None),
        "one store: its own"
    );
    cache.record(&two, &at_two, &counter, cache.epoch());
    assert!(cache.contradicts(&path, &counter, None), "two stores");
    // A session of store one alone still has its entries.
    assert!(!cache.contradicts(&path, &counter, Some(std::slice::from_ref(&one))));
    assert!(cache.contradicts(&path, &counter, Some(&[one.clone(), two.clone()])));
    // A digest names the bytes whoever shows it.
    let digest = meta("t/d", 10, Some("\"9e107d9d372bb6826bd81d3542a419d6\""));
    cache.record(&one, &at_one, &digest, cache.epoch());
    cache.record(&two, &at_two, &digest, cache.epoch());
    assert!(!cache.contradicts(&Path::from("t/d"), &digest, None));
}

#[test]
fn answers_of_requests_in_flight_at_once_that_disagree_record_neither() {
    // A GET sent before the object was rewritten answers after a HEAD recorded the rewrite:
    // which one is newer, neither tells; the older one is never recorded over the newer,
    // and the next read asks the store.
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let get_sent = cache.epoch();
    let head_sent = cache.epoch();
    cache.record(&me(), &store(), &meta("t/a", 10, Some("new")), head_sent);
    cache.record(&me(), &store(), &meta("t/a", 10, Some("old")), get_sent);
    assert!(cache.peek(&seen("t/a")).is_none());
    cache.record(
        &me(),
        &store(),
        &meta("t/a", 10, Some("new")),
        cache.epoch(),
    );
    assert_eq!(
        cache.peek(&seen("t/a")).unwrap().e_tag.as_deref(),
        Some("new")
    );
    // An answer to a request sent after it records what it shows.
    let later = cache.epoch();
    cache.record(&me(), &store(), &meta("t/a", 10, Some("newer")), later);
    assert_eq!(
        cache.peek(&seen("t/a")).unwrap().e_tag.as_deref(),
        Some("newer")
    );
}

#[test]
fn recording_over_an_expired_entry_keeps_the_object_indexed() {
    // moka reports an entry recorded over an expired one it has not swept yet as expired:
    // that removal must not unindex the new entry, or forgetting the object leaves it.
    let cache = HandleCache::try_new(HandleConfig {
        ttl: Duration::from_millis(50),
        ..HandleConfig::default()
    })
    .unwrap();
    let m = meta("t/a", 10, Some("one"));
    cache.record(&me(), &store(), &m, cache.epoch());
    std::thread::sleep(Duration::from_millis(120));
    cache.record(&me(), &store(), &m, cache.epoch());
    assert!(cache.peek(&seen("t/a")).is_some(), "recorded again");
    cache.invalidate(&id("t/a"));
    assert!(
        cache.peek(&seen("t/a")).is_none(),
        "forgetting the object drops what was recorded over the expired entry"
    );
    assert_eq!(cache.stats().metadata.entries, 0);
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
        cache.record(&me(), &store(), &meta("a", 1, Some("e")), cache.epoch());
    }
    std::thread::sleep(Duration::from_millis(150));
    assert!(forever.meta(&seen("a"), |_| true).is_some());
    assert!(idle.meta(&seen("a"), |_| true).is_none());
    assert_eq!(idle.stats().metadata.expirations, 1);
    assert_eq!(forever.stats().metadata.expirations, 0);
}

#[test]
fn what_one_identity_records_and_proves_is_its_own() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let other = StoreIdentity::named("other");
    let mine = meta("t/a", 10, Some("\"0\""));
    let theirs = meta("t/a", 12, Some("\"0\""));
    cache.record(&me(), &store(), &mine, cache.epoch());
    cache.record(&other, &store(), &theirs, cache.epoch());
    assert_eq!(
        cache.stats().version_changes,
        0,
        "two identities, two objects"
    );
    let of = |identity: &StoreIdentity| {
        let s = Seen {
            identity: identity.clone(),
            id: id("t/a"),
        };
        cache.peek(&s).map(|m| m.size)
    };
    assert_eq!((of(&me()), of(&other)), (Some(10), Some(12)));
    let v = ObjectVersion::new(store(), &me(), &mine);
    cache.prove(&me(), &v);
    assert!(cache.proven(&me(), &v));
    assert!(!cache.proven(&other, &v), "a proof is of one identity");
    // A failure of the other identity's store changes nothing of mine.
    cache.invalidate_seen(&Seen {
        identity: other.clone(),
        id: id("t/a"),
    });
    assert_eq!((of(&me()), of(&other)), (Some(10), None));
    assert!(cache.proven(&me(), &v));
    // Mine refused the version: its proof and recorded version go, nothing else.
    cache.unprove(&me(), &v);
    assert!(!cache.proven(&me(), &v));
    assert_eq!(of(&me()), None);
}

#[test]
fn an_identitys_listings_are_its_own_and_a_change_drops_only_its_own() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let other = StoreIdentity::named("other");
    let theirs = ListKey {
        identity: other.clone(),
        ..list_key("dir")
    };
    for key in [list_key("dir"), theirs.clone()] {
        let listing = Listing {
            objects: vec![Arc::new(meta("dir/a", 10, Some("v1")))],
            common_prefixes: vec![],
        };
        cache.record_listing(key, Arc::new(listing), cache.epoch());
    }
    cache.record(
        &other,
        &store(),
        &meta("dir/a", 10, Some("v1")),
        cache.epoch(),
    );
    cache.record(
        &other,
        &store(),
        &meta("dir/a", 12, Some("v2")),
        cache.epoch(),
    );
    assert!(cache.listing(&list_key("dir")).is_some(), "mine is kept");
    assert!(
        cache.listing(&theirs).is_none(),
        "theirs held the old version"
    );
}

#[test]
fn forgetting_an_object_for_everyone_drops_every_identitys_entries() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let other = StoreIdentity::named("other");
    let m = meta("t/a", 10, Some("\"e\""));
    for identity in [me(), other.clone()] {
        cache.record(&identity, &store(), &m, cache.epoch());
        cache.prove(&identity, &ObjectVersion::new(store(), &identity, &m));
    }
    cache.invalidate(&id("t/a"));
    for identity in [me(), other] {
        let s = Seen {
            identity: identity.clone(),
            id: id("t/a"),
        };
        assert!(cache.peek(&s).is_none(), "{identity}");
        let v = ObjectVersion::new(store(), &identity, &m);
        assert!(!cache.proven(&identity, &v), "{identity}");
    }
}

#[test]
fn identities_share_one_entry_per_object_weighed_by_how_many_showed_it() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let m = meta("t/a", 10, Some("\"0123456789abcdef0123456789abcdef\""));
    let identities: Vec<StoreIdentity> = (0..100)
        .map(|i| StoreIdentity::named(format!("tenant-{i}")))
        .collect();
    for identity in &identities {
        cache.record(identity, &store(), &m, cache.epoch());
        cache.prove(identity, &ObjectVersion::new(store(), identity, &m));
    }
    cache.inner.objects.run_pending_tasks();
    assert_eq!(
        cache.inner.objects.entry_count(),
        1,
        "one entry for the object"
    );
    assert_eq!(
        cache.inner.objects.weighted_size(),
        1 + 100 / known::MEMBERS_PER_UNIT as u64,
        "weighed by the identities that showed it"
    );
    let stats = cache.stats();
    assert_eq!((stats.metadata.entries, stats.proofs.entries), (100, 100));
    // One copy of the metadata, shared by every identity that recorded it.
    let known = cache.known(&id("t/a")).unwrap();
    let members = lock(&known.state);
    let first = members
        .by
        .get(&identities[0])
        .unwrap()
        .meta
        .as_ref()
        .unwrap()
        .meta
        .clone();
    for identity in &identities {
        let recorded = &members
            .by
            .get(identity)
            .unwrap()
            .meta
            .as_ref()
            .unwrap()
            .meta;
        assert!(Arc::ptr_eq(recorded, &first), "{identity}");
    }
    drop(members);
    // Forgetting one identity's view leaves the others'.
    cache.invalidate_seen(&Seen {
        identity: identities[0].clone(),
        id: id("t/a"),
    });
    let v = |i: &StoreIdentity| ObjectVersion::new(store(), i, &m);
    assert!(!cache.proven(&identities[0], &v(&identities[0])));
    assert!(cache.proven(&identities[1], &v(&identities[1])));
    let stats = cache.stats();
    assert_eq!((stats.metadata.entries, stats.proofs.entries), (99, 99));
}

#[test]
fn proofs_expire_with_the_ttl() {
    let cache = HandleCache::try_new(HandleConfig {
        ttl: Duration::from_millis(50),
        ..HandleConfig::default()
    })
    .unwrap();
    let m = meta("t/a", 10, Some("e"));
    let v = ObjectVersion::new(store(), &me(), &m);
    cache.prove(&me(), &v);
    assert!(cache.proven(&me(), &v));
    std::thread::sleep(Duration::from_millis(120));
    assert!(
        !cache.proven(&me(), &v),
        "asked again once the ttl has passed"
    );
    assert_eq!(cache.stats().proofs.entries, 0);
    assert_eq!(cache.stats().proofs.expirations, 1);
}

#[test]
fn a_listed_objects_entry_holds_the_listings_copy_of_its_metadata() {
    let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
    let recorded = |cache: &HandleCache| {
        let known = cache.known(&id("t/a")).unwrap();
        let members = lock(&known.state);
        Arc::clone(&members.by.get(&me()).unwrap().meta.as_ref().unwrap().meta)
    };
    let listed = Arc::new(meta("t/a", 10, Some("v1")));
    cache.record_listed(&me(), &store(), &listed, cache.epoch());
    assert!(Arc::ptr_eq(&recorded(&cache), &listed), "one copy, not two");
    // Listed again (a new listing, once the last expired): its copy replaces the equal one.
    let again = Arc::new(meta("t/a", 10, Some("v1")));
    cache.record_listed(&me(), &store(), &again, cache.epoch());
    assert!(Arc::ptr_eq(&recorded(&cache), &again));
    // A HEAD's equal answer keeps what is held; another version is recorded as before.
    cache.record(&me(), &store(), &meta("t/a", 10, Some("v1")), cache.epoch());
    assert!(Arc::ptr_eq(&recorded(&cache), &again));
    let newer = Arc::new(meta("t/a", 11, Some("v2")));
    cache.record_listed(&me(), &store(), &newer, cache.epoch());
    assert!(Arc::ptr_eq(&recorded(&cache), &newer));
    assert_eq!(cache.peek(&seen("t/a")).unwrap(), *newer);
}
