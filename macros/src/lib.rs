//! The `#[idempotent_task]` attribute. Use it through the `idempotask` crate, which re-exports
//! it and documents it in full.

mod args;
mod expand;
mod key;
mod suggest;

use proc_macro::TokenStream;
use quote::{ToTokens, quote};
use syn::spanned::Spanned;
use syn::{ItemFn, ReturnType, Type};

use crate::args::{Args, Errors};

/// Runs an `async fn` at most once per caller-supplied key; see the `idempotask` crate.
#[proc_macro_attribute]
pub fn idempotent_task(attr: TokenStream, item: TokenStream) -> TokenStream {
    let expanded = rewrite(attr.into(), &item.into());
    if std::env::var_os("IDEMPOTASK_MACROS_DEBUG").is_some_and(|v| v != "0") {
        eprintln!("{expanded}");
    }
    expanded.into()
}

/// Input: the attribute and the item. Output: the rewritten function, or the original item next
/// to every error found, so that one mistake does not bury the crate under follow-up errors.
fn rewrite(
    attr: proc_macro2::TokenStream,
    item: &proc_macro2::TokenStream,
) -> proc_macro2::TokenStream {
    let Ok(function) = syn::parse2::<ItemFn>(item.clone()) else {
        let message = if syn::parse2::<syn::TraitItemFn>(item.clone()).is_ok() {
            "`#[idempotent_task]` needs a function body; put it on the trait's implementation, not its declaration"
        } else {
            "`#[idempotent_task]` applies to an `async fn`"
        };
        let error = syn::Error::new(proc_macro2::Span::call_site(), message).to_compile_error();
        return quote! { #error #item };
    };
    let mut errors = Errors::default();
    let args = Args::parse(attr, &mut errors);
    check_signature(&function, &mut errors);
    let params = key::params(&function);
    let checked = args.as_ref().and_then(|args| {
        let Some(value) = &args.key else {
            errors.at(
                proc_macro2::Span::call_site(),
                "missing `key`: every idempotent task needs the caller's idempotency key, like `#[idempotent_task(key = \"order-charge-{order_id}\")]`",
            );
            return None;
        };
        let key = key::key(value, &params, &mut errors)?;
        key::check_declarations(&params, &key.roots, &mut errors);
        key::check_body(&function, &key.roots, &mut errors);
        let fingerprint = match &args.fingerprint {
            Some(names) => Some(key::fingerprint(names, &params, &key.roots, &mut errors)?),
            None => None,
        };
        Some(expand::Checked {
            args,
            key,
            fingerprint,
        })
    });
    match (errors.into_result(), checked) {
        (Ok(()), Some(checked)) => expand::function(&function, &checked),
        (Err(err), _) => {
            let errors = err.to_compile_error();
            quote! { #errors #function }
        }
        (Ok(()), None) => function.into_token_stream(),
    }
}

/// Input: the function. Output: an error for each way its signature cannot be a task.
fn check_signature(function: &ItemFn, errors: &mut Errors) {
    let sig = &function.sig;
    if let Some(constness) = sig.constness {
        errors.at(
            constness.span,
            "an idempotent task cannot be a `const fn`: it talks to a store",
        );
    }
    if let Some(abi) = &sig.abi {
        errors.at(
            abi.span(),
            "an idempotent task cannot be an `extern` function; remove the ABI",
        );
    }
    // A `const fn` cannot be async either; one error says it.
    if sig.asyncness.is_none() && sig.constness.is_none() {
        errors.at(
            sig.fn_token.span,
            format!(
                "`#[idempotent_task]` requires an `async fn`; write `async fn {}`",
                sig.ident
            ),
        );
    }
    match &sig.output {
        ReturnType::Default => errors.at(
            sig.paren_token.span.close(),
            "an idempotent task must return a `Result`, like `-> Result<ChargeId, PaymentError>`: its `Ok` value is stored and errors are never cached",
        ),
        ReturnType::Type(_, ty) => {
            let is_result = match &**ty {
                Type::Path(path) => path
                    .path
                    .segments
                    .last()
                    .is_some_and(|s| s.ident.to_string().ends_with("Result")),
                _ => false,
            };
            if !is_result {
                errors.at(
                    ty.span(),
                    "an idempotent task must return a `Result`, like `Result<ChargeId, PaymentError>`: its `Ok` value is stored and errors are never cached\n= note: a type alias of `Result` must have a name ending in `Result`",
                );
            }
        }
    }
}
