//! A stand-in for rand 0.8's entropy-seeded generator, which rand 0.9 (the suite's) renamed
//! `from_os_rng`: the attribute sees the path only, as it would that of the real crate.

pub struct StdRng;

impl StdRng {
    pub fn from_entropy() -> Self {
        StdRng
    }

    pub fn next_u64(&mut self) -> u64 {
        3
    }
}
