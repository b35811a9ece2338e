//! The operator's contract ([`idempotask_conformance::check_operator`]) on `MemoryStore`, and
//! through a `SharedOperator` of it; the store crates run it on their stores.

use idempotask::MemoryStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_keeps_the_operator_contract() {
    idempotask_conformance::check_operator(MemoryStore::new()).await;
}
