//! Generating the rewritten function.
//!
//! Input: the checked options, key and function. Output: the same function, signature token for
//! token, whose body computes the key from borrowed arguments and then runs the original body
//! through `Task::call(..).run(..)`. For async-trait's shape the same happens inside the boxed
//! `async move` block, so the boxed signature that matches the trait stays as it was.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, LitStr, ReturnType};

use crate::args::Args;
use crate::key::{Key, respan};
use crate::shape::Shape;

pub(crate) struct Checked<'a> {
    pub(crate) args: &'a Args,
    pub(crate) key: Key,
    pub(crate) fingerprint: Option<TokenStream>,
}

fn duration(ms: u64) -> TokenStream {
    quote! { ::core::time::Duration::from_millis(#ms) }
}

/// Input: the options. Output: the builder calls after `Task::new(name)` that set them.
fn settings(args: &Args) -> TokenStream {
    let rt = args.runtime();
    let mut settings = TokenStream::new();
    if let Some(ttl) = args.lock_ttl {
        let ttl = duration(ttl.ms);
        settings.extend(quote! { .lock_ttl(#ttl) });
    }
    if let Some(ttl) = args.result_ttl {
        let ttl = duration(ttl.ms);
        settings.extend(quote! { .result_ttl(#ttl) });
    }
    if let Some(renewal) = args.renew {
        let variant = Ident::new(renewal.variant(), Span::call_site());
        settings.extend(quote! { .lock_renewal(#rt::__private::LockRenewal::#variant) });
    }
    if args.fencing {
        settings.extend(quote! { .fencing(true) });
    }
    if args.log_key_hash {
        settings.extend(quote! { .log_key(#rt::__private::KeyLogging::Hash) });
    }
    if let Some(policy) = args.in_doubt {
        let variant = Ident::new(policy.variant(), Span::call_site());
        settings.extend(quote! { .in_doubt(#rt::__private::InDoubt::#variant) });
    }
    if let Some(memory) = args.doubt_memory {
        let memory = duration(memory.ms);
        settings.extend(quote! { .doubt_memory(#memory) });
    }
    if let Some(after) = args.hold_alert_after {
        let after = duration(after.ms);
        settings.extend(quote! { .hold_alert_after(#after) });
    }
    let mut retry = TokenStream::new();
    if let Some(attempts) = args.max_attempts {
        retry.extend(quote! { .max_attempts(#attempts) });
    }
    for (option, value) in [
        ("max_wait", args.max_wait),
        ("initial_backoff", args.initial_backoff),
        ("max_backoff", args.max_backoff),
    ] {
        if let Some(value) = value {
            let method = Ident::new(option, Span::call_site());
            let value = duration(value.ms);
            retry.extend(quote! { .#method(#value) });
        }
    }
    if !retry.is_empty() {
        settings.extend(quote! { .retry(#rt::__private::RetryPolicy::new() #retry) });
    }
    settings
}

/// Input: the function, its shape and its checked attribute. Output: the rewritten function.
pub(crate) fn function(function: &ItemFn, shape: &Shape<'_>, checked: &Checked<'_>) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let args = checked.args;
    let rt = args.runtime();
    let output = match shape {
        Shape::Async => match &sig.output {
            ReturnType::Type(_, output) => &**output,
            ReturnType::Default => unreachable!("the return type was checked to be a `Result`"),
        },
        Shape::Boxed(boxed) => boxed.output,
    };
    // Generated names resolve only among themselves, never against the user's.
    let task = Ident::new("__idempotask_task", Span::mixed_site());
    let key = Ident::new("__idempotask_key", Span::mixed_site());
    let fingerprint = Ident::new("__idempotask_fingerprint", Span::mixed_site());
    let store = Ident::new("__idempotask_store", Span::mixed_site());
    let body = Ident::new("__idempotask_body", Span::mixed_site());
    let error = Ident::new("__idempotask_error", Span::mixed_site());

    let name = args
        .name
        .clone()
        .unwrap_or_else(|| LitStr::new(&sig.ident.to_string(), sig.ident.span()));
    let settings = settings(args);

    let key_value = &checked.key.build;
    let mut call = quote! { #task.call(#key) };
    let mut prelude = TokenStream::new();
    if let Some(fields) = &checked.fingerprint {
        prelude.extend(quote! {
            let #fingerprint = match #rt::__private::fingerprint(&#task, &#key, #fields) {
                ::core::result::Result::Ok(#fingerprint) => #fingerprint,
                ::core::result::Result::Err(#error) => {
                    return ::core::result::Result::Err(::core::convert::From::from(#error));
                }
            };
        });
        call.extend(quote! { .fingerprint(#fingerprint) });
    }
    if let Some(expr) = &args.store {
        let rt_at_store = respan(rt.clone(), expr.span());
        prelude.extend(quote_spanned! {expr.span()=>
            let #store = #rt_at_store::__private::shared_store(&(#expr));
        });
        call.extend(quote! { .store(#store) });
    }
    // Spanned at the return type, so that an `Ok` type that cannot be stored or an error type
    // without `From<idempotask::Error>` is blamed there, once.
    let rt_at_output = respan(rt.clone(), output.span());
    let run = match &args.reconcile {
        None => quote_spanned! {output.span()=>
            #rt_at_output::__private::run::<#output, _, _, _>(#call, #body).await
        },
        // Spanned at the path too: a function whose signature does not fit is blamed there.
        Some(reconcile) => {
            let rt_at_path = respan(rt.clone(), reconcile.span());
            let reconcile = quote_spanned! {reconcile.span()=>
                #rt_at_path::__private::reconcile_with::<#output, _, _, _>(#reconcile)
            };
            quote_spanned! {output.span()=>
                #rt_at_output::__private::run_reconciled::<#output, _, _, _, _, _>(#call, #reconcile, #body).await
            }
        }
    };

    let statements = quote! {
        // The static sits in its own block: items are not hygienic, and the body must not
        // see it.
        let #task: &'static #rt::__private::Task = {
            static TASK: #rt::__private::Task =
                #rt::__private::defined_here(#rt::__private::Task::new(#name) #settings);
            &TASK
        };
        let #key: #rt::__private::String = #key_value;
        #prelude
    };
    match shape {
        Shape::Async => quote! {
            #(#attrs)*
            #vis #sig {
                #statements
                let #body = #rt::__private::expect_output::<#output, _>(async move #block);
                #run
            }
        },
        // The key is computed inside the boxed block, as in an `async fn`: on the first poll,
        // from the arguments the block has taken, before async-trait's block takes them on.
        Shape::Boxed(boxed) => {
            let pin = boxed.pin;
            let future = boxed.future;
            quote! {
                #(#attrs)*
                #vis #sig {
                    #pin(async move {
                        #statements
                        let #body = #rt::__private::expect_output::<#output, _>(#future);
                        #run
                    })
                }
            }
        }
    }
}
