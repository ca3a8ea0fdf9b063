//! 200 small files scanned 10 times under a lowered descriptor limit. In its own test binary
//! because the limit applies to the whole process.

mod common;

use common::{WORKLOAD, backends, scan};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::LakeSpec;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_files_ten_scans_under_a_low_ulimit() {
    let limit = libc::rlimit {
        rlim_cur: 256,
        rlim_max: 256,
    };
    // SAFETY: setrlimit reads the struct we pass.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    for b in backends("fd_limit") {
        b.write(&LakeSpec::small_files(200)).await;
        // Asks for more descriptors than the limit allows: the cache must cap itself.
        let lake = LakeCache::builder().max_open_files(10_000).build().unwrap();
        let store = b.cached(&b.counting(), &lake);
        let want = scan(&b, b.raw.clone(), WORKLOAD[0]).await.unwrap();
        for run in 0..10 {
            let got = scan(&b, store.clone(), WORKLOAD[run % 2]).await;
            let got = got.unwrap_or_else(|e| panic!("{} run {run}: {e}", b.name));
            if run % 2 == 0 {
                assert_eq!(got, want, "{} run {run}", b.name);
            }
        }
        let stats = lake.stats().handle;
        assert!(stats.open_files <= 128, "{}: {stats:?}", b.name);
        assert!(stats.files.entries <= 128, "{}: {stats:?}", b.name);
    }
}
