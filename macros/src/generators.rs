//! What makes a fresh value on each delivery, by its syntax alone: the generator calls, types,
//! macros and crates, and the error for a key made from one. The leaf that both the key's own
//! check ([`key`](crate::key)) and the body's checks ([`misuse`](crate::misuse),
//! [`taint`](crate::taint)) build on.

use quote::ToTokens;
use syn::Expr;

/// Calls whose result differs on every delivery, by their path's last segment.
const GENERATOR_FUNCTIONS: &[&str] = &[
    "new_v1",
    "new_v4",
    "new_v6",
    "new_v7",
    "now_v1",
    "now_v6",
    "now_v7",
    "new_random",
    "random",
    "random_range",
    "thread_rng",
    "rng",
    "gen_range",
    "now",
    "now_utc",
    "now_local",
    "elapsed",
    "from_entropy",
    "from_os_rng",
    "try_from_os_rng",
    "make_rng",
];

/// Types whose `new()` or `generate()` mints a fresh identifier.
const GENERATOR_TYPES: &[&str] = &[
    "Ulid",
    "Xid",
    "Ksuid",
    "Cuid",
    "Nanoid",
    "ObjectId",
    "Snowflake",
];

/// Random number generators seeded by the operating system: the value `OsRng`, or one made
/// with `ThreadRng::default()`.
const ENTROPY_RNGS: &[&str] = &["OsRng", "SysRng", "ThreadRng"];

/// Crates whose functions draw a random value (`fastrand::u64(..)`, `rand::random()`), except
/// those that seed a generator from their arguments and those that build a distribution.
const GENERATOR_CRATES: &[&str] = &["fastrand", "rand", "getrandom", "nanorand"];

/// Modules of the generator crates that build distributions: a distribution draws nothing
/// itself, the generator it is sampled with does.
const DISTRIBUTION_MODULES: &[&str] = &["distr", "distributions"];

/// Constructors of a random number generator from a seed they are given
/// (`StdRng::seed_from_u64(order_id)`, `SeedableRng::from_seed(..)`, `StdRng::from_rng(&mut
/// other)`, `fastrand::Rng::with_seed(..)`): what the generator draws is as fresh as its seed,
/// so the same on every delivery when the seed is the caller's.
const SEEDED_CONSTRUCTORS: &[&str] = &[
    "seed_from_u64",
    "from_seed",
    "from_rng",
    "try_from_rng",
    "with_seed",
    "new_seed",
];

/// Macros that mint fresh identifiers.
const GENERATOR_MACROS: &[&str] = &["nanoid", "cuid", "ulid"];

/// Methods that draw random values; a draw from a generator seeded in the body is as fresh as
/// its seed (`Locals::seeded_draw`).
const GENERATOR_METHODS: &[&str] = &["gen", "random", "random_range", "gen_range", "sample"];

pub(crate) fn generated_key(at: &dyn ToTokens) -> syn::Error {
    syn::Error::new_spanned(
        at,
        "the idempotency key must be supplied by the caller, not generated inside the task\n\
         = note: a value made on each delivery differs between deliveries, so a duplicate is never recognised\n\
         = help: take the key as a parameter, decided where the business decision is made: `key = \"order-charge-{order_id}\"`",
    )
}

/// Whether `expr` makes a value that differs on every delivery, by its syntax alone: a call of
/// a generator, an entropy-seeded generator, a generator macro, or a draw (`rng.random()`),
/// which `Locals` accepts when it draws from a generator seeded in the body.
pub(crate) fn is_generator(expr: &Expr) -> bool {
    match expr {
        Expr::Call(call) => {
            let Expr::Path(path) = &*call.func else {
                return false;
            };
            if is_seeded_construction(call) {
                return false;
            }
            let segments: Vec<String> = path
                .path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect();
            let Some(last) = segments.last() else {
                return false;
            };
            let ty = segments.iter().rev().nth(1).map(String::as_str);
            let through_generator_crate = segments.len() > 1
                && GENERATOR_CRATES.contains(&segments[0].as_str())
                && !segments
                    .iter()
                    .any(|s| DISTRIBUTION_MODULES.contains(&s.as_str()));
            let process_id = last == "id" && ty == Some("process");
            through_generator_crate
                || process_id
                || GENERATOR_FUNCTIONS.contains(&last.as_str())
                || (matches!(last.as_str(), "new" | "generate")
                    && ty.is_some_and(|ty| GENERATOR_TYPES.contains(&ty)))
                || (matches!(last.as_str(), "new" | "default")
                    && ty.is_some_and(|ty| ENTROPY_RNGS.contains(&ty)))
        }
        Expr::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|s| ENTROPY_RNGS.contains(&s.ident.to_string().as_str())),
        Expr::Macro(mac) => mac
            .mac
            .path
            .segments
            .last()
            .is_some_and(|s| GENERATOR_MACROS.contains(&s.ident.to_string().as_str())),
        Expr::MethodCall(call) => GENERATOR_METHODS.contains(&call.method.to_string().as_str()),
        _ => false,
    }
}

/// Whether `call` builds a random number generator from a seed it is given, which makes it as
/// fresh as its arguments and no fresher.
pub(crate) fn is_seeded_construction(call: &syn::ExprCall) -> bool {
    matches!(&*call.func, Expr::Path(path) if path.path.segments.last().is_some_and(|s| {
        SEEDED_CONSTRUCTORS.contains(&s.ident.to_string().as_str())
    }))
}
