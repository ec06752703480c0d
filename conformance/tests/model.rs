//! The model-based test against the reference store, as a user runs it: one call with a factory
//! of fresh namespaces (here, a new `MemoryStore` per call).

#[test]
fn memory_store_agrees_with_the_model() {
    let stats = idem_conformance::run_model(|| async { idem_core::MemoryStore::new() });
    eprintln!("model: {stats:?}");
}
