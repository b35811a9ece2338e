//! The list as [`CHECKS`] gives it: each check named once, as many as the docs say, and each
//! passing on `MemoryStore` when run from the table rather than from a generated test.

use std::collections::BTreeSet;

use idempotask::MemoryStore;
use idempotask::store::SharedStore;
use idempotask_conformance::{CHECKS, Check};

#[test]
fn the_table_names_each_check_once_and_as_many_as_the_docs_say() {
    let names: BTreeSet<&str> = CHECKS.iter().map(Check::name).collect();
    assert_eq!(names.len(), CHECKS.len(), "a name twice: {CHECKS:?}");
    // The crate docs and docs/stores.md give this count.
    assert_eq!(CHECKS.len(), 36, "{CHECKS:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_of_the_table_passes_on_the_memory_store() {
    for check in CHECKS {
        // A failure names its check: the panic of one check can be far from the table's line.
        eprintln!("check {}", check.name());
        check.run(SharedStore::new(MemoryStore::new())).await;
    }
}
