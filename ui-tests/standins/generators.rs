//! Stand-ins for generator crates the suite does not depend on: the attribute sees the paths
//! only, as it would those of the real crates.

pub mod fastrand {
    pub fn u64(_: std::ops::RangeFull) -> u64 {
        4
    }
}

pub mod chrono {
    pub struct Utc;
    impl Utc {
        pub fn now() -> u64 {
            1
        }
    }
    pub struct Local;
    impl Local {
        pub fn now() -> u64 {
            2
        }
    }
}
