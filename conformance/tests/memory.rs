//! The reference store passes every case, exactly as a user's store would run the suite.

idem_conformance::conformance_tests!({
    let shared = idem_core::MemoryStore::new();
    move || {
        let store = shared.clone();
        async move { store }
    }
});
