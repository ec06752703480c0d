//! The reference store behind a `ReplayCache` passes every case: replays from memory move no
//! guarantee.

idem_conformance::conformance_tests!({
    let shared = idem_core::store::ReplayCache::new(idem_core::MemoryStore::new());
    move || {
        let store = shared.clone();
        async move { store }
    }
});
