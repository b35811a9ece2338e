//! Parsing the attribute's `name = value` options into typed settings.
//!
//! Input: the tokens inside `#[idempotent_task(...)]`. Output: [`Args`], or every independent
//! mistake at once (unknown or repeated options, bad values), each spanned at its token.

use std::collections::HashMap;

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, LitStr, Token};

use crate::suggest::did_you_mean;
use crate::values::{InDoubt, Millis};
use crate::values::{
    Renewal, boolean, count, crate_path, duration, duration_or_zero, in_doubt, lock_ttl, log_key,
    reconcile_path, renewal, show, task_name,
};

/// How one option's value is read into [`Args`].
type Setter = fn(&mut Args, &str, Expr) -> syn::Result<()>;

/// Every option and how its value is read, in the order the error message lists them.
const OPTIONS: &[(&str, Setter)] = &[
    ("key", |args, _, value| {
        args.key = Some(value);
        Ok(())
    }),
    ("lock_ttl", |args, option, value| {
        args.lock_ttl = Some(lock_ttl(option, &value)?);
        Ok(())
    }),
    ("result_ttl", |args, option, value| {
        args.result_ttl = Some(duration(option, &value)?);
        Ok(())
    }),
    ("name", |args, _, value| {
        args.name = Some(task_name(&value)?);
        Ok(())
    }),
    ("fingerprint", |args, _, value| {
        args.fingerprint = Some(value);
        Ok(())
    }),
    ("store", |args, _, value| {
        args.store = Some(value);
        Ok(())
    }),
    ("renew", |args, _, value| {
        args.renew = renewal(&value)?;
        Ok(())
    }),
    ("fencing", |args, option, value| {
        args.fencing = boolean(option, &value)?;
        Ok(())
    }),
    ("max_attempts", |args, option, value| {
        args.max_attempts = Some(count(option, &value)?);
        Ok(())
    }),
    ("max_wait", |args, option, value| {
        args.max_wait = Some(duration(option, &value)?);
        Ok(())
    }),
    ("initial_backoff", |args, option, value| {
        args.initial_backoff = Some(duration(option, &value)?);
        Ok(())
    }),
    ("max_backoff", |args, option, value| {
        args.max_backoff = Some(duration(option, &value)?);
        Ok(())
    }),
    ("in_doubt", |args, _, value| {
        args.in_doubt = Some(in_doubt(&value)?);
        Ok(())
    }),
    ("reconcile", |args, _, value| {
        args.reconcile = Some(reconcile_path(value)?);
        Ok(())
    }),
    ("hold_alert_after", |args, option, value| {
        args.hold_alert_after = Some(duration(option, &value)?);
        Ok(())
    }),
    ("doubt_memory", |args, option, value| {
        args.doubt_memory = Some(duration_or_zero(option, &value)?);
        Ok(())
    }),
    ("log_key", |args, _, value| {
        args.log_key_hash = log_key(&value)?;
        Ok(())
    }),
    ("crate", |args, _, value| {
        args.krate = Some(crate_path(&value)?);
        Ok(())
    }),
];

/// The default lock TTL in milliseconds; the runtime's `DEFAULT_LOCK_TTL`.
const DEFAULT_LOCK_TTL_MS: u64 = 30_000;

/// One `name = value` pair as written.
struct Opt {
    name: Ident,
    value: Expr,
}

impl Parse for Opt {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name: Ident = input.call(syn::ext::IdentExt::parse_any)?;
        input.parse::<Token![=]>().map_err(|err| {
            syn::Error::new(
                err.span(),
                format!("expected `=` after `{name}`: options are written `{name} = value`"),
            )
        })?;
        Ok(Self {
            name,
            value: input.parse()?,
        })
    }
}

/// The parsed options. `key` is kept as written; `key.rs` checks it against the function.
pub(crate) struct Args {
    pub(crate) key: Option<Expr>,
    pub(crate) lock_ttl: Option<Millis>,
    pub(crate) result_ttl: Option<Millis>,
    pub(crate) name: Option<LitStr>,
    /// Kept as written, like `key`: `fingerprint.rs` reads it against the function.
    pub(crate) fingerprint: Option<Expr>,
    pub(crate) store: Option<Expr>,
    /// `renew = true` or `"watchdog"`, `renew = "in_task"`; `None`: not renewed.
    pub(crate) renew: Option<Renewal>,
    /// `fencing = true`: each execution gets a fencing token.
    pub(crate) fencing: bool,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) max_wait: Option<Millis>,
    pub(crate) initial_backoff: Option<Millis>,
    pub(crate) max_backoff: Option<Millis>,
    /// `log_key = "hash"`: logs show the key's digest instead of the key.
    pub(crate) log_key_hash: bool,
    /// `in_doubt = "…"`: what a delivery does with a unit left in doubt.
    pub(crate) in_doubt: Option<InDoubt>,
    /// `doubt_memory = …`: how long the store remembers an expired lock; zero is allowed.
    pub(crate) doubt_memory: Option<Millis>,
    /// `hold_alert_after = …`: how long a unit may stay held before its deliveries raise the
    /// alarm; only with `in_doubt = "hold"`.
    pub(crate) hold_alert_after: Option<Millis>,
    /// `reconcile = path::to::fn`: asked before a unit in doubt runs again.
    pub(crate) reconcile: Option<syn::ExprPath>,
    /// `crate = "my_crate::idempotask"`: where a crate that re-exports idempotask has it.
    pub(crate) krate: Option<syn::Path>,
}

/// Collects independent errors so that all of them are reported together.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, err: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(err),
            None => self.0 = Some(err),
        }
    }

    pub(crate) fn at(&mut self, span: Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    /// An error spanning all of `tokens` (on stable, `Span::join` is not available to macros).
    pub(crate) fn spanned(
        &mut self,
        tokens: &dyn quote::ToTokens,
        message: impl std::fmt::Display,
    ) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    pub(crate) fn into_result(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

impl Args {
    /// Input: the attribute's tokens. Output: the options that could be read, with every
    /// mistake found pushed to `errors` (so the key is still checked next to a bad TTL); `None`
    /// only when the tokens are not `name = value` pairs at all.
    pub(crate) fn parse(tokens: proc_macro2::TokenStream, errors: &mut Errors) -> Option<Self> {
        let opts = match syn::parse::Parser::parse2(
            Punctuated::<Opt, Token![,]>::parse_terminated,
            tokens,
        ) {
            Ok(opts) => opts,
            Err(err) => {
                errors.push(err);
                return None;
            }
        };
        let mut seen: HashMap<String, Span> = HashMap::new();
        let mut refused: Vec<String> = Vec::new();
        let mut args = Self {
            key: None,
            lock_ttl: None,
            result_ttl: None,
            name: None,
            fingerprint: None,
            store: None,
            renew: None,
            fencing: false,
            max_attempts: None,
            max_wait: None,
            initial_backoff: None,
            max_backoff: None,
            log_key_hash: false,
            in_doubt: None,
            doubt_memory: None,
            hold_alert_after: None,
            reconcile: None,
            krate: None,
        };
        for Opt { name, value } in opts {
            let option = name.to_string();
            let Some((_, set)) = OPTIONS.iter().find(|(known, _)| *known == option) else {
                let names = OPTIONS.iter().map(|(known, _)| *known);
                let hint = did_you_mean(&option, names.clone())
                    .map_or_else(String::new, |close| format!("; did you mean `{close}`?"));
                let expected = names
                    .map(|o| format!("`{o}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                errors.at(
                    name.span(),
                    format!("unknown option `{option}`{hint}\nexpected one of: {expected}"),
                );
                continue;
            };
            if seen.insert(option.clone(), name.span()).is_some() {
                errors.at(
                    name.span(),
                    format!("duplicate option `{option}`; give each option once"),
                );
                continue;
            }
            if let Err(err) = set(&mut args, &option, value) {
                errors.push(err);
                refused.push(option);
            }
        }
        let lock_ms = args.lock_ttl.map_or(DEFAULT_LOCK_TTL_MS, |l| l.ms);
        // A refused `lock_ttl` is not the default one: comparing with the default would only
        // add a second, wrong, error.
        let lock_refused = refused.iter().any(|option| option == "lock_ttl");
        if let Some(result) = args.result_ttl
            && result.ms < lock_ms
            && !lock_refused
        {
            errors.at(
                result.span,
                format!(
                    "`result_ttl` ({}) is shorter than `lock_ttl` ({}); the result must be kept at least as long as the lock, or a duplicate can run after the marker expired",
                    show(result.ms),
                    show(lock_ms)
                ),
            );
        }
        // A refused `in_doubt` or `doubt_memory` is `None` here: no second error follows it.
        if args.in_doubt == Some(InDoubt::Hold)
            && let Some(memory) = args.doubt_memory
            && memory.ms == 0
        {
            errors.at(
                memory.span,
                "with a `doubt_memory` of zero no unit is remembered in doubt, so `in_doubt = \"hold\"` would never hold one and every unit would run again; leave `doubt_memory` out (a day) or give it a duration",
            );
        }
        if let Some(after) = args.hold_alert_after
            && args.in_doubt != Some(InDoubt::Hold)
        {
            errors.at(
                after.span,
                "`hold_alert_after` raises the alarm on a unit held in doubt, and only `in_doubt = \"hold\"` holds units; add `in_doubt = \"hold\"` or leave `hold_alert_after` out",
            );
        }
        if let (Some(InDoubt::Hold), Some(reconcile)) = (args.in_doubt, &args.reconcile) {
            errors.spanned(
                reconcile,
                "`reconcile` runs on a unit in doubt, which `in_doubt = \"hold\"` never runs; keep one of the two (`in_doubt = \"rerun\"`, the default, goes with `reconcile`)",
            );
        }
        Some(args)
    }
}

impl Args {
    /// The path generated code names the runtime by: `::idempotask` unless `crate = "…"` says.
    pub(crate) fn runtime(&self) -> proc_macro2::TokenStream {
        self.krate.as_ref().map_or_else(
            || quote::quote!(::idempotask),
            quote::ToTokens::to_token_stream,
        )
    }
}
