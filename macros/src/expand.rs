//! Generating the rewritten function.
//!
//! Input: the checked options, key and function. Output: the same function, signature token for
//! token, whose body computes the key from borrowed arguments and then runs the original body
//! through `Task::call(..).run(..)`.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, LitStr, ReturnType};

use crate::args::Args;
use crate::key::Key;

pub(crate) struct Checked<'a> {
    pub(crate) args: &'a Args,
    pub(crate) key: Key,
    pub(crate) fingerprint: Option<TokenStream>,
}

fn duration(ms: u64) -> TokenStream {
    quote! { ::core::time::Duration::from_millis(#ms) }
}

/// Input: the function and its checked attribute. Output: the rewritten function.
pub(crate) fn function(function: &ItemFn, checked: &Checked<'_>) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let args = checked.args;
    let ReturnType::Type(_, output) = &sig.output else {
        unreachable!("the return type was checked to be a `Result`")
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
    let mut settings = TokenStream::new();
    if let Some(ttl) = args.lock_ttl {
        let ttl = duration(ttl.ms);
        settings.extend(quote! { .lock_ttl(#ttl) });
    }
    if let Some(ttl) = args.result_ttl {
        let ttl = duration(ttl.ms);
        settings.extend(quote! { .result_ttl(#ttl) });
    }
    if args.renew {
        settings.extend(quote! { .renew(true) });
    }
    if args.fencing {
        settings.extend(quote! { .fencing(true) });
    }
    if args.log_key_hash {
        settings.extend(quote! { .log_key(::idempotask::__private::KeyLogging::Hash) });
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
        settings.extend(quote! { .retry(::idempotask::__private::RetryPolicy::new() #retry) });
    }

    let key_value = &checked.key.build;
    let mut call = quote! { #task.call(#key) };
    let mut prelude = TokenStream::new();
    if let Some(fields) = &checked.fingerprint {
        prelude.extend(quote! {
            let #fingerprint = match ::idempotask::__private::fingerprint(&#task, &#key, #fields) {
                ::core::result::Result::Ok(#fingerprint) => #fingerprint,
                ::core::result::Result::Err(#error) => {
                    return ::core::result::Result::Err(::core::convert::From::from(#error));
                }
            };
        });
        call.extend(quote! { .fingerprint(#fingerprint) });
    }
    if let Some(expr) = &args.store {
        prelude.extend(quote_spanned! {expr.span()=>
            let #store = ::idempotask::__private::shared_store(&(#expr));
        });
        call.extend(quote! { .store_shared(#store) });
    }
    // Spanned at the return type, so that an `Ok` type that cannot be stored or an error type
    // without `From<idempotask::Error>` is blamed there, once.
    let run = quote_spanned! {output.span()=>
        ::idempotask::__private::run::<#output, _, _, _>(#call, #body).await
    };

    quote! {
        #(#attrs)*
        #vis #sig {
            // The static sits in its own block: items are not hygienic, and the body must not
            // see it.
            let #task: &'static ::idempotask::__private::Task = {
                static TASK: ::idempotask::__private::Task =
                    ::idempotask::__private::Task::new(#name) #settings;
                &TASK
            };
            let #key: ::idempotask::__private::String = #key_value;
            #prelude
            let #body = ::idempotask::__private::expect_output::<#output, _>(async move #block);
            #run
        }
    }
}
